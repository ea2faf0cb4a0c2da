"""What one request may bring, and how much work the endpoint admits at once (`limits`, `backpressure`).

* The body size is checked by a pure ASGI middleware while the body streams in, before anything
  parses it (413): a huge body costs the ingress at most `max_body_bytes` of memory.
* `n`, the number of messages and the number of prompts are checked on the parsed request, in the
  ingress, before any engine replica sees it (400 naming the field and the limit); so is the one
  thing about a chat message that the request schema lets through and the engine cannot render:
  a message without a `role`.
* Backpressure counts sequences, not requests: Serve's own queue (`max_ongoing_requests`,
  `max_queued_requests`) counts a request with `n: 5000` as one, and such a request held the engine
  for minutes. The ingress therefore admits requests while the sequences they bring (n x prompts)
  fit in `SequenceBudget`; beyond it the request gets the overload answer (429/503 + Retry-After).
"""

from __future__ import annotations

import weakref

from pydantic import BaseModel

from serve_app.errors import error_response


def prompt_count(body) -> int:
    """Prompts in a /v1/completions call (a string or token list = 1; a list of them = its length)."""
    p = getattr(body, "prompt", None)
    if isinstance(p, list) and p and isinstance(p[0], (str, list)):
        return len(p)
    return 1


def request_cost(body) -> int:
    """Sequences a request asks the engine for: n choices for each prompt."""
    n = getattr(body, "n", None) or 1
    return max(int(n), 1) * prompt_count(body)


def message_violation(body) -> str | None:
    """The 400 message for a chat message without a string `role`, or None.

    The request schema accepts a Harmony message (`{"author": {...}, "content": [...]}`, one arm of
    its `messages` union); Ray Serve LLM turns it into a dict with no `role`, and vLLM's chat parser
    then raises `KeyError: 'role'` in the engine replica, which Ray Serve LLM answers with a 500
    (found by the schema fuzzer, issue #16 item 7)."""
    messages = getattr(body, "messages", None)
    for i, m in enumerate(messages if isinstance(messages, list) else []):
        # what the schema parses a message into: a dict (the OpenAI TypedDicts) or a model (Harmony)
        if isinstance(m, dict):
            role = m.get("role")
        elif isinstance(m, BaseModel):
            role = getattr(m, "role", None)
        else:
            continue
        if not isinstance(role, str):
            return (
                f"messages[{i}]: a chat message is an object with a 'role' (system, user, assistant, tool, ...) "
                "and its 'content'; this one has no 'role' (Harmony messages with 'author' are not accepted)"
            )
    return None


def limit_violation(body, *, max_n: int, max_messages: int) -> str | None:
    """The 400 message for a request over a limit, or None."""
    n = getattr(body, "n", None) or 1
    if n > max_n:
        return f"n: {n} is more than this server allows ({max_n} choices per request)"
    messages = getattr(body, "messages", None)
    if isinstance(messages, list) and len(messages) > max_messages:
        return f"messages: {len(messages)} is more than this server allows ({max_messages} messages per request)"
    prompts = prompt_count(body)
    if prompts > max_messages:
        return f"prompt: {prompts} prompts is more than this server allows ({max_messages} per request)"
    return None


class SequenceBudget:
    """Sequences admitted and not yet finished (one ingress replica; the event loop is its only user)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.in_flight = 0
        self.refused = 0

    def lease(self, cost: int) -> Lease | None:
        if self.in_flight + cost > self.capacity:
            self.refused += 1
            return None
        self.in_flight += cost
        return Lease(self, cost)


class Lease:
    """Sequences held by one request; `release()` is idempotent, and `release_with(obj)` also frees
    them when `obj` (a response stream that may never be iterated) is garbage collected."""

    def __init__(self, budget: SequenceBudget, cost: int):
        self._budget, self.cost, self._held = budget, cost, True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._budget.in_flight -= self.cost

    def release_with(self, obj) -> None:
        weakref.finalize(obj, self.release)


class BodySizeLimitMiddleware:
    """413 for a body over `max_bytes`: a declared Content-Length is refused before reading, and a
    chunked body is read (at most max_bytes of it) and replayed to the app only if it fits."""

    def __init__(self, app, *, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def _too_large(self) -> object:
        return error_response(
            413,
            f"request body too large: this server accepts at most {self.max_bytes} bytes",
            "invalid_request_error",
        )

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        try:
            if declared is not None and int(declared) > self.max_bytes:
                return await self._too_large()(scope, receive, send)
        except ValueError:
            return await error_response(400, "invalid Content-Length header", "invalid_request_error")(
                scope, receive, send
            )
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away: pass it on
                chunks.append(msg)
                break
            size += len(msg.get("body", b""))
            if size > self.max_bytes:
                return await self._too_large()(scope, receive, send)
            chunks.append(msg)
            if not msg.get("more_body", False):
                break
        body = b"".join(m.get("body", b"") for m in chunks if m["type"] == "http.request")
        replay = [{"type": "http.request", "body": body, "more_body": False}]
        replay += [m for m in chunks if m["type"] != "http.request"]

        async def replayed():
            return replay.pop(0) if replay else await receive()

        return await self.app(scope, replayed, send)
