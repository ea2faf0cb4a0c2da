"""The connector's settings (`kv_connector_extra_config`) and the one `kv_transfer_config` that enables it.

Everything that names the connector for vLLM lives here, so tests, docs and Serve configs cannot
drift apart: `kv_transfer_config(directory=...)` returns the dict to pass as `LLM(kv_transfer_config=...)`,
`--kv-transfer-config` or Serve's `engine_kwargs.kv_transfer_config`.
"""

from __future__ import annotations

from pydantic import Field

from specexit_core.typed_config import StrictModel

CONNECTOR_NAME = "TieredKVConnector"
CONNECTOR_MODULE = "specexit_core.kv_cache.connector"


class KVCacheSettings(StrictModel):
    """`kv_connector_extra_config` of the tiered connector (unknown keys are errors)."""

    directory: str | None = None  # directory tier root (local disk or shared FS); None: host tier only
    host_bytes: int = Field(1 << 30, ge=0)  # host-memory tier budget per worker, bytes
    write_queue_blocks: int = Field(256, ge=1)  # directory writes waiting at most; more are dropped
    fsync: bool = False  # fsync each block file before publishing it (slower; survives power loss)
    # also store full blocks of generated tokens once committed: a request preempted to free KV blocks
    # reloads prompt and output from the tiers when it resumes instead of recomputing them
    save_generated: bool = False
    stats_dir: str | None = None  # when set, the scheduler-side connector keeps <stats_dir>/kv-stats-<pid>.json
    model_identity: str | None = None  # overrides the model fingerprint in block keys


def kv_transfer_config(directory: str | None, **settings) -> dict:
    """The vLLM `kv_transfer_config` that loads the tiered connector. Load failures must be recomputed
    (vLLM's default policy fails the request), so the policy is part of the config."""
    extra = KVCacheSettings(directory=directory, **settings).model_dump(exclude_defaults=True)
    return {
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": extra,
    }
