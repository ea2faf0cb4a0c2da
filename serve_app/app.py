"""`import_path: serve_app.app:build_app` -- the Serve application of one SpecExit model.

Built from Ray Serve LLM's parts (`LLMConfig`, `build_llm_deployment`, `make_fastapi_ingress`)
rather than `build_openai_app` for one reason: `build_openai_app` creates the FastAPI app itself
and offers no hook for middleware, and API-key auth must run before request parsing (a bad key
is 401 even when the body is malformed). Everything else is what `build_openai_app` does.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.exceptions import RequestValidationError
from ray import serve
from ray.serve.deployment import Application
from ray.serve.llm import LLMConfig, build_llm_deployment
from ray.serve.llm.ingress import make_fastapi_ingress
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_app.auth import BearerAuthMiddleware
from serve_app.config import AppArgs, load_args
from serve_app.ingress import SpecExitIngress, http_error_handler, validation_error_handler
from serve_app.limits import BodySizeLimitMiddleware
from serve_app.ray_llm import init_fastapi, to_model_metadata
from serve_app.routing import ROUTER_PATH
from serve_app.server import SpecExitLLMServer
from specexit_core.exit import EXIT_CONFIG_ENV
from specexit_core.exit.efforts import DEFAULT_EFFORT_ENV
from specexit_core.vllm_env import cpu_engine_env
from specexit_core.vllm_plugin.long_controls import LONG_DEFAULTS_ENV
from specexit_core.vllm_plugin.telemetry import SEGMENT_BYTES_ENV, TELEMETRY_DIR_ENV


def engine_kwargs(a: AppArgs) -> dict[str, Any]:
    m = a.model
    kw: dict[str, Any] = {
        "dtype": m.dtype,
        "enforce_eager": m.enforce_eager,
        "tensor_parallel_size": m.tensor_parallel_size,
    }
    for name in ("max_model_len", "max_num_seqs", "seed", "reasoning_parser"):
        if getattr(m, name) is not None:
            kw[name] = getattr(m, name)
    if m.draft:
        kw["speculative_config"] = {
            "method": "eagle3",
            "model": m.draft,
            "num_speculative_tokens": m.num_speculative_tokens,
        }
    kw.update(m.engine_kwargs)
    return kw


def shutdown_options(a: AppArgs) -> dict[str, float]:
    """A replica that Serve stops (scale-down, redeploy) first drains: it waits, checking every
    wait-loop period, until its requests are done or the timeout passes. Serve's default timeout (20 s)
    is shorter than the request deadline and would cut long generations; this is at least the deadline."""
    return {"graceful_shutdown_timeout_s": a.shutdown_timeout_s, "graceful_shutdown_wait_loop_s": 2.0}


def routing_options(a: AppArgs) -> dict[str, Any]:
    """The engine deployment's `request_router_config` (Ray's RequestRouterConfig, as a dict); none for
    `power_of_two`, so the deployment keeps Serve's default router exactly as before."""
    if a.routing.policy == "power_of_two":
        return {}
    return {
        "request_router_config": {
            "request_router_class": ROUTER_PATH,
            "request_router_kwargs": a.routing.router_kwargs(),
        }
    }


def llm_config(a: AppArgs) -> LLMConfig:
    m = a.model
    env = dict(m.env)
    if m.accelerator == "cpu":  # no binding given: the replica binds its own node's cores (server.py)
        for k, v in cpu_engine_env(m.cpu.kv_cache_gib, m.cpu.omp_threads_bind).items():
            env.setdefault(k, v)
    if a.specexit.exit_defaults:
        env[EXIT_CONFIG_ENV] = json.dumps(a.specexit.exit_defaults)
    if a.specexit.default_effort:
        env[DEFAULT_EFFORT_ENV] = a.specexit.default_effort
    if a.specexit.telemetry_dir:
        env[TELEMETRY_DIR_ENV] = a.specexit.telemetry_dir
    if a.specexit.telemetry_segment_bytes:
        env[SEGMENT_BYTES_ENV] = str(a.specexit.telemetry_segment_bytes)
    if a.specexit.long_defaults:
        env[LONG_DEFAULTS_ENV] = json.dumps(a.specexit.long_defaults)
    autoscaling = a.autoscaling.model_dump(exclude_none=True)
    deployment = {
        "autoscaling_config": autoscaling,
        "max_ongoing_requests": a.backpressure.max_ongoing_requests,
        "max_queued_requests": a.backpressure.max_queued_requests,
        "health_check_period_s": a.health.period_s,
        "health_check_timeout_s": a.health.timeout_s,
        "ray_actor_options": {"num_cpus": a.replica_num_cpus},
        **shutdown_options(a),
        **routing_options(a),
    }
    tp = m.tensor_parallel_size
    extra: dict[str, Any] = {}
    if m.accelerator == "cpu":
        # One logical-CPU bundle per rank, all on one node (ranks talk through shared memory).
        extra["accelerator_config"] = {"kind": "cpu"}
        extra["placement_group_config"] = {"bundles": [{"CPU": 1} for _ in range(tp)], "strategy": "STRICT_PACK"}
    else:
        extra["accelerator_config"] = {"kind": "gpu"}
        if m.accelerator_type:
            extra["accelerator_type"] = m.accelerator_type
        # TP ranks exchange activations every layer: keep them on one node.
        extra["placement_group_config"] = {"bundle_per_worker": {"GPU": 1, "CPU": 1}, "strategy": "STRICT_PACK"}
    return LLMConfig(
        model_loading_config={"model_id": m.id, "model_source": m.source},
        engine_kwargs=engine_kwargs(a),
        deployment_config=deployment,
        runtime_env={"env_vars": env} if env else None,
        server_cls=SpecExitLLMServer,
        log_engine_metrics=False,
        **extra,
    )


def build_app(args: dict | AppArgs | None = None) -> Application:
    """Serve builder (`applications[].args` of the YAML, validated by serve_app/config.py)."""
    a = load_args(args)
    cfg = llm_config(a)
    app = init_fastapi()
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    # Before any parsing: a body over the limit is never read whole.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=a.limits.max_body_bytes)
    if a.auth.enabled:
        # Added last = runs first: reject before parsing, metrics or anything else sees the request.
        app.add_middleware(BearerAuthMiddleware, env_name=a.auth.api_keys_env, file=a.auth.api_keys_file)
    ingress_cls = make_fastapi_ingress(SpecExitIngress, app=app)
    options = SpecExitIngress.get_deployment_options([cfg])
    options["ray_actor_options"] = {"num_cpus": a.ingress_num_cpus}
    if a.ingress_resources:
        options["ray_actor_options"]["resources"] = dict(a.ingress_resources)
    options.update(shutdown_options(a))  # the ingress holds the client's connection: it drains too
    # The ingress only forwards; it must not be where requests queue without bound or get refused.
    options["max_ongoing_requests"] = max(
        1000,
        4 * a.autoscaling.max_replicas * (a.backpressure.max_ongoing_requests + a.backpressure.max_queued_requests),
    )
    return serve.deployment(ingress_cls, **options).bind(
        llm_deployments={cfg.model_id: build_llm_deployment(cfg)},
        model_cards={cfg.model_id: to_model_metadata(cfg.model_id, cfg)},
        request_timeout_s=a.request_timeout_s,
        retry_after_s=a.backpressure.retry_after_s,
        overload_status=a.backpressure.overload_status,
        auth=a.auth.model_dump(),
        limits=a.limits.model_dump(),
        max_sequences_in_flight=a.sequence_budget,
    )
