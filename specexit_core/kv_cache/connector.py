"""`TieredKVConnector`: the vLLM (0.32, V1 API) KV connector over the tiered block store.

Loaded by vLLM from `kv_transfer_config` (see `settings.kv_transfer_config`); one instance runs in
the scheduler, one in each worker.

- Scheduler side: keys each prompt's full blocks (`block_keys`; with `save_generated`, committed
  generated blocks too, for preempted requests), reports how many further tokens the tiers hold
  (host tier: the keys workers report holding; directory tier: the block files
  exist for every model shard), and tells workers which blocks to load and which to save
  (`request_plan`).
- Worker side: loads are synchronous, before the forward that reads them; a block that cannot be
  read (missing, truncated, corrupt, wrong shape) ends that request's load and is reported through
  `get_block_ids_with_load_errors`, so vLLM recomputes from it (`kv_load_failure_policy:
  recompute`). Saves copy the filled blocks to host memory after the forward (`wait_for_save`) and
  leave the file writes to the store's background writer.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from specexit_core.kv_cache.block_copy import BlockLayout
from specexit_core.kv_cache.block_keys import model_fingerprint, namespace
from specexit_core.kv_cache.block_store import DIRECTORY, HOST, TieredBlockStore
from specexit_core.kv_cache.directory_tier import DirectoryTier
from specexit_core.kv_cache.host_tier import HostTier
from specexit_core.kv_cache.request_plan import RequestPlanner
from specexit_core.kv_cache.settings import KVCacheSettings

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

STATS_FILE = "kv-stats-{pid}.json"


@dataclass
class TieredKVMetadata(KVConnectorMetadata):
    loads: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # req id -> [(block id, key)]
    saves: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class TieredWorkerMetadata(KVConnectorWorkerMetadata):
    added: list[str] = field(default_factory=list)  # keys now in a worker's host tier
    evicted: list[str] = field(default_factory=list)  # keys it dropped
    stats: dict[str, Any] = field(default_factory=dict)  # the store's counters (summed over workers)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, TieredWorkerMetadata)
        stats = dict(self.stats)
        for k, v in other.stats.items():
            stats[k] = (stats.get(k, 0) or v) if isinstance(v, bool) else stats.get(k, 0) + v
        return TieredWorkerMetadata(self.added + other.added, self.evicted + other.evicted, stats)


def _shards(vllm_config: VllmConfig) -> tuple[str, ...]:
    pc = vllm_config.parallel_config
    return tuple(f"tp{t}-pp{p}" for p in range(pc.pipeline_parallel_size) for t in range(pc.tensor_parallel_size))


def _this_shard() -> str:
    from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

    try:
        return f"tp{get_tensor_model_parallel_rank()}-pp{get_pp_group().rank_in_group}"
    except (AssertionError, AttributeError, RuntimeError):  # no distributed state: one shard
        return "tp0-pp0"


def _identity(vllm_config: VllmConfig, settings: KVCacheSettings, block_size: int) -> dict:
    """What a block's KV depends on besides its tokens: the model and how its KV is laid out."""
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    return {
        "format": 1,
        "model": settings.model_identity or model_fingerprint(mc.model),
        "revision": mc.revision,
        "dtype": str(mc.dtype),
        "kv_cache_dtype": cc.cache_dtype,
        "block_size": block_size,
        "tp": pc.tensor_parallel_size,
        "pp": pc.pipeline_parallel_size,
    }


class TieredKVConnector(KVConnectorBase_V1):
    # a dropped save is only a future miss: nothing must be delivered
    @property
    def requires_kv_delivery(self) -> bool:
        return False

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = self._kv_transfer_config
        self.settings = KVCacheSettings.model_validate(ktc.kv_connector_extra_config or {})
        if ktc.kv_load_failure_policy != "recompute":
            raise ValueError(
                f"{type(self).__name__} needs kv_load_failure_policy='recompute' (a bad block file is "
                "recomputed, not a failed request); use specexit_core.kv_cache.settings.kv_transfer_config()"
            )
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise ValueError(f"{type(self).__name__} supports one KV cache group (uniform attention layers)")
        self.block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        self.namespace = ns = namespace(_identity(vllm_config, self.settings, self.block_size))
        directory = self.settings.directory
        if role == KVConnectorRole.SCHEDULER:
            spec = vllm_config.speculative_config
            self.planner = RequestPlanner(
                ns, self.block_size, bool(spec and spec.use_eagle_block_drop()), self.settings.save_generated
            )
            self.directory = DirectoryTier(directory) if directory else None
            self.shards = _shards(vllm_config)
            self.host_index: set[str] = set()
            self.sched_stats = {
                "requests": 0,  # requests allocated with the connector consulted (first time)
                "prompt_blocks": 0,  # their prompts' full blocks
                "resumed_requests": 0,  # preempted requests allocated again
                "resumed_blocks_loaded": 0,  # blocks they took from the tiers instead of recomputing
                "matched_blocks_host": 0,  # blocks vLLM took from the host tier
                "matched_blocks_directory": 0,  # ... from the directory tier
                "load_blocks": 0,  # blocks sent to workers to load
                "save_blocks": 0,  # blocks sent to workers to save
            }
            self.worker_stats: dict[str, Any] = {}
        else:
            shard = _this_shard()
            dir_tier = DirectoryTier(directory, shard, self.settings.fsync) if directory else None
            self.store = TieredBlockStore(
                HostTier(self.settings.host_bytes), dir_tier, self.settings.write_queue_blocks
            )
            self.layout: BlockLayout | None = None
            self.num_blocks = kv_cache_config.num_blocks
            self._invalid: set[int] = set()
            self._added: list[str] = []
            self._evicted: list[str] = []
            self._load_failures = 0
            self._dirty = False

    # ============================== worker side ==============================
    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self.layout = BlockLayout(kv_caches, self.num_blocks)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, TieredKVMetadata)
        for items in meta.loads.values():
            failed = False
            for block_id, key in items:
                got = None if failed or self.layout is None else self.store.get(key)
                if got is None or not self.layout.fits(got[0]):
                    # this block and the rest of the request's load are recomputed by vLLM
                    failed = True
                    self._invalid.add(block_id)
                    continue
                block, tier = got
                self.layout.scatter(block_id, block)
                if tier == DIRECTORY:
                    self._added.append(key)  # promoted to the host tier by the store
            if failed:
                self._load_failures += 1
            self._dirty = self._dirty or bool(items)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are synchronous in start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return  # saved once per step, every layer at once, in wait_for_save

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, TieredKVMetadata) or not meta.saves or self.layout is None:
            return
        for block_id, key in meta.saves:
            self._evicted.extend(self.store.put(key, self.layout.gather(block_id)))
            self._added.append(key)
        self._dirty = True

    def get_block_ids_with_load_errors(self) -> set[int]:
        bad, self._invalid = self._invalid, set()
        return bad

    def build_connector_worker_meta(self) -> TieredWorkerMetadata | None:
        if not self._dirty:
            return None
        stats = self.store.stats.as_dict() | {"load_failures": self._load_failures}
        meta = TieredWorkerMetadata(self._added, self._evicted, stats)
        self._added, self._evicted, self._dirty = [], [], False
        return meta

    def shutdown(self) -> None:
        if self._role == KVConnectorRole.WORKER:
            self.store.close()

    # ============================== scheduler side ==============================
    def _locate(self, key: str) -> str | None:
        if key in self.host_index:
            return HOST
        if self.directory is not None and self.directory.contains(key, self.shards):
            return DIRECTORY
        return None

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        rid = request.request_id
        if request.lora_request or request.mm_features or request.prompt_embeds is not None:
            self.planner.untracked(rid)
            return 0, False
        prompt = request.prompt_token_ids or []
        # all_token_ids: the live list the scheduler extends with accepted tokens (used with save_generated)
        self.planner.track(rid, prompt, request.cache_salt, request.all_token_ids)
        n = self.planner.num_tokens(rid, len(prompt))
        return self.planner.match(rid, n, num_computed_tokens, self._locate), False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        rid = request.request_id
        self.planner.after_alloc(rid, blocks.get_block_ids()[0], num_external_tokens)
        s = self.sched_stats
        tiers = self.planner.matched_tiers(rid, num_external_tokens)
        if request.num_preemptions:  # a resume: its prompt was counted the first time
            s["resumed_requests"] += 1
            s["resumed_blocks_loaded"] += len(tiers)
            return
        s["requests"] += 1
        s["prompt_blocks"] += len(request.prompt_token_ids or []) // self.block_size
        for tier in tiers:
            s[f"matched_blocks_{tier}"] += 1

    def get_external_cache_hit_sources(self, request: Request, num_external_tokens: int) -> dict[CacheHitSource, int]:
        tiers = self.planner.matched_tiers(request.request_id, num_external_tokens)
        counts = {
            CacheHitSource.HOST: tiers.count(HOST) * self.block_size,
            CacheHitSource.DISK: tiers.count(DIRECTORY) * self.block_size,
        }
        return {k: v for k, v in counts.items() if v}

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        so = scheduler_output
        new = [(r.req_id, r.block_ids[0], r.num_computed_tokens) for r in so.scheduled_new_reqs]
        c = so.scheduled_cached_reqs
        cached = [
            (rid, None if ids is None else ids[0], rid in c.resumed_req_ids, n)
            for rid, ids, n in zip(c.req_ids, c.new_block_ids, c.num_computed_tokens)
        ]
        plan = self.planner.step(new, cached, so.num_scheduled_tokens, self._locate)
        self.sched_stats["load_blocks"] += sum(len(v) for v in plan.loads.values())
        self.sched_stats["save_blocks"] += len(plan.saves)
        return TieredKVMetadata(loads=plan.loads, saves=plan.saves)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, TieredWorkerMetadata):
            self.host_index.update(meta.added)
            self.host_index.difference_update(meta.evicted)
            self.worker_stats = meta.stats
            self._write_stats()

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self.planner.finish(request.request_id)
        self._write_stats()
        return False, None

    def stats(self) -> dict[str, Any]:
        """The connector's own counters: the scheduler's and the workers' (latest report)."""
        return {"namespace": self.namespace, "scheduler": dict(self.sched_stats), "worker": dict(self.worker_stats)}

    def _write_stats(self) -> None:
        if not self.settings.stats_dir:
            return
        path = Path(self.settings.stats_dir) / STATS_FILE.format(pid=os.getpid())
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.stats()))
            os.replace(tmp, path)
        except OSError as e:  # stats are best-effort, like the cache
            log.debug("KV stats not written: %s", e)
