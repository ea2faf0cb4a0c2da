"""Typed `applications[].args` of the Serve config (`serve run serve_app/toy_cpu.yaml`, KubeRay
`serveConfigV2`). Every model forbids unknown keys, so a typo fails when the app is built, not
as a silently ignored setting hours later. Secrets never appear here: auth names where the keys
live (an env var, a file), the ingress replica reads them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import ConfigDict, Field, PositiveFloat, field_validator, model_validator

from specexit_core.exit import ExitConfig
from specexit_core.exit.efforts import parse_effort
from specexit_core.exit.profiles import SamplingProfile, served_default_profile
from specexit_core.teachers.model_ref import resolve_model
from specexit_core.typed_config import StrictModel, load_config
from specexit_core.vllm_plugin.long_controls import KEY as LONG_KEY
from specexit_core.vllm_plugin.long_controls import LongConfig, request_long_config

# Beyond the request deadline, a stopping replica waits this long more: a request admitted at the
# last moment still gets its whole deadline, plus time to send its answer.
SHUTDOWN_MARGIN_S = 10.0


class ServeArgs(StrictModel):
    """Base of the args models: strict like every config, and frozen: validated once when the app is
    built, then only read (to change one, copy it: `model_copy(update=...)`)."""

    model_config = ConfigDict(frozen=True)


class CpuArgs(ServeArgs):
    kv_cache_gib: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE per replica (GiB)")
    omp_threads_bind: str | None = Field(
        None, description="VLLM_CPU_OMP_THREADS_BIND, e.g. '0-1', or '0|1' for TP=2 (one core per rank)"
    )


class ModelArgs(ServeArgs):
    id: str = Field(description="the model name clients send (`model` field) and /v1/models lists")
    source: str = Field(
        description="model folder or hub id; `toy:teacher` for the shipped toy, `teacher:NAME` for a built-in teacher"
    )
    draft: str | None = Field(None, description="SpecExit (or stock EAGLE-3) draft folder; none: no speculation")
    num_speculative_tokens: int = Field(3, ge=1, le=16)
    tensor_parallel_size: int = Field(1, ge=1)
    accelerator: Literal["cpu", "gpu"] = "gpu"
    accelerator_type: str | None = Field(None, description="Ray accelerator type, e.g. H100 (GPU only)")
    dtype: str = "auto"
    max_model_len: int | None = Field(None, ge=16)
    max_num_seqs: int | None = Field(None, ge=1)
    enforce_eager: bool = False
    seed: int | None = None
    reasoning_parser: str | None = Field(
        "qwen3", description="vLLM reasoning parser: splits <think>…</think> into `reasoning`; null: off"
    )
    aux_hidden_state_layer_ids: list[int] | None = Field(
        None, description="target layers the EAGLE-3 draft reads (needed for tiny targets)"
    )
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="more vLLM AsyncEngineArgs (validated)")
    cpu: CpuArgs = Field(default_factory=CpuArgs)
    env: dict[str, str] = Field(default_factory=dict, description="extra env vars for the engine replica")

    @field_validator("source", "draft")
    @classmethod
    def _paths(cls, v):
        # here, in the process that reads the YAML: replicas do not run in its working directory
        return resolve_model(v)

    @field_validator("engine_kwargs")
    @classmethod
    def _known_engine_kwargs(cls, v: dict) -> dict:
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
        except Exception:  # vLLM missing where the YAML is read (e.g. a CI lint job): vLLM checks at start
            return v
        known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
        unknown = sorted(set(v) - known)
        if unknown:
            raise ValueError(f"unknown vLLM engine argument(s) {unknown} (see vllm AsyncEngineArgs)")
        managed = sorted(
            set(v) & {"model", "served_model_name", "tensor_parallel_size", "speculative_config", "reasoning_parser"}
        )
        if managed:
            raise ValueError(
                f"set {managed} through the model fields (id, source, draft, tensor_parallel_size, "
                "reasoning_parser), not engine_kwargs"
            )
        return v

    @model_validator(mode="after")
    def _gpu_only(self):
        if self.accelerator == "cpu" and self.accelerator_type:
            raise ValueError("accelerator_type applies to accelerator: gpu only")
        return self


class SpecExitArgs(ServeArgs):
    exit_defaults: dict[str, Any] = Field(
        default_factory=dict, description="server-wide ExitConfig overrides (requests override these)"
    )
    telemetry_dir: str | None = Field(
        None, description="where the engine logs exit events (default: a per-replica temp folder)"
    )
    telemetry_segment_bytes: int | None = Field(
        None,
        ge=16384,
        description="size at which an engine's event file rolls to the next segment; the replica deletes "
        "segments it has read (default: $SPECEXIT_TELEMETRY_SEGMENT_BYTES, else 1 MiB). An event is ~300 "
        "bytes; the engine keeps 8 segments a stream however far its reader lags",
    )
    long_defaults: dict[str, Any] = Field(
        default_factory=dict,
        description="the long mode on by default, with these LongConfig fields (nested like the `long` "
        "request control: ngram, ngram_min, ngram_max, ngram_policy, penalty {theta, window}); requests override them, "
        "`long: 0` turns it off. Empty: off unless a request asks (docs/longgen.md)",
    )

    default_effort: str | None = Field(
        None,
        description="the reasoning effort of a request that gives none (`reasoning_effort` or "
        "`vllm_xargs.specexit_effort`): none | minimal | low | medium | high | xhigh | max. Unset: "
        "such a request runs at the exit defaults",
    )

    @field_validator("default_effort")
    @classmethod
    def _valid_effort(cls, v: str | None) -> str | None:
        return None if v is None else parse_effort(v)

    @field_validator("exit_defaults")
    @classmethod
    def _valid_exit(cls, v: dict) -> dict:
        ExitConfig().with_overrides(v)  # raises on unknown keys and bad values, naming them
        return v

    @field_validator("long_defaults")
    @classmethod
    def _valid_long(cls, v: dict) -> dict:
        if v:
            request_long_config({LONG_KEY: v}, LongConfig())  # raises on unknown keys and bad values
        return v


class AutoscalingArgs(ServeArgs):
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    initial_replicas: int | None = Field(None, ge=0)
    target_ongoing_requests: float = Field(16, gt=0)
    upscale_delay_s: float = Field(30.0, ge=0)
    downscale_delay_s: float = Field(600.0, ge=0)
    # the window Serve averages ongoing requests over (None: Serve's 30 s); a short one lets the
    # scaling tests react in seconds
    look_back_period_s: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _order(self):
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) > max_replicas ({self.max_replicas})")
        if self.initial_replicas is not None and not self.min_replicas <= self.initial_replicas <= self.max_replicas:
            raise ValueError("initial_replicas must lie in [min_replicas, max_replicas]")
        return self


class BackpressureArgs(ServeArgs):
    max_ongoing_requests: int = Field(64, ge=1, description="requests one engine replica runs at once")
    max_queued_requests: int = Field(64, ge=0, description="requests waiting for a replica; more are rejected")
    max_sequences_in_flight: int | None = Field(
        None,
        ge=1,
        description="sequences (n x prompts of every admitted request) the ingress lets in at once; more are "
        "rejected like a full queue. None: max_replicas x (max_ongoing_requests + max_queued_requests), "
        "i.e. the request queue's size counted in sequences",
    )
    overload_status: Literal[429, 503] = 429
    retry_after_s: int = Field(1, ge=1, description="Retry-After header on 429/503")


class LimitsArgs(ServeArgs):
    """What one request may ask for; checked at the ingress before any engine sees the request."""

    max_n: int = Field(16, ge=1, description="largest `n` (choices per prompt); more: 400")
    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="largest request body in bytes (checked while it streams in); more: 413"
    )
    max_messages: int = Field(
        256, ge=1, description="most chat `messages` (and most prompts in one /v1/completions call); more: 400"
    )


class RoutingArgs(ServeArgs):
    """How the ingress picks an engine replica. `prefix_aware`: Ray Serve LLM's
    PrefixCacheAffinityRouter (serve_app/routing.py), which sends a prompt to the replica that already
    served its longest prefix, i.e. where that prefix's KV blocks are (with `enable_prefix_caching`).
    The tuning fields are its `initialize_state` arguments; None leaves Ray's default."""

    policy: Literal["power_of_two", "prefix_aware"] = Field(
        "power_of_two", description="power_of_two: Serve's default router (least loaded of two random replicas)"
    )
    imbalanced_threshold: float | None = Field(
        None,
        ge=0,
        description="queue-length difference between replicas above which load wins over prefix affinity "
        "(power of two); None: Ray's default, infinity (prefix affinity always wins)",
    )
    match_rate_threshold: float | None = Field(
        None,
        ge=0,
        le=1,
        description="share of the prompt's characters a replica must hold to be preferred; below it the "
        "replica holding the fewest characters gets the request. None: Ray's default (0.1)",
    )
    do_eviction: bool | None = Field(
        None, description="trim the router's prefix tree (least recently used first); None: Ray's default (off)"
    )
    eviction_threshold_chars: int | None = Field(
        None, ge=1, description="characters one replica holds in the tree that start a trim (Ray: 400000)"
    )
    eviction_target_chars: int | None = Field(
        None, ge=1, description="characters of that replica a trim leaves (Ray: 360000)"
    )
    eviction_interval_secs: int | None = Field(None, ge=1, description="how often the tree is checked (Ray: 10)")

    @model_validator(mode="after")
    def _prefix_fields_need_prefix_policy(self):
        tuned = sorted(self.router_kwargs())
        if self.policy != "prefix_aware" and tuned:
            raise ValueError(f"routing {tuned} apply to policy: prefix_aware only (policy is {self.policy})")
        t, target = self.eviction_threshold_chars, self.eviction_target_chars
        if t is not None and target is not None and target > t:
            raise ValueError(f"eviction_target_chars ({target}) > eviction_threshold_chars ({t})")
        return self

    def router_kwargs(self) -> dict[str, Any]:
        """The PrefixCacheAffinityRouter arguments that were set (Ray's defaults stay Ray's)."""
        return self.model_dump(exclude={"policy"}, exclude_none=True)


class AuthArgs(ServeArgs):
    enabled: bool = False
    api_keys_env: str | None = Field("SPECEXIT_API_KEYS", description="env var: keys, comma/newline separated")
    api_keys_file: str | None = Field(None, description="file: one key per line (# comments); re-read on change")

    @model_validator(mode="after")
    def _source(self):
        if self.enabled and not (self.api_keys_env or self.api_keys_file):
            raise ValueError("auth.enabled needs api_keys_env or api_keys_file")
        return self


class HealthArgs(ServeArgs):
    period_s: float = Field(5.0, gt=0, description="Serve calls check_health this often")
    timeout_s: float = Field(30.0, gt=0, description="a check slower than this counts as failed")


class AppArgs(ServeArgs):
    model: ModelArgs
    specexit: SpecExitArgs = Field(default_factory=SpecExitArgs)
    autoscaling: AutoscalingArgs = Field(default_factory=AutoscalingArgs)
    backpressure: BackpressureArgs = Field(default_factory=BackpressureArgs)
    auth: AuthArgs = Field(default_factory=AuthArgs)
    health: HealthArgs = Field(default_factory=HealthArgs)
    limits: LimitsArgs = Field(default_factory=LimitsArgs)
    routing: RoutingArgs = Field(default_factory=RoutingArgs)
    request_timeout_s: float = Field(300.0, gt=0, description="whole request, queueing included; then 503")
    graceful_shutdown_timeout_s: float | None = Field(
        None,
        gt=0,
        description="how long a stopping replica (scale-down, redeploy) lets its requests finish; "
        f"None: request_timeout_s + {SHUTDOWN_MARGIN_S:g} s. Never below request_timeout_s",
    )
    replica_num_cpus: float = Field(
        0.0, ge=0, description="logical CPUs for the replica actor itself (the engine ranks get one bundle each)"
    )
    ingress_num_cpus: float = Field(0.0, ge=0)
    ingress_resources: dict[str, PositiveFloat] = Field(
        default_factory=dict,
        description="custom Ray resources the ingress replica asks for. {'node:__internal_head__': 0.001} keeps "
        "it on the head node, beside Serve's controller and proxy: a lost worker node then never takes the "
        "ingress (and every request in flight through it) along, only the engine replicas it ran",
    )

    @model_validator(mode="after")
    def _long_needs_a_draft(self):
        if self.specexit.long_defaults and not self.model.draft:
            raise ValueError("specexit.long_defaults needs model.draft (the long mode runs beside the EAGLE-3 draft)")
        return self

    @model_validator(mode="after")
    def _limits_fit(self):
        if self.graceful_shutdown_timeout_s is not None and self.graceful_shutdown_timeout_s < self.request_timeout_s:
            raise ValueError(
                f"graceful_shutdown_timeout_s ({self.graceful_shutdown_timeout_s:g}) < request_timeout_s "
                f"({self.request_timeout_s:g}): scale-down would cut requests that are still within their deadline"
            )
        if self.limits.max_n > self.sequence_budget:
            raise ValueError(
                f"limits.max_n ({self.limits.max_n}) > the sequences admitted at once ({self.sequence_budget}, "
                "backpressure.max_sequences_in_flight): a request at max_n could never run"
            )
        return self

    @property
    def sequence_budget(self) -> int:
        """Sequences in flight the ingress admits (backpressure counted in work, not requests)."""
        b = self.backpressure
        if b.max_sequences_in_flight is not None:
            return b.max_sequences_in_flight
        return self.autoscaling.max_replicas * (b.max_ongoing_requests + b.max_queued_requests)

    @property
    def shutdown_timeout_s(self) -> float:
        """graceful_shutdown_timeout_s of every deployment: at least the request deadline."""
        if self.graceful_shutdown_timeout_s is not None:
            return self.graceful_shutdown_timeout_s
        return self.request_timeout_s + SHUTDOWN_MARGIN_S


def served_sampling(args: AppArgs) -> SamplingProfile:
    """The sampling profile this deployment serves a request that names none with: its model's defaults
    as vLLM applies them (`served_default_profile`, with the app's `engine_kwargs` generation_config /
    override_generation_config). `specexit calibrate --serve-config` calibrates at it."""
    kw = args.model.engine_kwargs
    return served_default_profile(
        args.model.source,
        generation_config=kw.get("generation_config", "auto"),
        override=kw.get("override_generation_config"),
    )


def load_args(args: dict | AppArgs | None) -> AppArgs:
    """`applications[].args` -> AppArgs (`load_config`); raises ConfigError naming every bad key."""
    if isinstance(args, AppArgs):
        return args
    return load_config(AppArgs, raw=args or {}, what="Serve app args")
