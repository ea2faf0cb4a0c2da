"""The benchmarks behind `specexit bench vllm | reference | hook | kv | longgen` (and the TokenSwift demo,
`python -m specexit_app.bench.longgen_demo`): every method in one run on the same engine build, reported as
ratios.

Applications, not library: a benchmark composes the whole core (the vLLM plugin, the reference and long-generation
engines, the KV connector) with the built-in toy and teachers and prints the figures, so it sits in the app layer
beside the command that runs it, and may import vLLM freely. The library (`specexit_core`, `pipelines`,
`serve_app`) never imports it (an import-linter contract in pyproject.toml). What a library module also needs stays
in the core: the stat logger on one vLLM engine (`specexit_core/vllm_stats.py`, read by serve_app's cache metrics)
and the heads' self-distillation (`specexit_core/longgen/self_distill.py`).
"""
