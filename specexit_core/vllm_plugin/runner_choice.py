"""Which vLLM model runner an engine gets: V1 for engines serving a SpecExit draft, vLLM's own
choice for every other engine.

The exit hook lives in the V1 runner (`runner_hook.py`); vLLM 0.32 on CUDA defaults to the V2
runner (`VllmConfig.use_v2_model_runner`, a property read wherever vLLM picks a runner class or a
V1/V2-only code path). We wrap that property, so the choice is made per engine from its own
config: a speculative draft whose `architectures` name the SpecExit drafter pins V1 (with a
warning saying why); any other engine, in the same process or not, is untouched. An explicit
`VLLM_USE_V2_MODEL_RUNNER=1` with a SpecExit draft is a start-up error, never a silent no-op.
See docs/dev/vllm-0.32-internals.md ("V2 runner") for why V2 is not hooked yet.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from pathlib import Path

from specexit_core.draft.config import SPECEXIT_ARCHES, read_specexit_fields

log = logging.getLogger("specexit.vllm")


@lru_cache(maxsize=64)
def _specexit_on_disk(model: str) -> bool:
    try:
        d = json.loads((Path(model) / "config.json").read_text())
        return bool(SPECEXIT_ARCHES & set(d.get("architectures") or ())) or bool(read_specexit_fields(d).signals)
    except (OSError, ValueError, AttributeError):
        return False  # a hub id or an unreadable folder: vLLM's loaded hf_config decides


def is_specexit_draft(speculative_config) -> bool:
    """Whether an engine's speculative model is a SpecExit draft (from its loaded HF config, or
    the draft folder's config.json, in either layout)."""
    if speculative_config is None:
        return False
    dmc = getattr(speculative_config, "draft_model_config", None)
    archs = set(getattr(getattr(dmc, "hf_config", None), "architectures", None) or ())
    if archs:
        return bool(SPECEXIT_ARCHES & archs)
    model = getattr(speculative_config, "model", None)
    return bool(model) and _specexit_on_disk(str(model))


def wants_v1(speculative_config, env_choice: bool | None) -> bool | None:
    """The runner decision: False/True from vLLM's own rules (None: let vLLM decide), or False
    (V1) for a SpecExit engine. `env_choice` is `envs.VLLM_USE_V2_MODEL_RUNNER`."""
    if not is_specexit_draft(speculative_config):
        return None
    if env_choice:
        raise RuntimeError(
            "specexit: this engine serves a SpecExit draft, whose exit hook runs in vLLM's V1 "
            "model runner only; unset VLLM_USE_V2_MODEL_RUNNER or set it to 0"
        )
    return True


def install_runner_choice() -> None:
    from vllm import envs
    from vllm.config import VllmConfig

    prop = VllmConfig.__dict__.get("use_v2_model_runner")
    if not isinstance(prop, property) or getattr(prop.fget, "_specexit", False):
        return
    warned: set[int] = set()

    def use_v2_model_runner(self) -> bool:
        if wants_v1(getattr(self, "speculative_config", None), envs.VLLM_USE_V2_MODEL_RUNNER):
            if id(self) not in warned:
                warned.add(id(self))
                log.warning(
                    "specexit: SpecExit draft loaded: using vLLM's V1 model runner (the exit hook "
                    "is not in the V2 runner yet); engines without a SpecExit draft are unaffected"
                )
            return False
        return prop.fget(self)

    use_v2_model_runner._specexit = True
    VllmConfig.use_v2_model_runner = property(use_v2_model_runner, doc=prop.__doc__)
