"""The vLLM KV connector (work in progress; see docs/kv-cache.md)."""

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

__all__ = ["KVConnectorBase_V1"]
