"""Fast tests of the Serve app's own layers (config, auth, overload/failure mapping, telemetry join),
with fakes in place of Ray Serve and vLLM. The real thing: tests/integration/test_serve_app.py."""

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import yaml
from pydantic import ValidationError

from serve_app.config import AppArgs, load_args
from specexit_core.typed_config import ConfigError
from support.paths import REPO_ROOT

TOY = {"model": {"id": "m", "source": "toy:teacher", "draft": "toy:draft", "accelerator": "cpu"}}


def yaml_args(name: str) -> dict:
    cfg = yaml.safe_load((REPO_ROOT / "serve_app" / name).read_text())
    assert {"applications", "http_options"} <= set(cfg)
    (app,) = cfg["applications"]
    assert app["import_path"] == "serve_app.app:build_app"
    return app["args"]


# -- config ------------------------------------------------------------------------------------------
def test_toy_cpu_yaml():
    from serve_app.app import llm_config

    a = load_args(yaml_args("toy_cpu.yaml"))
    assert a.model.id == "specexit-toy" and Path(a.model.source).is_dir() and Path(a.model.draft).is_dir()
    cfg = llm_config(a)
    dc = cfg.deployment_config
    assert dc["max_ongoing_requests"] == 32 and dc["max_queued_requests"] == 64
    assert dc["autoscaling_config"]["target_ongoing_requests"] == 16
    assert cfg.placement_group_config["bundles"] == [{"CPU": 1}]
    assert cfg.engine_kwargs["speculative_config"]["model"] == a.model.draft
    assert cfg.engine_kwargs["reasoning_parser"] == "qwen3"
    http = yaml.safe_load((REPO_ROOT / "serve_app" / "toy_cpu.yaml").read_text())["http_options"]
    assert (http["host"], http["port"]) == ("127.0.0.1", 8000)


def test_gpu_tp2_yaml():
    from serve_app.app import llm_config

    a = load_args(yaml_args("gpu_tp2.yaml"))
    assert a.model.tensor_parallel_size == 2 and a.model.accelerator == "gpu" and a.auth.enabled
    cfg = llm_config(a)
    assert cfg.engine_kwargs["tensor_parallel_size"] == 2
    assert cfg.placement_group_config == {"bundle_per_worker": {"GPU": 1, "CPU": 1}, "strategy": "STRICT_PACK"}
    assert cfg.deployment_config["autoscaling_config"]["max_replicas"] == 4
    assert "SPECEXIT_EXIT_CONFIG" in cfg.runtime_env["env_vars"]
    low = llm_config(load_args({**TOY, "specexit": {"default_effort": "Low"}}))
    assert low.runtime_env["env_vars"]["SPECEXIT_DEFAULT_EFFORT"] == "low"  # read by the replica's engine


@pytest.mark.parametrize(
    "patch,needle",
    [
        ({"modle": {}}, "modle"),
        ({"model": {**TOY["model"], "tp": 2}}, "tp"),
        ({"autoscaling": {"min_replicas": 1, "max_replica": 3}}, "max_replica"),
        ({"autoscaling": {"min_replicas": 3, "max_replicas": 1}}, "min_replicas"),
        ({"backpressure": {"max_ongoing_requests": 0}}, "max_ongoing_requests"),
        ({"backpressure": {"overload_status": 500}}, "overload_status"),
        ({"auth": {"enabled": True, "api_keys_env": None}}, "api_keys"),
        ({"auth": {"enabled": True, "api_key": "sk-in-yaml"}}, "api_key"),
        ({"specexit": {"exit_defaults": {"confidence_treshold": 0.9}}}, "confidence_treshold"),
        ({"specexit": {"exit_defaults": {"confidence_threshold": 3}}}, "confidence_threshold"),
        ({"specexit": {"default_effort": "turbo"}}, "reasoning effort must be one of"),
        ({"specexit": {"exit_defaults": {"answer_reserve_tokens": -4}}}, "answer_reserve_tokens"),
        ({"model": {**TOY["model"], "engine_kwargs": {"max_num_seq": 4}}}, "max_num_seq"),
        ({"model": {**TOY["model"], "engine_kwargs": {"tensor_parallel_size": 2}}}, "tensor_parallel_size"),
        ({"model": {**TOY["model"], "source": "toy:nope"}}, "toy:nope"),
    ],
)
def test_unknown_or_bad_keys_fail_early(patch, needle):
    with pytest.raises(ConfigError) as e:
        load_args({**TOY, **patch})
    assert needle in str(e.value)


def test_args_are_frozen():
    a = load_args(TOY)
    with pytest.raises(ValidationError, match="frozen"):
        a.model.id = "other"
    assert isinstance(load_args(a), AppArgs) and load_args(a) is a


# -- auth --------------------------------------------------------------------------------------------
async def _ok_app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_auth_middleware(tmp_path, monkeypatch, caplog):
    from serve_app.auth import BearerAuthMiddleware

    keys = tmp_path / "keys"
    keys.write_text("# comment\nsk-file-1\n")
    monkeypatch.setenv("T_KEYS", "sk-env-1, sk-env-2")
    app = BearerAuthMiddleware(_ok_app, env_name="T_KEYS", file=str(keys))

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            out = [(await c.get("/v1/models")).status_code]
            for k in ("sk-file-1", "sk-env-2", "sk-wrong", ""):
                out.append((await c.get("/v1/models", headers={"Authorization": f"Bearer {k}"})).status_code)
            out.append((await c.get("/v1/models", headers={"Authorization": "Basic sk-file-1"})).status_code)
            out.append((await c.get("/-/healthz")).status_code)
            keys.write_text("sk-file-2\n")  # rotation: the file is re-read when it changes
            import os

            os.utime(keys, (1, 1))
            out.append((await c.get("/v1/models", headers={"Authorization": "Bearer sk-file-2"})).status_code)
            out.append((await c.get("/v1/models", headers={"Authorization": "Bearer sk-file-1"})).status_code)
            r = await c.get("/v1/models", headers={"Authorization": "Bearer sk-wrong"})
            return out, r

    caplog.set_level("DEBUG")
    out, r = asyncio.run(go())
    assert out == [401, 200, 200, 401, 401, 401, 200, 200, 401]
    assert r.headers["www-authenticate"] == "Bearer" and r.json()["error"]["type"] == "authentication_error"
    assert "sk-" not in caplog.text  # keys never reach the logs


# -- ingress: overload and failure answers --------------------------------------------------------------
def _ingress(**kw):
    from serve_app.ingress import SpecExitIngress

    return SpecExitIngress({"m": object()}, {"m": object()}, **kw)


def _gen_raising(exc):
    async def gen(**_):
        raise exc
        yield  # pragma: no cover

    return gen


@pytest.mark.parametrize(
    "exc,status",
    [
        ("backpressure", 429),
        ("actor_died", 503),
    ],
)
def test_ingress_maps_overload_and_dead_replicas(exc, status):
    from ray.exceptions import ActorDiedError
    from ray.serve.exceptions import BackPressureError

    ing = _ingress(retry_after_s=3)
    ing._get_response = _gen_raising(
        BackPressureError(num_queued_requests=9, max_queued_requests=8) if exc == "backpressure" else ActorDiedError()
    )
    r = asyncio.run(ing._process_llm_request(object(), "chat"))
    assert r.status_code == status and r.headers["retry-after"] == "3"
    assert json.loads(r.body)["error"]["code"] == status


def test_ingress_timeout_and_stream_deadline():
    ing = _ingress(request_timeout_s=0.3, retry_after_s=1)

    async def slow(**_):
        await asyncio.sleep(5)
        yield "never"

    ing._get_response = slow
    r = asyncio.run(ing._process_llm_request(object(), "chat"))
    assert r.status_code == 503 and "timed out" in json.loads(r.body)["error"]["message"]

    async def trickle(**_):
        yield ['data: {"choices": []}\n\n']
        await asyncio.sleep(5)
        yield ["data: late\n\n"]

    ing._get_response = trickle

    async def consume():
        resp = await ing._process_llm_request(object(), "chat")
        return [chunk async for chunk in resp.body_iterator]

    chunks = asyncio.run(consume())
    assert chunks[0].startswith("data: {") and "timed out" in chunks[-1] and "late" not in "".join(chunks)


# -- telemetry join ------------------------------------------------------------------------------------------
def test_split_internal_id():
    from serve_app.telemetry import split_internal_id

    assert split_internal_id("chatcmpl-abc-1234abcd") == ("chatcmpl-abc", 0)
    assert split_internal_id("2_chatcmpl-abc-1234abcd") == ("chatcmpl-abc", 2)
    assert split_internal_id("cmpl-abc-0-1234abcd") == ("cmpl-abc-0", 0)


def test_exit_event_index_reads_incrementally(tmp_path):
    from serve_app.telemetry import ExitEventIndex, choice_telemetry, usage_block

    idx = ExitEventIndex(tmp_path)
    f = tmp_path / "exits-1.jsonl"
    ev = {
        "req_id": "chatcmpl-a-12345678",
        "exit_index": 5,
        "reason": "signals",
        "think_tokens": 6,
        "smoothed": {"confidence": 0.9, "progress": 0.5, "remaining": 33.6},
    }
    f.write_text(json.dumps(ev) + "\n" + '{"req_id": "chatcmpl-b')  # second line still being written
    assert idx.pop("chatcmpl-b") is None
    got = idx.pop("chatcmpl-a")
    assert got["exit_index"] == 5 and idx.pop("chatcmpl-a") is None  # consumed once
    with open(f, "a") as fh:
        fh.write('-12345678", "exit_index": 1, "reason": "max_think_tokens", "think_tokens": 2, "smoothed": {}}\n')
    assert idx.pop("chatcmpl-b")["reason"] == "max_think_tokens"
    c = choice_telemetry([7, 8, 5, 269, 9], 269, got)
    assert c == {
        "think_tokens": 3,
        "exited": True,
        "exit_index": 5,
        "exit_reason": "signals",
        "saved_tokens_estimate": 34,
        "signals": ev["smoothed"],
        "fallback": None,
        "long": None,
    }
    u = usage_block(True, [c, choice_telemetry([1, 2], 269, None)])
    assert u["think_tokens"] == 5 and u["exited"] and len(u["choices"]) == 2 and u["exit_index"] is None


def test_stream_rewriter():
    from serve_app.engine import _StreamRewriter
    from serve_app.telemetry import ExitEventIndex

    class Eng:
        _think_end_id = 269
        _think_start_id = 268
        _events = None

    from serve_app.engine import SpecExitVLLMEngine

    Eng._telemetry = SpecExitVLLMEngine._telemetry
    rw = _StreamRewriter(Eng(), want_ids=False, enabled=True, n=None)
    a = rw.rewrite(
        'data: {"id": "c1", "prompt_token_ids": [1], "choices": [{"index": 0, "delta": '
        '{"reasoning": "7 +"}, "token_ids": [10, 11]}]}\n\n'
    )
    b = rw.rewrite(
        'data: {"id": "c1", "choices": [{"index": 0, "delta": {"content": "x"}, "token_ids": [269, 3]}]}'
        '\n\ndata: {"id": "c1", "choices": [], "usage": {"completion_tokens": 4}}\n\ndata: [DONE]\n\n'
    )
    ea = json.loads(a[6:])
    assert "prompt_token_ids" not in ea and "token_ids" not in ea["choices"][0]
    assert ea["choices"][0]["delta"]["reasoning_content"] == "7 +"
    events = [e for e in b.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    usage = json.loads(events[1][6:])["usage"]
    assert usage["specexit"]["think_tokens"] == 2 and usage["specexit"]["exited"] is False
    assert ExitEventIndex  # imported for the type only
    # written again by pydantic-core: the same JSON values (non-ASCII text, escapes, floats)
    chunk = {"id": "c2", "choices": [{"index": 0, "delta": {"content": 'é ✓ "q"\n\\'}, "logprobs": {"x": -1e-05}}]}
    (out,) = [
        e
        for e in _StreamRewriter(Eng(), want_ids=True, enabled=False, n=None)
        .rewrite("data: " + json.dumps(chunk) + "\n\n")
        .split("\n\n")
        if e
    ]
    assert json.loads(out[6:]) == chunk


def test_ingress_writes_a_finished_response_as_stock_does():
    """The ingress answers a non-streaming response with pydantic-core's JSON (not `model_dump()` and
    the `json` module): the same values, non-ASCII text included."""
    import types

    from serve_app.ingress import SpecExitIngress
    from serve_app.ray_llm import NON_STREAMING_RESPONSE_TYPES

    cls = next(t for t in NON_STREAMING_RESPONSE_TYPES if t.__name__ == "ChatCompletionResponse")
    resp = cls.model_validate(
        {
            "id": "c1",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "é ✓ 42"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7, "specexit": {"think_tokens": 2}},
        }
    )
    ing = SpecExitIngress({"m": object()}, {"m": object()})

    async def get_response(**_):
        yield resp

    ing._get_response = get_response
    out = asyncio.run(ing._process_llm_request(types.SimpleNamespace(n=1, messages=[1]), "chat"))
    assert out.status_code == 200 and out.media_type == "application/json"
    assert json.loads(out.body) == json.loads(json.dumps(resp.model_dump()))


def test_reasoning_effort_becomes_the_request_control_and_usage_reports_it():
    """`reasoning_effort` -> `vllm_xargs.specexit_effort` (an explicit one wins), reported in usage with
    the level that served it; `none` (or enable_thinking false) closes thinking in the prompt, so no
    generated token counts as thinking."""
    from types import SimpleNamespace

    from serve_app.engine import SpecExitVLLMEngine, _thinking_closed, _UsageContext
    from serve_app.telemetry import choice_telemetry, usage_block
    from specexit_core.exit.profiles import resolve_exit_defaults

    eng = SimpleNamespace(
        _specexit_active=True, _exit_defaults=resolve_exit_defaults(None, None, None), _default_effort=None
    )
    req = SimpleNamespace(reasoning_effort="low", vllm_xargs=None)
    info = SpecExitVLLMEngine._apply_effort(eng, req)
    assert req.vllm_xargs == {"specexit_effort": "low"} and info == {
        "effort": "low",
        "served_by": "default",
        "epsilon": None,
    }
    req = SimpleNamespace(reasoning_effort="low", vllm_xargs={"specexit_effort": "max"})
    assert SpecExitVLLMEngine._apply_effort(eng, req)["served_by"] == "max"  # the explicit control wins
    assert SpecExitVLLMEngine._apply_effort(eng, SimpleNamespace()) is None  # no level: nothing to report
    assert SpecExitVLLMEngine._apply_effort(SimpleNamespace(_specexit_active=False), req) is None
    # the deployment's default level for a request that names none; one that names a level keeps it
    eng._default_effort = "none"
    req = SimpleNamespace(reasoning_effort=None, vllm_xargs=None)
    assert SpecExitVLLMEngine._apply_effort(eng, req)["effort"] == "none" and _thinking_closed(req)
    eng._default_effort = "high"
    req = SimpleNamespace(reasoning_effort="low", vllm_xargs=None)
    assert SpecExitVLLMEngine._apply_effort(eng, req)["effort"] == "low"
    req = SimpleNamespace(reasoning_effort=None, vllm_xargs={"specexit_effort": "max"})
    assert SpecExitVLLMEngine._apply_effort(eng, req)["effort"] == "max" and req.reasoning_effort is None
    eng._default_effort = None
    assert _thinking_closed(SimpleNamespace(reasoning_effort="none"))
    assert _thinking_closed(SimpleNamespace(chat_template_kwargs={"enable_thinking": False}))
    assert not _thinking_closed(SimpleNamespace(reasoning_effort="high", chat_template_kwargs=None))
    assert not _thinking_closed(
        SimpleNamespace(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True})
    )
    answer = [5, 6, 7]  # no `</think>` among the generated ids
    assert choice_telemetry(answer, 269, None)["think_tokens"] == 3  # thinking never ended: all of it
    assert choice_telemetry(answer, 269, None, thinking_closed=True)["think_tokens"] == 0
    u = usage_block(True, [choice_telemetry(answer, 269, None, thinking_closed=True)], {"effort": "none"})
    assert u["effort"] == {"effort": "none"} and u["think_tokens"] == 0
    assert _UsageContext().effort is None


def test_thinking_token_budget_becomes_the_exact_exit_budget():
    """`thinking_token_budget` on a request SpecExit runs: the hook's exact budget (the smaller of the two
    when both are given), vLLM's own cleared; with SpecExit off, vLLM's is kept; 0 is a clear 400."""
    from types import SimpleNamespace

    import pytest

    from serve_app.engine import SpecExitVLLMEngine
    from serve_app.telemetry import choice_telemetry
    from specexit_core.exit.profiles import resolve_exit_defaults

    eng = SimpleNamespace(
        _specexit_active=True, _exit_defaults=resolve_exit_defaults(None, None, None), _default_effort=None
    )
    eng._enabled = lambda r: SpecExitVLLMEngine._enabled(eng, r)

    def req(budget, xargs=None):
        return SimpleNamespace(thinking_token_budget=budget, vllm_xargs=xargs, temperature=0.0, top_p=None, top_k=None)

    r = req(8)
    SpecExitVLLMEngine._apply_think_budget(eng, r)
    assert r.vllm_xargs == {"specexit_max_think_tokens": 8} and r.thinking_token_budget is None
    r = req(8, {"specexit_max_think_tokens": 5})
    SpecExitVLLMEngine._apply_think_budget(eng, r)
    assert r.vllm_xargs["specexit_max_think_tokens"] == 5
    off = req(8, {"specexit_enabled": 0})
    SpecExitVLLMEngine._apply_think_budget(eng, off)
    assert off.thinking_token_budget == 8 and "specexit_max_think_tokens" not in off.vllm_xargs
    with pytest.raises(ValueError, match="reasoning_effort 'none'"):
        SpecExitVLLMEngine._apply_think_budget(eng, req(0))
    # usage counts think tokens as the budget does: a `<think>` the model writes is not one
    assert choice_telemetry([40, 7, 7, 41, 9], 41, None, think_start_id=40)["think_tokens"] == 2
    assert choice_telemetry([7, 7, 41, 9], 41, None, think_start_id=40)["think_tokens"] == 2


def test_ingress_resources_pin_the_ingress_and_bad_ones_fail_early(monkeypatch):
    """`ingress_resources` reach the ingress replica's actor options (the node-loss drill pins it to the
    head with them); the engine deployment keeps its own; a zero or negative amount is refused."""
    import types

    import ray

    from serve_app.ray_llm import build_like_serve_run

    monkeypatch.setattr(ray, "get_runtime_context", lambda: types.SimpleNamespace(runtime_env={}))
    toy = {"model": {"id": "m", "source": "toy:teacher", "accelerator": "cpu"}}
    head = {"node:__internal_head__": 0.001}
    built = build_like_serve_run(
        {"name": "t", "import_path": "serve_app.app:build_app", "args": {**toy, "ingress_resources": head}}
    )
    opts = {d.name: d.ray_actor_options for d in built.deployments}
    engine = opts.pop("SpecExitLLMServer:m")
    ((_, ingress),) = opts.items()
    assert ingress["resources"] == head and "resources" not in (engine or {})
    plain = build_like_serve_run({"name": "t", "import_path": "serve_app.app:build_app", "args": toy})
    assert all("resources" not in (d.ray_actor_options or {}) for d in plain.deployments)
    with pytest.raises(ConfigError, match="ingress_resources"):
        load_args({**toy, "ingress_resources": {"node:__internal_head__": 0}})
