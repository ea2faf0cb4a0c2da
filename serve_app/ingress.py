"""The OpenAI ingress: Ray Serve LLM's `OpenAiIngress` with explicit overload and failure answers.

Stock behaviour this changes, and why:
* a full replica queue (`max_queued_requests`) raises `BackPressureError` inside the ingress,
  which stock turns into a 500; here it is 429 (or 503, configurable) with `Retry-After`;
* a dead or restarting replica (actor died, no replica available) is 503 + `Retry-After`, so
  OpenAI clients retry instead of surfacing a 500;
* one deadline (`request_timeout_s`) covers the whole request, queueing and streaming included;
  stock only bounds the time to the first chunk (and answers 408). An expired stream ends with
  an SSE error event; closing it cancels the replica call, which aborts the engine request;
* request limits (`n`, messages, prompts, a chat message without a role: 400) and backpressure in sequences, not requests
  (serve_app/limits.py): a request is admitted only while the sequences in flight fit the budget.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.llm.ingress import OpenAiIngress
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse

from serve_app.auth import check_auth_at_start
from serve_app.config import LimitsArgs
from serve_app.errors import error_response
from serve_app.limits import Lease, SequenceBudget, limit_violation, message_violation, request_cost
from serve_app.ray_llm import (
    NON_STREAMING_RESPONSE_TYPES,
    ErrorResponse,
    openai_json_wrapper,
    peek_at_generator,
    sanitize_messages,
)

log = logging.getLogger("specexit.serve.ingress")
_UNAVAILABLE = (ActorDiedError, ActorUnavailableError, RayActorError, DeploymentUnavailableError)


def _engine_dead(e: BaseException) -> bool:
    """vLLM's EngineDeadError, wrapped by Ray on its way from the engine replica (matched by name:
    the ingress does not import vLLM)."""
    cause = getattr(e, "cause", None)
    return any(type(x).__name__ == "EngineDeadError" for x in (e, cause) if x is not None) or "EngineDeadError" in str(
        e
    )


# What the engine replica raises for a request whose values it cannot hold (e.g. an integer past 64
# bits reaching a C conversion: OverflowError) or our request handling rejects (ValueError,
# TypeError), outside vLLM's own validation (which answers those with its ErrorResponse): the
# client's input, so 400, not 500.
_INPUT_ERRORS = (OverflowError, ValueError, TypeError)


def _input_error(e: BaseException) -> BaseException | None:
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, _INPUT_ERRORS) else None


async def http_error_handler(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """FastAPI answers HTTPException (e.g. unknown model, 404) as `{"detail": ...}`; OpenAI clients
    expect `{"error": {...}}`."""
    return error_response(
        exc.status_code, str(exc.detail), "invalid_request_error" if exc.status_code < 500 else "server_error"
    )


async def validation_error_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    """400 with the offending fields (stock Ray crashes with a 500 on a malformed JSON body: its
    handler cannot serialize the raw bytes that pydantic puts in the error)."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return error_response(400, "invalid request: " + "; ".join(parts), "invalid_request_error")


# The engine-replica calls made for the request being handled (set per request in `_answer`). An
# ingress-side deadline is not a Serve cancellation: without an explicit `cancel()` the replica would
# go on generating for a client that already has its 503 (only a client disconnect propagates).
_CALLS: contextvars.ContextVar[list | None] = contextvars.ContextVar("specexit_engine_calls", default=None)


class _TrackedHandle:
    """A deployment handle (and its `.options(...)` copies) that records each call's response."""

    def __init__(self, handle, calls: list):
        self._handle, self._calls = handle, calls

    def options(self, **kw) -> _TrackedHandle:
        return _TrackedHandle(self._handle.options(**kw), self._calls)

    def __getattr__(self, method: str):
        target = getattr(self._handle, method)
        calls = self._calls

        class _Method:
            @staticmethod
            def remote(*args, **kw):
                response = target.remote(*args, **kw)
                calls.append(response)
                return response

        return _Method


def _cancel(calls: list) -> None:
    """Cancel the request in the engine replica (Serve cancels its task; vLLM aborts the request)."""
    for response in calls:
        try:
            response.cancel()
        except Exception as e:  # noqa: BLE001 -- best effort: the replica may be gone already
            log.debug("cancel of an engine call failed: %s", e)


def _sse_error(status: int, message: str, type_: str) -> str:
    return "data: " + json.dumps({"error": {"message": message, "type": type_, "code": status}}) + "\n\n"


class SpecExitIngress(OpenAiIngress):
    def __init__(
        self,
        llm_deployments,
        model_cards,
        *,
        lora_paths=None,
        request_timeout_s: float = 300.0,
        retry_after_s: int = 1,
        overload_status: int = 429,
        auth: dict | None = None,
        limits: dict | None = None,
        max_sequences_in_flight: int | None = None,
    ):
        super().__init__(llm_deployments, model_cards, lora_paths=lora_paths)
        self._timeout = float(request_timeout_s)
        self._retry_after = int(retry_after_s)
        self._overload_status = int(overload_status)
        lim = LimitsArgs(**(limits or {}))  # max_body_bytes: the body-size middleware's (app.py)
        self._limits = {"max_n": lim.max_n, "max_messages": lim.max_messages}
        self._budget = SequenceBudget(max_sequences_in_flight or 10**9)
        check_auth_at_start(auth or {})  # raises: auth on but no key / an unreadable key file

    def specexit_ingress_stats(self) -> dict:
        """Sequences in flight and refused by the budget (tests, debugging)."""
        return {
            "sequences_in_flight": self._budget.in_flight,
            "sequence_capacity": self._budget.capacity,
            "refused_over_budget": self._budget.refused,
        }

    def _overloaded(self) -> Response:
        return error_response(
            self._overload_status,
            "server overloaded: the request queue is full, retry later",
            "overloaded_error",
            self._retry_after,
        )

    async def _process_llm_request(self, body, call_method: str, raw_request: Request | None = None) -> Response:
        bad = limit_violation(body, **self._limits) or message_violation(body)
        if bad:
            return error_response(400, bad, "invalid_request_error")
        lease = self._budget.lease(request_cost(body))
        if lease is None:
            return self._overloaded()
        try:
            resp = await self._answer(body, call_method, raw_request, lease)
        except BaseException:
            lease.release()
            raise
        if isinstance(resp, StreamingResponse):
            lease.release_with(resp.body_iterator)  # also when the stream is dropped unread (_guarded frees it)
        else:
            lease.release()
        return resp

    async def _get_response(self, *, body, call_method: str, raw_request: Request | None = None):
        """Stock, with the messages of every request made picklable (stock: chat only; an embeddings
        request with `messages` failed to reach the replica, a 500); content that cannot be read is 400."""
        if isinstance(getattr(body, "messages", None), list):
            try:
                body = sanitize_messages(body)
            except ValueError as e:
                raise StarletteHTTPException(400, f"invalid request: {e}") from e
        async for item in super()._get_response(body=body, call_method=call_method, raw_request=raw_request):
            yield item

    def _get_configured_serve_handle(self, model_id: str):
        handle = super()._get_configured_serve_handle(model_id)
        calls = _CALLS.get()
        return _TrackedHandle(handle, calls) if calls is not None else handle

    async def _answer(self, body, call_method: str, raw_request: Request | None, lease: Lease) -> Response:
        calls: list = []
        _CALLS.set(calls)  # this request's task (and its copy of the context) only
        finished = False
        try:
            resp = await self._answer_tracked(body, call_method, raw_request, lease, calls)
            finished = True
            return resp
        finally:
            if not finished:
                _cancel(calls)

    async def _answer_tracked(
        self, body, call_method: str, raw_request: Request | None, lease: Lease, calls: list
    ) -> Response:
        deadline = time.monotonic() + self._timeout
        try:
            async with asyncio.timeout(self._timeout):
                gen = self._get_response(body=body, call_method=call_method, raw_request=raw_request)
                first, gen = await peek_at_generator(gen)
        except BackPressureError:
            return self._overloaded()
        except TimeoutError:
            _cancel(calls)
            return error_response(
                503,
                f"request timed out after {self._timeout:g}s (server busy or restarting)",
                "timeout_error",
                self._retry_after,
            )
        except _UNAVAILABLE as e:
            log.warning("engine replica unavailable: %s", type(e).__name__)
            return error_response(
                503,
                "model replica unavailable (restarting), retry later",
                "service_unavailable_error",
                self._retry_after,
            )
        except RayTaskError as e:
            bad = _input_error(e)
            if bad is not None:
                return error_response(
                    400, f"invalid request: {type(bad).__name__}: {bad}"[:500], "invalid_request_error"
                )
            if not _engine_dead(e):
                raise
            log.warning("engine dead under a request; the health check replaces the replica")
            return error_response(
                503,
                "model engine failed, its replica is being replaced; retry later",
                "service_unavailable_error",
                self._retry_after,
            )

        chunk = first[0] if isinstance(first, list) else first
        if isinstance(chunk, ErrorResponse):
            code = chunk.error.code
            if code >= 500:  # e.g. the engine died under this request: retryable
                return error_response(503, chunk.error.message, chunk.error.type, self._retry_after)
            return error_response(code, chunk.error.message, chunk.error.type)
        if isinstance(chunk, NON_STREAMING_RESPONSE_TYPES):
            # pydantic-core writes the JSON (stock: `model_dump()` then the `json` module, ~2x the CPU)
            return Response(chunk.model_dump_json(), media_type="application/json")
        return StreamingResponse(
            self._guarded(openai_json_wrapper(gen), deadline, lease, calls), media_type="text/event-stream"
        )

    async def _guarded(self, stream, deadline: float, lease: Lease | None = None, calls: list | None = None):
        """The rest of the deadline applies to the stream; failures become a final SSE error event."""
        it = stream.__aiter__()
        ended = False
        try:
            while True:
                left = deadline - time.monotonic()
                try:
                    async with asyncio.timeout(max(left, 0.001)):
                        item = await it.__anext__()
                except StopAsyncIteration:
                    ended = True
                    return
                yield item
        except TimeoutError:
            yield _sse_error(503, f"request timed out after {self._timeout:g}s", "timeout_error")
        except _UNAVAILABLE:
            yield _sse_error(503, "model replica died during the request, retry", "service_unavailable_error")
        except RayTaskError as e:
            if not _engine_dead(e):
                raise
            yield _sse_error(503, "model engine failed during the request, retry", "service_unavailable_error")
        finally:
            if not ended:  # deadline, failure, client gone: the engine must stop generating too
                _cancel(calls or [])
            await stream.aclose()
            if lease is not None:
                lease.release()
