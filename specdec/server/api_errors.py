"""The OpenAI error shape every route answers with, and the text helpers request models share."""
from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    # message and param may quote the client's input (a field name it sent): keep them short and encodable
    return {"error": {"message": shown(message, 2000), "type": type_, "param": None if param is None else shown(param),
                      "code": code}}


def shown(value: str, limit: int = 64) -> str:
    """A client's string as echoed in an error message: short, and always encodable."""
    if len(value) > limit:
        value = f"{value[:limit]}... ({len(value)} characters)"
    return value.encode("utf-8", "replace").decode("utf-8")


def _valid_text(value: str) -> str:
    # JSON allows "\ud800" on its own; it is no Unicode text, and tokenizers and UTF-8 encoders fail on it
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError("lone_surrogate", "contains a lone UTF-16 surrogate (such as \\ud800), "
                                  "which is not valid Unicode text") from None
    return value


Text = Annotated[str, AfterValidator(_valid_text)]


def unsupported(name: str, what: str | None = None) -> APIError:
    """`what`: the subject of "... not supported", with its verb ("logprobs are")."""
    return APIError(400, f"{what or name + ' is'} not supported by this server", param=name,
                    code="unsupported_parameter")
