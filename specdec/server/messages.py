"""Chat messages and tools as requests carry them (OpenAI's shapes): one schema per role, text parts only."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from .api_errors import Text, shown


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: ToolFunction


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class CalledFunction(BaseModel):
    name: str
    arguments: str | dict[str, Any]


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ToolMode:
    """What a chat request's tools ask: the tools for the template, whether to parse calls, what is forced."""
    def __init__(self, tools: list[dict], choice: str, name: str | None):
        self.tools, self.choice, self.name = tools, choice, name

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "named")


class ContentPart(BaseModel):
    type: Literal["text"]
    text: Text


class Prediction(BaseModel):
    """OpenAI's Predicted Outputs: `{"type": "content", "content": "..."}` (or text parts), the text the client
    expects back; drafted by method predicted_outputs (proposers/prediction.py)."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["content"]
    content: Text | list[ContentPart]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


_NON_TEXT_PARTS = {"image_url": "image", "input_image": "image", "image": "image", "input_audio": "audio",
                   "audio": "audio", "file": "file", "input_file": "file", "video_url": "video"}


def text_parts_only(value, allowed: tuple[str, ...]):
    """A content field's check before its union is tried (else an image part reads "Input should be a valid
    string"): every part's type among `allowed` (chat: text; Responses: input_text, output_text, text)."""
    for part in value if isinstance(value, list) else ():
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind not in allowed:
            what = _NON_TEXT_PARTS.get(kind)
            if what:
                raise PydanticCustomError("unsupported_content", f"{what} input is not supported "
                                          "(this server's model reads text only)")
            raise PydanticCustomError("unsupported_content", "content part type '{kind}' is not supported "
                                      "(only {allowed})", {"kind": shown(kind, 40), "allowed": ", ".join(allowed)})
    return value


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    content: Text | list[ContentPart] | None = None
    tool_calls: list[ToolCallIn] | None = None       # an assistant turn's calls
    tool_call_id: str | None = None                  # a tool result: the call it answers
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value):
        return text_parts_only(value, ("text",))

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class AssistantMessage(_Message):
    """An assistant turn: its content may be left out (or null) when it carries tool_calls (OpenAI's rule)."""
    role: Literal["assistant"]


class TextMessage(_Message):
    """A system, developer, user or tool turn: content is required (OpenAI answers 400 without it)."""
    role: Literal["system", "user", "developer", "tool"]
    content: Text | list[ContentPart]


# one schema per role, so that /openapi.json (and what is generated from it) says which roles need content
ChatMessage = Annotated[AssistantMessage | TextMessage, Field(discriminator="role")]
ROLES = ("system", "user", "assistant", "developer", "tool")
