"""POST /tokenize and /detokenize request shapes: vLLM's (a prompt, or messages through the chat template) and
llama-server's (content)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .api_errors import Text
from .messages import ChatMessage, Tool


class _Tokenize(BaseModel):
    model_config = ConfigDict(extra="forbid")      # one of the shapes below exactly: a prompt and messages is a 400
    model: str | None = None
    add_special_tokens: bool = True                # vLLM's: BOS where the model wants one (a prompt only)
    add_special: bool = True                       # llama-server's name for it
    return_token_strs: bool = False                # vLLM's: each token's text beside its id
    with_pieces: bool = False                      # llama-server's: tokens as {id, piece}


class TokenizePrompt(_Tokenize):
    prompt: Text


class TokenizeContent(_Tokenize):                  # llama-server's name for the prompt
    content: Text


class TokenizeChat(_Tokenize):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True


# POST /tokenize, in vLLM's shapes (a prompt, or messages through the chat template) and llama-server's (content)
TokenizeRequest = TokenizePrompt | TokenizeChat | TokenizeContent


class DetokenizeRequest(BaseModel):
    """POST /detokenize: vLLM's and llama-server's `tokens` -> text."""
    model: str | None = None
    tokens: list[int] = Field(min_length=0)
