"""Ray Serve LLM's vLLM engine plus SpecExit telemetry (injected into `LLMServer` as its engine class).

Everything OpenAI-shaped (parsing, chat templates, reasoning parser, errors, streaming) stays in
vLLM's own serving layer; this class only post-processes what it returns:
* `usage.specexit` (serve_app/telemetry.py) on non-streaming responses and on the final usage
  chunk of a stream (`stream_options.include_usage`);
* `reasoning_content` next to vLLM 0.32's `reasoning`, for clients written against the older name;
* counts the engine aborts (a client that disconnects must abort its request in the engine);
* `usage.specexit.fallback`: why the worker ran a request without SpecExit (from `fallbacks-*.jsonl`);
* `usage.specexit.long`: a long-mode request's n-gram / EAGLE-3 drafts and acceptance and its
  penalty (from `long-*.jsonl`, written at the engine step after the request finished: waited for
  up to LONG_EVENT_WAIT_S);
* counts the requests that reach it, and those that still carry an `Authorization` header (the
  ingress strips it after the key check, serve_app/auth.py: this count must stay 0);
* counts prefix-cache lookups and hits and preemptions, also as Ray metrics (serve_app/cache_metrics.py).
On CPU at one rank the engine core runs the model itself (`run_model_in_engine_core`): no worker process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_core import from_json, to_json

from serve_app import cache_metrics
from serve_app.ray_llm import VLLMEngine, skip_noop_node_init
from serve_app.replica import replica_tag
from serve_app.telemetry import ExitEventIndex, choice_telemetry, usage_block
from specexit_core.draft.config import SpecExitFields, read_specexit_fields
from specexit_core.exit.efforts import DEFAULT_EFFORT_ENV, EFFORT_CONTROL, THINKING_OFF, parse_effort
from specexit_core.vllm_env import run_model_in_engine_core
from specexit_core.vllm_plugin.controls import request_effort, request_exit_config, sampling_profile, server_defaults
from specexit_core.vllm_plugin.long_controls import request_long_config, server_long_defaults
from specexit_core.vllm_plugin.telemetry import TELEMETRY_DIR_ENV

log = logging.getLogger("specexit.serve.engine")
# How long a long-mode response waits for its worker event (written one engine step after the request
# finished; an idle engine runs that step at once). Past it the response goes out with `long: null`.
LONG_EVENT_WAIT_S = 2.0


def _draft_specexit_fields(engine_kwargs: dict) -> SpecExitFields | None:
    """The SpecExit fields of the engine's draft; None without a SpecExit draft (a stock EAGLE-3
    or remote draft: the plugin's exit hook is inactive then)."""
    spec = engine_kwargs.get("speculative_config") or {}
    draft = spec.get("model") if isinstance(spec, dict) else getattr(spec, "model", None)
    if not draft or not (Path(draft) / "config.json").exists():
        return None
    fields = read_specexit_fields(json.loads((Path(draft) / "config.json").read_text()))
    return fields if fields.signals else None


class SpecExitVLLMEngine(VLLMEngine):
    def _start_async_llm_engine(self, vllm_engine_args, vllm_engine_config, placement_group):
        if run_model_in_engine_core(vllm_engine_config):
            log.info("CPU, one rank: the engine core runs the model itself (uniprocess executor)")
        return super()._start_async_llm_engine(vllm_engine_args, vllm_engine_config, placement_group)

    async def start(self) -> None:
        if skip_noop_node_init(self.llm_config):  # a local folder or hub id, no mirror: nothing to fetch
            log.info("model %s needs no per-node download: node initialization skipped", self.llm_config.model_id)
        await super().start()
        kwargs = self.llm_config.get_engine_config().engine_kwargs
        block = _draft_specexit_fields(kwargs)
        self._specexit_active = block is not None
        self._exit_defaults = (
            server_defaults(block.exit_defaults, block.exit_profiles, block.exit_efforts) if block else None
        )
        self._long_defaults = server_long_defaults() if block else None
        self._default_effort = (
            parse_effort(os.environ[DEFAULT_EFFORT_ENV]) if os.environ.get(DEFAULT_EFFORT_ENV) else None
        )
        self._think_end_id = int(block.token_ids["think_end"]) if block else self._tokenizer_id("</think>")
        self._think_start_id = int(block.token_ids["think_start"]) if block else self._tokenizer_id("<think>")
        tdir = os.environ.get(TELEMETRY_DIR_ENV)
        self._events = ExitEventIndex(tdir) if (tdir and block) else None
        self._aborts = 0
        self._requests = self._requests_with_authorization = 0
        orig_abort = self._engine_client.abort

        async def abort(request_id, *args, **kw):
            ids = [request_id] if isinstance(request_id, str) else list(request_id)
            self._aborts += len(ids)
            return await orig_abort(request_id, *args, **kw)

        self._engine_client.abort = abort
        self._replica = replica_tag()
        self._cache = cache_metrics.attach(
            self._engine_client, cache_metrics.RayCounters(self.llm_config.model_id, self._replica)
        )
        log.info(
            "SpecExit serving: active=%s think_end=%s telemetry=%s", self._specexit_active, self._think_end_id, tdir
        )

    def _tokenizer_id(self, token: str) -> int | None:
        try:
            tid = self._engine_client.tokenizer.convert_tokens_to_ids(token)
            return tid if isinstance(tid, int) and tid >= 0 else None
        except Exception:
            return None

    def specexit_stats(self) -> dict:
        """Engine aborts, requests the engine still runs, telemetry lines skipped as malformed,
        requests seen and those that arrived with an Authorization header; which replica this is and its
        prefix-cache and preemption counts (None when the engine keeps no statistics)."""
        return {
            "replica": self._replica,
            "prefix_cache": self._cache.snapshot() if self._cache is not None else None,
            "aborts": self._aborts,
            "requests": self._requests,
            "requests_with_authorization": self._requests_with_authorization,
            "specexit_active": self._specexit_active,
            "unfinished_requests": self._unfinished(),
            "telemetry_malformed_lines": self._events.malformed_lines if self._events is not None else 0,
        }

    def _unfinished(self) -> int | None:
        try:  # requests the engine has not finished or aborted (AsyncLLM's output processor)
            return int(self._engine_client.output_processor.get_num_unfinished_requests())
        except Exception:  # noqa: BLE001 -- a stats field, never an error
            return None

    # -- request handling ----------------------------------------------------------------------
    def _enabled(self, request) -> bool:
        if not self._specexit_active:
            return False
        try:
            return request_exit_config(
                getattr(request, "vllm_xargs", None), self._exit_defaults, sampling_profile(request)
            ).enabled
        except ValueError:
            return False  # vLLM answers 400 for it anyway

    def _apply_think_budget(self, request) -> None:
        """`thinking_token_budget` (vLLM's name) becomes the request control `specexit_max_think_tokens`
        (the smaller of the two when both are given) on a request SpecExit runs: the exit hook's budget
        holds exactly inside speculative steps (a step that runs past it is cut there), where vLLM's
        sampler-side budget does not with speculative decoding on (vLLM issues #39573, #54906), and it needs
        no `--reasoning-config`. A request with SpecExit off keeps vLLM's own budget."""
        budget = getattr(request, "thinking_token_budget", None)
        if budget is None or not self._enabled(request):
            return
        if budget < 1:
            raise ValueError(
                "thinking_token_budget 0: to answer without thinking, use reasoning_effort 'none' "
                "(the template's enable_thinking: false)"
            )
        xargs = dict(getattr(request, "vllm_xargs", None) or {})
        given = xargs.get("specexit_max_think_tokens")
        xargs["specexit_max_think_tokens"] = budget if given in (None, "none") else min(int(float(given)), budget)
        request.vllm_xargs = xargs
        request.thinking_token_budget = None  # one budget, ours

    def _apply_effort(self, request) -> dict | None:
        """The request's reasoning effort: `reasoning_effort` (vLLM's chat field, which on its own only
        turns thinking off for `none`) becomes the request control `specexit_effort` (one given in
        `vllm_xargs` wins), so the worker exits at that level's certified operating point
        (specexit_core/exit/efforts.py). A request with neither gets the deployment's default level
        (`specexit.default_effort`), as if it had sent it: `none` then closes thinking in the template
        too. Returns what usage reports, or None (no level, or no SpecExit)."""
        if not self._specexit_active:
            return None
        level = getattr(request, "reasoning_effort", None)
        xargs = dict(getattr(request, "vllm_xargs", None) or {})
        if level is None and EFFORT_CONTROL not in xargs and self._default_effort is not None:
            level = request.reasoning_effort = self._default_effort
        if level is not None and EFFORT_CONTROL not in xargs:
            xargs[EFFORT_CONTROL] = level
            request.vllm_xargs = xargs
        try:
            return self._exit_defaults.for_effort(request_effort(xargs))[1] or None
        except ValueError:
            return None  # vLLM answers 400 for it anyway

    def _long_enabled(self, request) -> bool:
        if not self._specexit_active:
            return False
        try:
            return request_long_config(getattr(request, "vllm_xargs", None), self._long_defaults).active
        except ValueError:
            return False  # vLLM answers 400 for it anyway

    async def _wait_long(self, response_id: str, choices, n: int | None) -> None:
        """Until the long-mode events of these choices are in (or LONG_EVENT_WAIT_S passed)."""
        if self._events is None:
            return
        keys = [_choice_key(response_id, c, n) for c in choices]
        deadline = time.monotonic() + LONG_EVENT_WAIT_S
        while not all(self._events.has_long(*k) for k in keys):
            if time.monotonic() > deadline:
                log.warning("long-mode telemetry of %s not in after %.1f s", response_id, LONG_EVENT_WAIT_S)
                return
            await asyncio.sleep(0.01)

    async def chat(self, request, raw_request_info=None) -> AsyncGenerator[Any, None]:
        async for item in self._with_telemetry(super().chat, request, raw_request_info, chat=True):
            yield item

    async def completions(self, request, raw_request_info=None) -> AsyncGenerator[Any, None]:
        async for item in self._with_telemetry(super().completions, request, raw_request_info, chat=False):
            yield item

    async def _with_telemetry(self, method, request, raw_request_info, *, chat: bool):
        self._count_request(raw_request_info)
        want_ids = bool(getattr(request, "return_token_ids", False))
        request.return_token_ids = True  # think tokens are counted on ids, not re-tokenized text
        usage = _UsageContext(self._apply_effort(request), _thinking_closed(request))
        self._apply_think_budget(request)
        enabled = self._enabled(request)
        long_on = self._long_enabled(request)
        n = None if chat else max(int(getattr(request, "n", None) or 1), 1)
        stream = _StreamRewriter(self, want_ids, enabled, n, usage)
        try:
            async for item in method(request, raw_request_info):
                if isinstance(item, str):
                    if long_on and stream.response_id and _final_usage_chunk(item):
                        await self._wait_long(stream.response_id, sorted(stream.ids), n)
                    yield stream.rewrite(item)
                elif hasattr(item, "choices") and hasattr(item, "usage"):
                    if long_on and item.usage is not None:
                        await self._wait_long(item.id, [c.index for c in item.choices], n)
                    yield self._finish_response(item, want_ids, enabled, n, usage)
                else:
                    yield item  # ErrorResponse
        except Exception as e:
            if type(e).__name__ == "GenerationError" and _constrains_output(request):
                # vLLM ends a request whose output grammar admits no token of the model's vocabulary
                # (e.g. JSON for a model without a "{" token) as an internal error; it is the request's
                # format, not the server, so the ingress answers 400 (ValueError) with this message.
                raise ValueError(
                    "the requested output format (response_format / structured_outputs) cannot be "
                    "produced by this model: the engine ended the request when its grammar admitted no "
                    "token of the model's vocabulary"
                ) from e
            raise

    def _count_request(self, raw_request_info) -> None:
        self._requests += 1
        headers = getattr(raw_request_info, "headers", None) or {}
        if any(str(k).lower() == "authorization" for k in headers):
            self._requests_with_authorization += 1

    def _telemetry(
        self,
        response_id: str,
        token_ids_by_choice: dict[int, list[int]],
        enabled: bool,
        n: int | None,
        usage: _UsageContext | None = None,
    ) -> dict:
        """One response's `usage.specexit` (`_choice_key`: how choices map to engine request ids)."""
        usage = usage or _UsageContext()
        choices = []
        for i in sorted(token_ids_by_choice):
            key = _choice_key(response_id, i, n)
            ev = self._events.pop(*key) if self._events is not None else None
            fb = self._events.pop_fallback(*key) if self._events is not None else None
            lg = self._events.pop_long(*key) if self._events is not None else None
            choices.append(
                choice_telemetry(
                    token_ids_by_choice[i],
                    self._think_end_id,
                    ev,
                    fb,
                    lg,
                    usage.thinking_closed,
                    self._think_start_id,
                )
            )
        return usage_block(enabled, choices or [choice_telemetry([], self._think_end_id, None)], usage.effort)

    def _finish_response(self, resp, want_ids: bool, enabled: bool, n: int | None, usage=None):
        chat = n is None
        ids = {c.index: list(c.token_ids or []) for c in resp.choices}
        if resp.usage is not None:
            resp.usage.specexit = self._telemetry(resp.id, ids, enabled, n, usage)
        if not want_ids and getattr(resp, "prompt_token_ids", None) is not None:
            resp.prompt_token_ids = None
        for c in resp.choices:
            if not want_ids:
                c.token_ids = None
                if getattr(c, "prompt_token_ids", None) is not None:
                    c.prompt_token_ids = None
            if chat and getattr(c.message, "reasoning", None) is not None:
                c.message.reasoning_content = c.message.reasoning
        return resp


@dataclass(frozen=True)
class _UsageContext:
    """What a request's `usage.specexit` needs beyond its tokens and exit events."""

    effort: dict | None = None  # {effort, served_by, epsilon}: `_apply_effort`
    thinking_closed: bool = False  # the prompt closed thinking: no generated token is a think token


def _thinking_closed(request) -> bool:
    """Whether the chat template closed thinking in the prompt: `reasoning_effort: none` (vLLM then
    renders with `enable_thinking: false`) or `chat_template_kwargs.enable_thinking: false`."""
    kwargs = getattr(request, "chat_template_kwargs", None) or {}
    if "enable_thinking" in kwargs:  # the caller's own template argument wins, as in vLLM
        return kwargs["enable_thinking"] is False
    return getattr(request, "reasoning_effort", None) == THINKING_OFF


def _choice_key(response_id: str, choice: int, n: int | None) -> tuple[str, int]:
    """The event key of one choice. n=None: chat (engine ids `<response id>`); else completions, where
    vLLM ids each prompt `<response id>-<prompt>` and choice c is sample c % n of prompt c // n."""
    return (response_id, choice) if n is None else (f"{response_id}-{choice // n}", choice % n)


def _final_usage_chunk(text: str) -> bool:
    """Whether an SSE string holds the stream's final usage chunk (no choices, a usage object)."""
    compact = text.replace(" ", "")
    return '"choices":[]' in compact and '"usage":{' in compact


def _constrains_output(request) -> bool:
    """Whether the request constrains its output by a grammar (JSON, a schema, a regex, choices)."""
    rf = getattr(request, "response_format", None)
    if rf is not None and getattr(rf, "type", "text") != "text":
        return True
    return getattr(request, "structured_outputs", None) is not None


class _StreamRewriter:
    """Rewrites vLLM's SSE strings (`data: {...}\\n\\n`) of one streamed request.

    Every chunk is parsed and written again (its token ids are counted and, unless the client asked
    for them, dropped): pydantic-core's JSON (compact, UTF-8) rather than the `json` module, which
    cost ~2.4x more CPU (3.4 vs 1.4 ms per 300-token stream on this machine's cores)."""

    def __init__(
        self,
        engine: SpecExitVLLMEngine,
        want_ids: bool,
        enabled: bool,
        n: int | None,
        usage: _UsageContext | None = None,
    ):
        self.engine, self.want_ids, self.enabled, self.n, self.chat = engine, want_ids, enabled, n, n is None
        self.usage = usage or _UsageContext()
        self.ids: dict[int, list[int]] = {}
        self.response_id: str | None = None

    def rewrite(self, text: str) -> str:
        out = []
        for event in text.split("\n\n"):
            if not event:
                continue
            if not event.startswith("data: ") or event == "data: [DONE]":
                out.append(event)
                continue
            obj = from_json(event[6:])
            if "choices" not in obj:  # an error event
                out.append(event)
                continue
            self.response_id = obj.get("id", self.response_id)
            if not self.want_ids:
                obj.pop("prompt_token_ids", None)
            for c in obj["choices"]:
                self.ids.setdefault(c.get("index", 0), []).extend(c.get("token_ids") or [])
                if not self.want_ids:
                    c.pop("token_ids", None)
                    c.pop("prompt_token_ids", None)
                delta = c.get("delta")
                if self.chat and delta and delta.get("reasoning") is not None:
                    delta["reasoning_content"] = delta["reasoning"]
            if obj.get("usage") and not obj["choices"]:  # the final usage chunk
                obj["usage"]["specexit"] = self.engine._telemetry(obj["id"], self.ids, self.enabled, self.n, self.usage)
            out.append("data: " + to_json(obj).decode())
        return "".join(e + "\n\n" for e in out)


def replica_like_async_llm(engine_kw: dict):
    """vLLM's `AsyncLLM` in this process, started the way a Serve replica starts its engine (the
    benches' direct path, `serve_app/bench.py`, `serve_app/serve_bench_run.py`): the replica's engine
    arguments (on CPU with the `mp` backend Ray Serve LLM passes), then `run_model_in_engine_core`."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.executor.abstract import Executor

    args = AsyncEngineArgs(**engine_kw)
    cfg = args.create_engine_config()
    run_model_in_engine_core(cfg)
    return AsyncLLM(
        vllm_config=cfg,
        executor_class=Executor.get_class(cfg),
        log_requests=args.enable_log_requests,
        log_stats=not args.disable_log_stats,
    )
