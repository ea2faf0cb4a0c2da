"""Tiered KV-block cache for vLLM: prefix-block keys, a host-memory + directory block store, and the
vLLM KV connector that loads matched prefix blocks instead of recomputing them (docs/kv-cache.md)."""
