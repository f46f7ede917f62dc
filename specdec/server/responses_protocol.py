"""The Responses API's request shape (OpenAI's, for text and function tools): input items, tools, text.format."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .api_errors import Text
from .messages import text_parts_only


class InputText(BaseModel):
    type: Literal["input_text", "output_text", "text"]
    text: Text


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | list[InputText]

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value):
        return text_parts_only(value, ("input_text", "output_text", "text"))

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function_call_output"]
    call_id: str
    output: Text


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    name: str
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(BaseModel):
    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: TextFormat | None = None


ITEM_TYPES = ("message", "function_call", "function_call_output")
InputItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")]


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")          # chat's sampling fields pass through (PASSED)
    model: Text | None = None
    input: Text | list[InputItem] = Field(min_length=1)

    @field_validator("input", mode="before")
    @classmethod
    def _typed(cls, value):
        # an item without a type is a message (EasyInputMessage): said so before the union picks a member
        if isinstance(value, list):
            return [{"type": "message", **v} if isinstance(v, dict) and "type" not in v else v for v in value]
        return value
    instructions: Text | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    text: TextConfig | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
