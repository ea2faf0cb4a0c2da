"""The OpenAI-shaped error answer, `{"error": {"message", "type", "param", "code"}}`, in one place:
the ingress, the auth middleware and the request limits all answer with it. A `JSONResponse` is
itself an ASGI app, so the pure ASGI middlewares send it with `await response(scope, receive, send)`.
"""

from __future__ import annotations

from starlette.responses import JSONResponse


def error_response(
    status: int, message: str, type_: str, retry_after: int | None = None, headers: dict | None = None
) -> JSONResponse:
    h = dict(headers or {})
    if retry_after:
        h["Retry-After"] = str(retry_after)
    return JSONResponse(
        {"error": {"message": message, "type": type_, "param": None, "code": status}},
        status_code=status,
        headers=h or None,
    )
