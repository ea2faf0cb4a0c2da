"""#16 items 3, 5, 6 and the telemetry leftovers, on the Serve app's own layers with fakes: request
limits and backpressure in sequences, fail-closed auth, graceful shutdown options, the fallback
reason in usage.specexit. The real endpoint: tests/integration/test_serve_app.py."""

import asyncio
import json
import os
import types

import httpx
import pytest

from serve_app.config import SHUTDOWN_MARGIN_S, load_args
from specexit_core.typed_config import ConfigError

TOY = {"model": {"id": "m", "source": "toy:teacher", "draft": "toy:draft", "accelerator": "cpu"}}


# -- config: limits and shutdown ------------------------------------------------------------------------
def test_limit_defaults_and_budget():
    a = load_args(TOY)
    assert (a.limits.max_n, a.limits.max_body_bytes, a.limits.max_messages) == (16, 4 * 1024 * 1024, 256)
    assert a.sequence_budget == 1 * (64 + 64)  # the request queue's size, counted in sequences
    assert a.shutdown_timeout_s == a.request_timeout_s + SHUTDOWN_MARGIN_S
    b = load_args({**TOY, "backpressure": {"max_sequences_in_flight": 40}, "graceful_shutdown_timeout_s": 900})
    assert b.sequence_budget == 40 and b.shutdown_timeout_s == 900


@pytest.mark.parametrize(
    "patch,needle",
    [
        ({"graceful_shutdown_timeout_s": 10, "request_timeout_s": 60}, "graceful_shutdown_timeout_s"),
        ({"limits": {"max_n": 32}, "backpressure": {"max_sequences_in_flight": 8}}, "max_n"),
        ({"limits": {"max_n": 0}}, "max_n"),
        ({"limits": {"max_body_bytes": 10}}, "max_body_bytes"),
        ({"limits": {"max_mesages": 3}}, "max_mesages"),
    ],
)
def test_bad_limits_fail_early(patch, needle):
    with pytest.raises(ConfigError) as e:
        load_args({**TOY, **patch})
    assert needle in str(e.value)


@pytest.fixture
def no_runtime_context(monkeypatch):
    """ray.llm's get_deployment_options reads the driver's runtime env, which would start Ray."""
    import ray

    monkeypatch.setattr(ray, "get_runtime_context", lambda: types.SimpleNamespace(runtime_env={}))


def test_built_deployments_drain_at_least_the_deadline(no_runtime_context):
    """#16 item 6: every deployment (ingress, engine replica) as `serve run` builds it waits out the request
    deadline before a scale-down or redeploy stops it (Serve's default, 20 s, cut long generations)."""
    from serve_app.ray_llm import build_like_serve_run

    args = {**TOY, "request_timeout_s": 120}
    built = build_like_serve_run({"name": "t", "import_path": "serve_app.app:build_app", "args": args})
    assert len(built.deployments) == 2
    for d in built.deployments:
        dc = d._deployment_config
        assert dc.graceful_shutdown_timeout_s == 120 + SHUTDOWN_MARGIN_S, d.name
        assert dc.graceful_shutdown_wait_loop_s == 2.0


# -- limits ---------------------------------------------------------------------------------------------
def test_request_cost_and_violations():
    from serve_app.limits import limit_violation, request_cost

    ns = types.SimpleNamespace
    assert request_cost(ns(n=None, messages=[1])) == 1
    assert request_cost(ns(n=5, prompt="x")) == 5
    assert request_cost(ns(n=3, prompt=["a", "b"])) == 6
    assert request_cost(ns(n=2, prompt=[1, 2, 3])) == 2  # one tokenized prompt
    assert request_cost(ns(n=2, prompt=[[1], [2]])) == 4
    lim = {"max_n": 8, "max_messages": 3}
    assert limit_violation(ns(n=8, messages=[1, 2, 3]), **lim) is None
    assert "n: 5000" in limit_violation(ns(n=5000, messages=[1]), **lim)
    assert "messages: 4" in limit_violation(ns(n=1, messages=[1] * 4), **lim)
    assert "4 prompts" in limit_violation(ns(n=1, prompt=["a"] * 4), **lim)


def test_sequence_budget_leases():
    import gc

    from serve_app.limits import SequenceBudget

    b = SequenceBudget(10)
    a = b.lease(6)
    assert b.lease(5) is None and b.refused == 1
    c = b.lease(4)
    assert b.in_flight == 10
    a.release()
    a.release()  # idempotent
    assert b.in_flight == 4

    class Stream:
        pass

    s = Stream()
    c.release_with(s)
    del s
    gc.collect()
    assert b.in_flight == 0


def _echo_app(seen: list):
    async def app(scope, receive, send):
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        seen.append((dict(scope.get("headers") or []), body))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


def test_body_size_limit_413_declared_and_streamed():
    from serve_app.limits import BodySizeLimitMiddleware

    seen: list = []
    app = BodySizeLimitMiddleware(_echo_app(seen), max_bytes=1024)

    async def chunks(n):
        for _ in range(n):
            yield b"x" * 300

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            big = await c.post("/v1/chat/completions", content=b"x" * 2000)
            streamed = await c.post("/v1/chat/completions", content=chunks(5))  # chunked, no Content-Length
            fits = await c.post("/v1/chat/completions", content=chunks(3))
            return big, streamed, fits

    big, streamed, fits = asyncio.run(go())
    assert big.status_code == 413 and "1024 bytes" in big.json()["error"]["message"]
    assert streamed.status_code == 413
    assert fits.status_code == 200 and seen == [(seen[0][0], b"x" * 900)]


# -- ingress: limits and the sequence budget -----------------------------------------------------------
def _ingress(**kw):
    from serve_app.ingress import SpecExitIngress

    return SpecExitIngress({"m": object()}, {"m": object()}, **kw)


def test_ingress_refuses_over_limit_before_any_engine_call():
    ing = _ingress(limits={"max_n": 4, "max_messages": 2})
    called = []

    async def never(**_):
        called.append(1)
        yield "x"

    ing._get_response = never
    for body in (types.SimpleNamespace(n=5000, messages=[1]), types.SimpleNamespace(n=1, messages=[1, 2, 3])):
        r = asyncio.run(ing._process_llm_request(body, "chat"))
        assert r.status_code == 400 and "this server allows" in json.loads(r.body)["error"]["message"]
    assert not called


def test_ingress_backpressure_counts_sequences_not_requests():
    from serve_app.ray_llm import NON_STREAMING_RESPONSE_TYPES

    done = NON_STREAMING_RESPONSE_TYPES[0].model_construct()
    ing = _ingress(max_sequences_in_flight=8, retry_after_s=2, limits={"max_n": 8})
    gate = asyncio.Event()

    async def slow(**_):
        await gate.wait()
        yield done

    async def stream(**_):
        yield ['data: {"choices": []}\n\n']
        await gate.wait()

    ing._get_response = slow

    async def go():
        ns = types.SimpleNamespace
        first = asyncio.create_task(ing._process_llm_request(ns(n=6, messages=[1]), "chat"))
        await asyncio.sleep(0.05)
        over = await ing._process_llm_request(ns(n=3, messages=[1]), "chat")  # 6 + 3 > 8: refused
        fits = asyncio.create_task(ing._process_llm_request(ns(n=2, messages=[1]), "chat"))
        await asyncio.sleep(0.05)
        full = ing.specexit_ingress_stats()["sequences_in_flight"]
        gate.set()
        await first, await fits
        after = ing.specexit_ingress_stats()
        gate.clear()
        ing._get_response = stream
        resp = await ing._process_llm_request(ns(n=8, messages=[1]), "chat")
        held = ing.specexit_ingress_stats()["sequences_in_flight"]
        gate.set()
        _ = [c async for c in resp.body_iterator]
        return over, full, after, held, ing.specexit_ingress_stats()

    over, full, after, held, end = asyncio.run(go())
    assert over.status_code == 429 and over.headers["retry-after"] == "2"
    assert full == 8 and after["sequences_in_flight"] == 0 and after["refused_over_budget"] == 1
    assert held == 8 and end["sequences_in_flight"] == 0  # a stream holds its sequences until it ends


# -- auth: fail closed, strip, warn ---------------------------------------------------------------------
def test_auth_fails_closed_on_every_scope_and_strips_the_key(tmp_path, monkeypatch):
    from serve_app.auth import BearerAuthMiddleware

    monkeypatch.setenv("T_KEYS", "sk-1")
    seen: list = []
    app = BearerAuthMiddleware(_echo_app(seen), env_name="T_KEYS", file=None)

    async def ws(headers):
        sent = []

        async def send(msg):
            sent.append(msg)

        async def receive():
            return {"type": "websocket.connect"}

        inner = []

        async def ok_ws(scope, receive, send):
            inner.append(scope)

        mw = BearerAuthMiddleware(ok_ws, env_name="T_KEYS", file=None)
        await mw({"type": "websocket", "path": "/v1/x", "headers": headers}, receive, send)
        return sent, inner

    sent, inner = asyncio.run(ws([]))
    assert sent == [{"type": "websocket.close", "code": 1008, "reason": "unauthorized"}] and not inner
    sent, inner = asyncio.run(ws([(b"authorization", b"Bearer sk-1")]))
    assert not sent and inner and b"authorization" not in dict(inner[0]["headers"])
    with pytest.raises(RuntimeError, match="unsupported ASGI scope"):
        asyncio.run(app({"type": "webtransport", "headers": []}, None, None))

    async def http():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.post("/v1/chat/completions", content=b"{}", headers={"Authorization": "Bearer sk-1"})

    assert asyncio.run(http()).status_code == 200
    headers, _ = seen[0]
    assert b"authorization" not in headers  # never forwarded to the engine replicas


def test_key_file_errors_fail_at_start_never_per_request(tmp_path, monkeypatch, caplog):
    from serve_app.auth import BearerAuthMiddleware, KeyFileError, check_auth_at_start

    monkeypatch.delenv("T_NONE", raising=False)
    missing = tmp_path / "nope"
    with pytest.raises(KeyFileError, match="cannot read the API key file .*nope"):
        check_auth_at_start({"enabled": True, "api_keys_env": "T_NONE", "api_keys_file": str(missing)})
    keys = tmp_path / "keys"
    keys.write_text("sk-a\n")
    check_auth_at_start({"enabled": True, "api_keys_env": None, "api_keys_file": str(keys)})
    mw = BearerAuthMiddleware(_echo_app([]), env_name=None, file=str(keys))

    async def get(key):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw), base_url="http://t") as c:
            return (await c.get("/v1/models", headers={"Authorization": f"Bearer {key}"})).status_code

    assert asyncio.run(get("sk-a")) == 200
    keys.unlink()  # e.g. mid-rotation: the keys read before stay in force, no 500
    caplog.set_level("WARNING")
    assert [asyncio.run(get("sk-a")), asyncio.run(get("sk-b"))] == [200, 401]
    assert "key file unreadable" in caplog.text and "sk-a" not in caplog.text
    keys.write_text("sk-b\n")
    os.utime(keys, (5, 5))
    assert [asyncio.run(get("sk-a")), asyncio.run(get("sk-b"))] == [401, 200]


def test_auth_off_warns_at_start(caplog):
    caplog.set_level("WARNING")
    _ingress(auth={"enabled": False})
    assert "auth is OFF" in caplog.text


# -- telemetry: fallback reason, malformed lines ---------------------------------------------------------
def test_fallback_reason_reaches_usage_and_malformed_lines_are_counted(tmp_path):
    from serve_app.telemetry import ExitEventIndex, choice_telemetry, usage_block

    (tmp_path / "fallbacks-7.jsonl").write_text(
        json.dumps({"req_id": "chatcmpl-f-12345678", "fallback": "invalid SpecExit settings: x"}) + "\nnot json\n"
    )
    (tmp_path / "exits-7.jsonl").write_text('{"req_id": 3}\n')
    idx = ExitEventIndex(tmp_path)
    assert idx.pop("chatcmpl-f") is None
    fb = idx.pop_fallback("chatcmpl-f")
    assert fb == "invalid SpecExit settings: x" and idx.pop_fallback("chatcmpl-f") is None
    assert idx.malformed_lines == 2
    one = usage_block(True, [choice_telemetry([1, 2], 269, None, fb)])
    assert one["fallback"] == fb and one["exited"] is False
    two = usage_block(True, [choice_telemetry([1], 269, None), choice_telemetry([1], 269, None, fb)])
    assert two["fallback"] == fb and [c["fallback"] for c in two["choices"]] == [None, fb]
    assert usage_block(True, [choice_telemetry([1], 269, None)])["fallback"] is None


# -- ingress: a deadline cancels the engine-replica call -------------------------------------------------
class _FakeCall:
    def __init__(self, chunks, gap):
        self.chunks, self.gap, self.cancelled = chunks, gap, False

    def cancel(self):
        self.cancelled = True

    def __aiter__(self):
        return self._gen()

    async def _gen(self):
        for c in self.chunks:
            await asyncio.sleep(self.gap)
            yield c


class _FakeHandle:
    def __init__(self, calls, chunks, gap):
        self.calls, self.chunks, self.gap = calls, chunks, gap

    def options(self, **_):
        return self

    @property
    def chat(self):
        handle = self

        class M:
            @staticmethod
            def remote(*_):
                call = _FakeCall(handle.chunks, handle.gap)
                handle.calls.append(call)
                return call

        return M


@pytest.mark.parametrize("case", ["deadline", "stream-deadline", "finished"])
def test_deadline_cancels_the_engine_call(case):
    """#16 item 4 at the ingress: an ingress-side deadline is no Serve cancellation, so the ingress cancels
    the replica call itself (the real engine's abort: tests/integration/test_serve_app.py)."""
    from serve_app.ray_llm import NON_STREAMING_RESPONSE_TYPES

    done = NON_STREAMING_RESPONSE_TYPES[0].model_construct()
    chunks = {
        "deadline": [done],
        "stream-deadline": [['data: {"choices": []}\n\n']] * 5,
        "finished": [['data: {"choices": []}\n\n']] * 2,
    }[case]
    calls: list = []
    ing = _ingress(request_timeout_s=0.3)
    ing._configured_serve_handles = {"m": _FakeHandle(calls, chunks, 0.5 if case == "deadline" else 0.1)}

    async def get_response(*, body, call_method, raw_request=None):
        async for item in getattr(ing._get_configured_serve_handle("m"), call_method).remote(body, None):
            yield item

    ing._get_response = get_response

    async def go():
        resp = await ing._process_llm_request(types.SimpleNamespace(n=1, messages=[1]), "chat")
        body = [c async for c in resp.body_iterator] if hasattr(resp, "body_iterator") else None
        return resp, body

    resp, body = asyncio.run(go())
    assert len(calls) == 1
    if case == "deadline":
        assert resp.status_code == 503 and calls[0].cancelled
    elif case == "stream-deadline":
        assert "timed out" in body[-1] and calls[0].cancelled
    else:
        assert "timed out" not in "".join(body) and not calls[0].cancelled


@pytest.mark.parametrize("cause", [OverflowError("Python int too large to convert to C long"), ValueError("bad")])
def test_input_errors_from_the_replica_are_400_not_500(cause):
    """#16 item 7: a value the replica cannot hold (found by fuzzing: huge integers) comes back as a
    RayTaskError; the ingress answers 400 with the reason instead of a 500."""
    from ray.exceptions import RayTaskError

    ing = _ingress()

    async def get_response(*, body, call_method, raw_request=None):
        raise RayTaskError("chat", "Traceback ...", cause)
        yield  # an async generator, like the real one

    ing._get_response = get_response
    resp = asyncio.run(ing._process_llm_request(types.SimpleNamespace(n=1, messages=[1]), "chat"))
    assert resp.status_code == 400 and type(cause).__name__ in resp.body.decode()


def test_other_replica_errors_stay_server_errors():
    from ray.exceptions import RayTaskError

    ing = _ingress()

    async def get_response(*, body, call_method, raw_request=None):
        raise RayTaskError("chat", "Traceback ...", KeyError("x"))
        yield

    ing._get_response = get_response
    with pytest.raises(RayTaskError):
        asyncio.run(ing._process_llm_request(types.SimpleNamespace(n=1, messages=[1]), "chat"))
