"""Pure ASGI middleware (BaseHTTPMiddleware would hide client disconnects from the routes): API key, body guard."""
from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable

from fastapi.responses import JSONResponse

from .api_errors import error_body, shown

TENANT = "specdec.tenant"      # the ASGI scope key BearerAuth sets: the tenant of the request's API key


class BearerAuth:
    """/v1/* needs one of the keys. The scheme is case-insensitive (RFC 9110: `bearer KEY` is `Bearer KEY`); the
    token is compared with every key in constant time. The key's tenant goes into the scope (TENANT): admission
    partitions the caches by it."""

    def __init__(self, app, keys: dict[str, str]):
        self.app = app
        self.keys = [(k.encode(), tenant) for k, tenant in keys.items()]

    def tenant(self, token: bytes) -> str | None:
        found = None
        for key, tenant in self.keys:             # no early exit: the time does not tell which key matched
            if hmac.compare_digest(token, key):
                found = tenant
        return found

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            auth = dict(scope.get("headers") or []).get(b"authorization", b"")
            scheme, _, token = auth.strip().partition(b" ")
            tenant = self.tenant(token.strip()) if scheme.lower() == b"bearer" else None
            if tenant is not None:
                scope[TENANT] = tenant
            else:
                resp = JSONResponse(error_body("invalid or missing API key (send 'Authorization: Bearer KEY')",
                                               "authentication_error", code="invalid_api_key"), status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


MAX_HEADER_LINE = 16 << 10        # h11's default for a whole head; nginx allows 8 KiB a line
MAX_HEADER_BYTES = 64 << 10


class HeaderGuard:
    """A header line over MAX_HEADER_LINE bytes, or headers over MAX_HEADER_BYTES in all -> 431 (RFC 6585), before
    anything else reads them."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            sizes = [len(k) + len(v) + 4 for k, v in scope.get("headers") or []]
            if sizes and (max(sizes) > MAX_HEADER_LINE or sum(sizes) > MAX_HEADER_BYTES):
                resp = JSONResponse(error_body(f"request headers too large: at most {MAX_HEADER_LINE} bytes a line "
                                               f"and {MAX_HEADER_BYTES} in all", code="headers_too_large"),
                                    status_code=431, headers={"Connection": "close"})
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


class RequestGuard:
    """Request bodies: over `max_bytes` -> 413 (at once when Content-Length says so,
    else as soon as the count passes it, so an oversized body is never buffered whole); a POST to /v1/* whose
    Content-Type is not JSON -> 415 saying to send JSON. The body is read here and replayed to the app."""

    def __init__(self, app, max_bytes: Callable[[], int]):
        self.app = app
        self.limit = max_bytes              # read per request: the server's setting, changeable while it runs

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        max_bytes = self.limit()
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > max_bytes:
            if int(length) <= DRAIN_BYTES:
                await _discard_body(receive, 0)
            await _too_large(scope, receive, send, int(length), max_bytes)
            return
        ctype = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        if scope["path"].startswith("/v1/") and not (ctype == "application/json" or
                                                     (ctype.startswith("application/") and ctype.endswith("+json"))):
            got = f"'{shown(ctype, 64)}'" if ctype else "none"
            resp = JSONResponse(error_body(f"the request body must be JSON: send it with 'Content-Type: "
                                           f"application/json' (got {got})", code="unsupported_media_type"),
                                status_code=415, headers={"Connection": "close"})
            await resp(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":        # the client went away mid-body
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > max_bytes:
                if message.get("more_body", False):
                    await _discard_body(receive, size)
                await _too_large(scope, receive, send, None, max_bytes)
                return
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()                          # later: http.disconnect, as the routes expect

        await self.app(scope, replay, send)


# A refused body is read and thrown away (up to these bounds) before the 413 goes out: a client that is still
# sending when the connection closes sees "connection reset", not the 413, and the openai SDK retries those.
DRAIN_BYTES = 64 << 20
DRAIN_S = 10.0


async def _discard_body(receive, size: int) -> None:
    """Read the rest of a request body without keeping it, until it ends or DRAIN_BYTES / DRAIN_S run out."""
    deadline = asyncio.get_running_loop().time() + DRAIN_S
    while size <= DRAIN_BYTES:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            return
        try:
            message = await asyncio.wait_for(receive(), left)
        except TimeoutError:
            return
        if message["type"] != "http.request":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


async def _too_large(scope, receive, send, length: int | None, max_bytes: int) -> None:
    size = f"{length} bytes" if length is not None else f"over {max_bytes} bytes"
    resp = JSONResponse(error_body(f"the request body is {size}; this server accepts at most {max_bytes} bytes "
                                   "(--max-request-bytes)", code="request_too_large"),
                        status_code=413, headers={"Connection": "close"})
    await resp(scope, receive, send)
