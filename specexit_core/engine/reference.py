"""The reference engine: transformers target + SpecExit draft, chain speculative decoding, the exit.

Small and sequential on purpose -- it is the correctness oracle the vLLM plugin is tested against
(in the spirit of gpt-fast's `speculative_decode`). Invariants of the loop, per sequence:

* `seq` = prompt + generated tokens. The target has processed `seq[:done]` (its KV cache and the
  fused features `feats[i]` of every processed position); normally `done == len(seq) - 1`: the last
  token (bonus / correction / forced `</think>`) is fed in the next round.
* The draft cache holds draft index i (token seq[i+1], features of i, RoPE position i) for i < done.
* Greedy verification accepts a draft token iff it equals the target's argmax; sampled verification
  accepts with prob min(1, p/q) and resamples from norm(max(p - q, 0)) -- lossless either way.
* The exit tracker sees every committed token in order, with the signals of all earlier positions,
  so its decision depends on the text only, never on how many tokens a round accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specexit_core.draft.model import DraftKV, SpecExitDraft
from specexit_core.engine.types import AcceptanceStats, GenerationRequest, GenerationResult
from specexit_core.engine.verify import verify_greedy, verify_sampled
from specexit_core.exit import ExitConfig, ExitTracker, split_token_ids
from specexit_core.exit.answer_reserve import reported, with_answer_reserve
from specexit_core.exit.policy import prompt_closed_thinking
from specexit_core.signals import activate


@dataclass
class _Seq:
    seq: list[int]
    n_prompt: int
    done: int  # positions processed by the target
    feats: list[torch.Tensor]  # fused aux features of processed positions [3H] each
    cache: object  # target DynamicCache
    dcache: DraftKV
    ddone: int  # draft indices in the draft cache


class ReferenceEngine:
    def __init__(
        self,
        target,
        tokenizer,
        draft: SpecExitDraft | None = None,
        *,
        num_speculative_tokens: int = 3,
        exit_config: ExitConfig | None = None,
        split_ids: frozenset[int] | None = None,
    ):
        self.target, self.tok, self.draft = target.eval(), tokenizer, draft
        self.k = num_speculative_tokens if draft is not None else 0
        self.exit_config = exit_config if exit_config is not None else ExitConfig()
        self.split_ids = split_ids or frozenset(split_token_ids(tokenizer))
        self.think_start_id = tokenizer.convert_tokens_to_ids("<think>")
        self.think_end_id = tokenizer.convert_tokens_to_ids("</think>")
        self.eos_id = tokenizer.eos_token_id
        self.aux_ids = draft.cfg.aux_layer_ids if draft is not None else None

    # -- public --------------------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return [self._generate_one(r) for r in requests]

    # -- target --------------------------------------------------------------------------------
    @torch.inference_mode()
    def _target(self, s: _Seq, new: list[int]) -> torch.Tensor:
        """Feed `new` tokens at positions s.done.. ; returns logits [len(new), V]; records features."""
        from transformers import DynamicCache

        if s.cache is None:
            s.cache = DynamicCache()
        pos = torch.arange(s.done, s.done + len(new))[None]
        out = self.target(
            input_ids=torch.tensor([new]),
            position_ids=pos,
            past_key_values=s.cache,
            use_cache=True,
            output_hidden_states=self.aux_ids is not None,
        )
        if self.aux_ids is not None:
            aux = torch.cat([out.hidden_states[i][0] for i in self.aux_ids], -1).float()
            s.feats.extend(aux.unbind(0))
        return out.logits[0].float()

    def _rollback_target(self, s: _Seq, keep: int) -> None:
        s.cache.crop(keep)
        del s.feats[keep:]
        s.done = keep

    # -- draft ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def _propose(self, s: _Seq, temperature: float, gen: torch.Generator):
        """k draft tokens (target ids) and their draft distributions q [k, V] (None when greedy)."""
        d = self.draft
        idx = list(range(s.ddone, s.done))  # new draft indices: token seq[i+1], features i
        hid, _ = d.fuse(torch.stack([s.feats[i] for i in idx])[None])
        logits, pre, _ = d.forward_cached(
            torch.tensor([[s.seq[i + 1] for i in idx]]), hid, torch.tensor([idx]), s.dcache
        )
        s.ddone = s.done
        toks, qs = [], []
        last_logits, last_pre, pos = logits[0, -1], pre[:, -1:], s.done - 1
        for j in range(self.k):
            tl = d.target_logits(last_logits.float())
            if temperature > 0:
                q = torch.softmax(tl / temperature, -1)
                t = int(torch.multinomial(q, 1, generator=gen))
                qs.append(q)
            else:
                t = int(tl.argmax())
            toks.append(t)
            if j + 1 < self.k:
                pos += 1
                lg, last_pre, _ = d.forward_cached(torch.tensor([[t]]), last_pre, torch.tensor([[pos]]), s.dcache)
                last_logits = lg[0, -1]
        s.dcache.crop(s.ddone)  # speculative entries are recomputed from real features next round
        return toks, (torch.stack(qs) if qs else None)

    # -- the loop ------------------------------------------------------------------------------
    def _generate_one(self, req: GenerationRequest) -> GenerationResult:
        cfg = req.exit if req.exit is not None else self.exit_config
        use_exit = self.draft is not None and bool(self.draft.cfg.signals) and cfg.enabled
        use_exit = use_exit and not prompt_closed_thinking(req.prompt_ids, self.think_start_id, self.think_end_id)
        cfg, reserve = with_answer_reserve(cfg, req.max_tokens)  # as the vLLM hook: answer_reserve.py
        tracker = (
            ExitTracker(
                cfg,
                split_token_ids=self.split_ids,
                think_start_id=self.think_start_id,
                think_end_id=self.think_end_id,
                in_think=True,
            )
            if use_exit
            else None
        )
        gen = torch.Generator().manual_seed(req.seed)
        s = _Seq(
            seq=list(req.prompt_ids),
            n_prompt=len(req.prompt_ids),
            done=0,
            feats=[],
            cache=None,
            dcache=DraftKV(),
            ddone=0,
        )
        stats = AcceptanceStats()
        signals: list[tuple[float, float, float]] = []
        decision = None
        finish = "length"

        logits = self._target(s, s.seq)  # prefill
        s.done = len(s.seq)
        new = [self._sample(logits[-1], req.temperature, gen)]
        while True:
            # commit `new` one token at a time through the exit policy
            committed = []
            for t in new:
                self._add_signals(s, tracker, signals)
                committed.append(t)
                if tracker is not None and decision is None:
                    dec = tracker.append(t)
                    if dec is not None:
                        decision = reported(dec, reserve)
                        committed.append(self.think_end_id)  # keep through the split token, force </think>
                        break
                if t == self.eos_id:
                    break
            s.seq.extend(committed)
            gen_len = len(s.seq) - s.n_prompt
            if self.eos_id in committed:
                s.seq = s.seq[: s.seq.index(self.eos_id, s.n_prompt)]
                finish = "stop"
                break
            if gen_len >= req.max_tokens:
                s.seq = s.seq[: s.n_prompt + req.max_tokens]
                break
            if s.done > len(s.seq) - 1:  # an exit cut tokens the target already processed
                self._rollback_target(s, len(s.seq) - 1)
                s.ddone = min(s.ddone, s.done)
                s.dcache.crop(s.ddone)
                del signals[max(0, s.done - s.n_prompt) :]  # signals of discarded positions
            new = self._round(s, req, gen, stats)

        out = s.seq[s.n_prompt :]
        think = out.index(self.think_end_id) if self.think_end_id in out else len(out)
        return GenerationResult(
            token_ids=out,
            text=self.tok.decode(out),
            think_tokens=think,
            exit=decision,
            stats=stats,
            signals=signals,
            finish_reason=finish,
        )

    def _round(self, s: _Seq, req: GenerationRequest, gen, stats: AcceptanceStats) -> list[int]:
        """One target forward: verify drafts (if any) and return the newly decided tokens."""
        pending = s.seq[s.done :]  # usually just the last token; two after a forced </think>
        drafts, q = ([], None)
        if self.k and len(pending) == 1:
            drafts, q = self._propose(s, req.temperature, gen)
        start = s.done
        logits = self._target(s, pending + drafts)
        s.done = start + len(pending) + len(drafts)
        base = len(pending) - 1  # logits[base + j] verifies drafts[j]
        stats.rounds += 1
        stats.drafted += len(drafts)
        rows = logits[base : base + len(drafts) + 1]
        if req.temperature > 0:
            new = verify_sampled(torch.softmax(rows / req.temperature, -1), q, drafts, gen)
        else:
            new = verify_greedy(rows, drafts)
        n_acc = len(new) - 1
        stats.accepted += n_acc
        self._rollback_target(s, start + len(pending) + n_acc)  # drop rejected drafts' cache + features
        return new

    def _sample(self, logits: torch.Tensor, temperature: float, gen) -> int:
        if temperature > 0:
            return int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen))
        return int(logits.argmax())

    @torch.inference_mode()
    def _add_signals(self, s: _Seq, tracker, signals) -> None:
        """Feed the tracker the signals of every processed generated position not yet fed."""
        if self.draft is None or not self.draft.cfg.signals:
            return
        start = s.n_prompt + len(signals)
        if start >= s.done:
            return
        _, raw = self.draft.fuse(torch.stack(s.feats[start : s.done]))
        for v in activate(raw).tolist():
            signals.append(tuple(v))
            if tracker is not None:
                tracker.add_signal(v)
