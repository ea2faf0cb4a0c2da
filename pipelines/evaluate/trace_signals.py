"""Per-token SpecExit signals along a trace, computed once (transformers target + the draft's `fc` rows).

The exit decision depends only on the tokens and their signals (`specexit_core.exit.policy`'s
determinism contract), so signals computed once per EAGLE-3 trace let calibration replay any
threshold setting offline, and the report plot the signals along a trace. Same math as the vLLM
hook: the target's aux hidden states of each completion position -> the draft's three signal rows
of `fc` -> sigmoid, sigmoid, expm1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class SignalModel:
    def __init__(self, target_dir: str, draft_dir: str, threads: int | None = None):
        from transformers import AutoModelForCausalLM

        from specexit_core.draft.checkpoint import load_draft

        if threads:
            torch.set_num_threads(threads)
        self.target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
        emb = self.target.get_input_embeddings().weight.detach().float()
        self.draft = load_draft(draft_dir, target_embed=emb)
        if not self.draft.cfg.signals:
            raise ValueError(f"{draft_dir} is a stock EAGLE-3 draft (no signal rows): nothing to compute")
        self.aux = tuple(self.draft.cfg.aux_layer_ids)

    @torch.no_grad()
    def signals(self, prompt: Sequence[int], completion: Sequence[int]) -> list[tuple[float, float, float]]:
        """One (confidence, progress, remaining) per completion token."""
        from specexit_core.signals import activate
        from specexit_core.training.features import target_features

        if not completion:
            return []
        ids = torch.tensor([list(prompt) + list(completion)])
        aux, _ = target_features(self.target, ids, torch.ones_like(ids), self.aux)
        _, raw = self.draft.fuse(aux[0, len(prompt) :])
        return [tuple(float(x) for x in r) for r in activate(raw).tolist()]
