"""The decode loop of every evaluated method, over one vLLM `LLM` (one request at a time).

All methods of one engine share the target, the draft and the engine settings; they differ only
in what they send:
  plain     plain engine (no speculation)
  eagle3    EAGLE-3 + SpecExit draft, SpecExit off for the request (`{"specexit": False}`)
  specexit  the same engine, exit on (server defaults, an override, or the calibrated setting)
  specexit_paper    the same, the paper's rule sent with the request (confidence 0.8, progress 0.3,
                    remaining 200, alpha 0.1: `ExitConfig()`), whatever the calibrated defaults are
  specexit_default  the same, always the server defaults (the draft's exit_defaults)
  budget    the same engine, a static thinking budget (`max_think_tokens`, signal exit impossible)
  deer      generate until a transition word; trial answer; exit if its mean probability > threshold
  dynasor   generate `every` tokens; probe; exit when the last `window` probe answers agree
  nothink   the chat template's empty think block (`enable_thinking=False`)
  oracle    the EAGLE-3 trace probed at every paragraph break, then replayed with the budget that
            stops right after the oracle break (the limit any exit at paragraph breaks can reach)
Each returns a `Result`; latency is the wall clock of all its requests, probes included.
`batched` runs one single-request method over many problems in one generate (accuracy only).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipelines.evaluate.rules import count_think_answer, deer_confidence, dynasor_should_exit, oracle_cut
from specexit_core.exit import NEVER_FIRES, ExitConfig
from specexit_core.labels import probe_prompts, step_boundaries


@dataclass
class Out:
    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: str | None
    stop_reason: Any


@dataclass
class Result:
    completion: list[int]
    think_tokens: int
    answer_tokens: int
    latency_s: float = 0.0
    requests: int = 0
    probe_requests: int = 0
    num_drafts: int | None = None
    num_accepted: int | None = None
    info: dict = field(default_factory=dict)


class Gen:
    """One engine, one request at a time; counts requests and vLLM's spec-decode counters."""

    def __init__(self, llm, speculative: bool):
        from vllm import SamplingParams

        self.llm, self.speculative, self._SP = llm, speculative, SamplingParams
        self.requests = 0

    def spec_counters(self) -> tuple[int, int] | None:
        if not self.speculative:
            return None
        m = {x.name: x for x in self.llm.get_metrics()}
        try:
            return int(m["vllm:spec_decode_num_drafts"].value), int(m["vllm:spec_decode_num_accepted_tokens"].value)
        except KeyError:
            return None

    def params(
        self,
        *,
        max_tokens: int,
        temperature: float,
        seed: int | None,
        extra: Any = None,
        stop_ids: list[int] | None = None,
        logprobs: bool = False,
    ):
        kw: dict = dict(max_tokens=max(1, max_tokens), temperature=temperature)
        if temperature > 0 and seed is not None:
            kw["seed"] = seed
        if stop_ids:
            kw["stop_token_ids"] = list(stop_ids)
        if logprobs:
            kw["logprobs"] = 0
        if extra is not None and self.speculative:
            kw["extra_args"] = {"specexit": extra}
        return self._SP(**kw)

    def many(self, prompts: list[list[int]], sp) -> list[Out]:
        """`sp`: one SamplingParams for all prompts, or one per prompt."""
        self.requests += len(prompts)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        res = []
        for o in outs:
            c = o.outputs[0]
            lps = (
                [
                    next(iter(d.values())).logprob if len(d) == 1 else d[t].logprob
                    for t, d in zip(c.token_ids, c.logprobs)
                ]
                if c.logprobs
                else []
            )
            res.append(Out(list(c.token_ids), c.text, lps, c.finish_reason, c.stop_reason))
        return res

    def one(self, prompt: list[int], **kw) -> Out:
        return self.many([prompt], self.params(**kw))[0]


@dataclass
class Ids:
    """Token ids the methods need, from the target's tokenizer and the configs."""

    think_start: int
    think_end: int
    split: tuple[int, ...]
    eos: tuple[int, ...]
    oracle_close: list[int]
    deer_probe: list[int]
    deer_exit: list[int]
    deer_transitions: list[int]
    dynasor_probe: list[int]


def timed(gen: Gen, fn: Callable[[], Result]) -> Result:
    """Run one method for one problem: wall clock, request count and spec counters around it."""
    c0, r0 = gen.spec_counters(), gen.requests
    t0 = time.perf_counter()
    res = fn()
    res.latency_s = time.perf_counter() - t0
    res.requests = gen.requests - r0
    c1 = gen.spec_counters()
    if c0 is not None and c1 is not None:
        res.num_drafts, res.num_accepted = c1[0] - c0[0], c1[1] - c0[1]
    return res


def _counts(ids: Ids, comp: list[int], opened: bool) -> tuple[int, int]:
    return count_think_answer(
        comp, think_end_id=ids.think_end, think_start_id=ids.think_start, prompt_opened_think=opened
    )


def single(gen: Gen, ids: Ids, prompt: list[int], *, opened: bool, extra: Any, **kw) -> Result:
    """plain / eagle3 / specexit / budget / nothink: one request."""
    o = gen.one(prompt, extra=extra, **kw)
    think, ans = _counts(ids, o.token_ids, opened)
    return Result(o.token_ids, think, ans, info={"finish_reason": o.finish_reason})


def _trim_eos(toks: list[int], lps: list[float], eos: tuple[int, ...]) -> tuple[list[int], list[float]]:
    for i, t in enumerate(toks):
        if t in eos:
            return toks[:i], lps[:i]
    return toks, lps


def deer(
    gen: Gen,
    ids: Ids,
    prompt: list[int],
    cfg,
    *,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    grade_probe: Callable[[str], Any] | None = None,
) -> Result:
    """DEER: stop at each transition word inside the think block, ask for a trial answer (greedy,
    `trial_max_tokens`), exit with `exit_text` if its confidence passes; else keep the word, go on."""
    comp: list[int] = []
    probes, confs, k = 0, [], 0
    while len(comp) < max_tokens:
        o = gen.one(
            prompt + comp,
            max_tokens=max_tokens - len(comp),
            temperature=temperature,
            seed=None if seed is None else seed + k,
            extra=False,
            stop_ids=ids.deer_transitions,
        )
        k += 1
        toks = o.token_ids
        stopped_at_word = o.stop_reason in ids.deer_transitions and toks and toks[-1] in ids.deer_transitions
        if ids.think_end in toks:  # thinking ended on its own: finish the answer without probing
            comp += toks
            if stopped_at_word and len(comp) < max_tokens:
                comp += gen.one(
                    prompt + comp,
                    max_tokens=max_tokens - len(comp),
                    temperature=temperature,
                    seed=None if seed is None else seed + k,
                    extra=False,
                ).token_ids
            break
        if not stopped_at_word:
            comp += toks
            break
        before = comp + toks[:-1]
        t = gen.one(
            prompt + before + ids.deer_probe,
            max_tokens=cfg.trial_max_tokens,
            temperature=0.0,
            seed=None,
            extra=False,
            logprobs=True,
        )
        probes += 1
        trial, lps = _trim_eos(t.token_ids, t.logprobs, ids.eos)
        conf = deer_confidence(lps, skip_first=cfg.skip_first, mean=cfg.mean)
        confs.append(round(conf, 4))
        if conf > cfg.threshold:
            comp = before + ids.deer_exit
            think = len(before)
            if len(comp) < max_tokens:
                comp += gen.one(
                    prompt + comp,
                    max_tokens=max_tokens - len(comp),
                    temperature=temperature,
                    seed=None if seed is None else seed + k,
                    extra=False,
                ).token_ids
            return Result(
                comp,
                think,
                len(comp) - think - 1,  # </think> counts as neither
                probe_requests=probes,
                info={"exit": "deer", "exit_index": think, "confidences": confs},
            )
        comp = before + toks[-1:]
    think, ans = _counts(ids, comp, True)
    return Result(comp, think, ans, probe_requests=probes, info={"exit": None, "confidences": confs})


def dynasor(
    gen: Gen,
    ids: Ids,
    prompt: list[int],
    cfg,
    *,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    extract: Callable[[str], str | None],
    decode: Callable[[list[int]], str],
) -> Result:
    """Dynasor-CoT: every `every` think tokens a probe (prefix + probe_text, greedy); exit when the
    last `window` answers agree and do not hedge; the output is then the probed answer."""
    comp: list[int] = []
    answers: list[str | None] = []
    texts: list[str] = []
    k = 0
    while len(comp) < max_tokens:
        o = gen.one(
            prompt + comp,
            max_tokens=min(cfg.every, max_tokens - len(comp)),
            temperature=temperature,
            seed=None if seed is None else seed + k,
            extra=False,
        )
        k += 1
        comp += o.token_ids
        if ids.think_end in o.token_ids or o.finish_reason != "length":
            if ids.think_end in o.token_ids and o.finish_reason == "length" and len(comp) < max_tokens:
                comp += gen.one(
                    prompt + comp,
                    max_tokens=max_tokens - len(comp),
                    temperature=temperature,
                    seed=None if seed is None else seed + k,
                    extra=False,
                ).token_ids
            break
        if len(comp) >= max_tokens:
            break
        p = gen.one(
            prompt + comp + ids.dynasor_probe, max_tokens=cfg.probe_max_tokens, temperature=0.0, seed=None, extra=False
        )
        text = decode(_trim_eos(p.token_ids, [], ids.eos)[0])
        texts.append(text)
        answers.append(extract(text))
        if dynasor_should_exit(answers, texts, window=cfg.window, hedge_words=cfg.hedge_words):
            think = len(comp)
            out = comp + ids.dynasor_probe + p.token_ids
            return Result(
                out,
                think,
                len(out) - think,
                probe_requests=len(texts),
                info={"exit": "dynasor", "exit_index": think, "answers": answers},
            )
    think, ans = _counts(ids, comp, True)
    return Result(comp, think, ans, probe_requests=len(texts), info={"exit": None, "answers": answers})


def oracle_probe(
    gen: Gen,
    ids: Ids,
    prompt: list[int],
    comp: list[int],
    *,
    max_tokens: int,
    grade_text: Callable[[str], bool],
    decode: Callable[[list[int]], str],
) -> dict:
    """Probe every paragraph break of a finished trace (one batched request list, prefix-cached)."""
    if ids.think_end not in comp:
        return {"cut": None, "breaks": [], "flags": [], "think_end": None, "probes": 0}
    end = comp.index(ids.think_end)
    breaks = step_boundaries(comp, ids.split, 0, end)
    prompts = probe_prompts(prompt, comp, breaks, ids.oracle_close)
    outs = (
        gen.many(prompts, gen.params(max_tokens=max_tokens, temperature=0.0, seed=None, extra=False)) if prompts else []
    )
    flags = [bool(grade_text(decode(o.token_ids))) for o in outs]
    cut = oracle_cut(breaks, flags, bool(grade_text(decode(comp))), end)
    return {"cut": cut, "breaks": breaks, "flags": flags, "think_end": end, "probes": len(prompts)}


def batched(gen: Gen, ids: Ids, prompts: list[list[int]], opened: list[bool], params: list) -> list[Result]:
    """One single-request method over many problems in one generate: accuracy and think tokens as
    the engine serves a batch; no latency (timed separately at concurrency 1) and no per-request
    spec-decode counters."""
    outs = gen.many(prompts, params)
    res = []
    for o, op in zip(outs, opened):
        think, ans = _counts(ids, o.token_ids, op)
        res.append(
            Result(
                o.token_ids,
                think,
                ans,
                requests=1,
                info={"finish_reason": o.finish_reason, "timed": False, "batched": True},
            )
        )
    return res


def paper_extra() -> dict:
    """Request overrides for the paper's rule (`ExitConfig()`'s defaults), sent explicitly so the
    draft's calibrated `exit_defaults` do not apply."""
    d = ExitConfig().to_dict()
    return {
        k: d[k]
        for k in ("enabled", "method", "confidence_threshold", "progress_threshold", "remaining_threshold", "alpha")
    }


def budget_extra(n: int) -> dict:
    """Request overrides for a static thinking budget of `n` tokens: only the budget can fire."""
    return {"enabled": True, **NEVER_FIRES, "max_think_tokens": int(n)}
