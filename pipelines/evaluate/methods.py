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
`batched` runs one single-request method over many problems in one generate (accuracy only);
`budget_replay` takes a greedy budget's output from the EAGLE-3 greedy trace (the sweep's curve).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
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
    oracle: dict | None = None  # oracle rows: the probed breaks and their outcomes


class Gen:
    """One engine, one request at a time; counts requests and vLLM's spec-decode counters."""

    def __init__(self, llm, speculative: bool, top_p: float = 1.0, top_k: int = 0):
        from vllm import SamplingParams

        self.llm, self.speculative, self._SP = llm, speculative, SamplingParams
        self.top_p, self.top_k = top_p, top_k  # the run's sampling profile, for every sampled request
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
        if temperature > 0 and self.top_p < 1.0:
            kw["top_p"] = self.top_p
        if temperature > 0 and self.top_k > 0:
            kw["top_k"] = self.top_k
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


@dataclass
class Req:
    """One engine request a multi-request method asks for: the prompt and `Gen.params` keywords."""

    prompt: list[int]
    kw: dict


# A multi-request method (DEER, Dynasor) is a generator: it yields a `Req` (or a list of them, sent
# together, as Dynasor's probe and its next chunk are), receives the `Out` (or the list of them), and
# returns its `Result`. `drive` runs one problem (latency at concurrency 1); `drive_lockstep` runs many
# problems together, one batched generate per round (accuracy only, like `batched`).
Method = Generator["Req | list[Req]", "Out | list[Out]", Result]


def _send(gen: Gen, reqs: list[Req]) -> list[Out]:
    return gen.many([r.prompt for r in reqs], [gen.params(**r.kw) for r in reqs])


def drive(gen: Gen, method: Method) -> Result:
    """Run one problem's requests: one generate per yield."""
    try:
        req = next(method)
        while True:
            outs = _send(gen, req if isinstance(req, list) else [req])
            req = method.send(outs if isinstance(req, list) else outs[0])
    except StopIteration as stop:
        return stop.value


def drive_lockstep(gen: Gen, methods: list[Method]) -> list[Result]:
    """Run many problems' methods together: each round, every unfinished method's next request(s) go
    into one generate. Same requests, same seeds as `drive`: only the batching differs."""
    results: list[Result | None] = [None] * len(methods)
    pending: dict[int, Req | list[Req]] = {}
    counts = [0] * len(methods)

    def step(i: int, out) -> None:
        try:
            pending[i] = next(methods[i]) if out is None else methods[i].send(out)
            counts[i] += len(pending[i]) if isinstance(pending[i], list) else 1
        except StopIteration as stop:
            pending.pop(i, None)
            results[i] = stop.value
            results[i].requests = counts[i]

    for i in range(len(methods)):
        step(i, None)
    while pending:
        order = sorted(pending)
        flat = [(i, r) for i in order for r in (pending[i] if isinstance(pending[i], list) else [pending[i]])]
        outs = _send(gen, [r for _, r in flat])
        for i in order:
            mine = [o for (j, _), o in zip(flat, outs) if j == i]
            step(i, mine if isinstance(pending[i], list) else mine[0])
    return [r for r in results if r is not None]


def deer(
    ids: Ids,
    prompt: list[int],
    cfg,
    *,
    max_tokens: int,
    temperature: float,
    seed: int | None,
) -> Method:
    """DEER: stop at each transition word inside the think block, ask for a trial answer (greedy,
    `trial_max_tokens`), exit with `exit_text` if its confidence passes; else keep the word, go on."""
    comp: list[int] = []
    probes, confs, k = 0, [], 0

    def cont(n: int) -> Req:  # the next stretch of the method's own sampled text
        return Req(
            prompt + comp,
            dict(max_tokens=n, temperature=temperature, seed=None if seed is None else seed + k, extra=False),
        )

    while len(comp) < max_tokens:
        r = cont(max_tokens - len(comp))
        r.kw["stop_ids"] = ids.deer_transitions
        o = yield r
        k += 1
        toks = o.token_ids
        stopped_at_word = o.stop_reason in ids.deer_transitions and toks and toks[-1] in ids.deer_transitions
        if ids.think_end in toks:  # thinking ended on its own: finish the answer without probing
            comp += toks
            if stopped_at_word and len(comp) < max_tokens:
                comp += (yield cont(max_tokens - len(comp))).token_ids
            break
        if not stopped_at_word:
            comp += toks
            break
        before = comp + toks[:-1]
        t = yield Req(
            prompt + before + ids.deer_probe,
            dict(max_tokens=cfg.trial_max_tokens, temperature=0.0, seed=None, extra=False, logprobs=True),
        )
        probes += 1
        trial, lps = _trim_eos(t.token_ids, t.logprobs, ids.eos)
        conf = deer_confidence(lps, skip_first=cfg.skip_first, mean=cfg.mean)
        confs.append(round(conf, 4))
        if conf > cfg.threshold:
            comp = before + ids.deer_exit
            think = len(before)
            if len(comp) < max_tokens:
                comp += (yield cont(max_tokens - len(comp))).token_ids
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
    ids: Ids,
    prompt: list[int],
    cfg,
    *,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    extract: Callable[[str], str | None],
    decode: Callable[[list[int]], str],
) -> Method:
    """Dynasor-CoT: every `every` think tokens a probe (prefix + probe_text, greedy), sent together
    with the next chunk; exit when the last `window` answers agree and do not hedge; the output is
    then the probed answer."""
    comp: list[int] = []
    answers: list[str | None] = []
    texts: list[str] = []
    k = 0

    def cont(n: int) -> Req:
        return Req(
            prompt + comp,
            dict(max_tokens=n, temperature=temperature, seed=None if seed is None else seed + k, extra=False),
        )

    o = yield cont(min(cfg.every, max_tokens))
    while True:
        k += 1
        comp += o.token_ids
        if ids.think_end in o.token_ids or o.finish_reason != "length":
            if ids.think_end in o.token_ids and o.finish_reason == "length" and len(comp) < max_tokens:
                comp += (yield cont(max_tokens - len(comp))).token_ids
            break
        if len(comp) >= max_tokens:
            break
        # the probe at this point and the next chunk go together (as the reference implementation
        # sends them): a round costs the longer of the two, not their sum; on exit the chunk is dropped
        probe = Req(
            prompt + comp + ids.dynasor_probe,
            dict(max_tokens=cfg.probe_max_tokens, temperature=0.0, seed=None, extra=False),
        )
        p, o = yield [probe, cont(min(cfg.every, max_tokens - len(comp)))]
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
    ids: Ids,
    prompt: list[int],
    comp: list[int],
    *,
    max_tokens: int,
    grade_text: Callable[[str], bool],
    decode: Callable[[list[int]], str],
    extract: Callable[[str], str | None] | None = None,
) -> Generator[list[Req], list[Out], dict]:
    """Probe every paragraph break of a finished trace (one batched request list, prefix-cached).
    With `extract` (the grader's answer extractor) also each probe's answer and the answer the trace
    reaches at its natural end: the gold-free disagreement loss of calibration compares the two."""
    if ids.think_end not in comp:  # unfinished: no break probed; its answer is what it wrote
        out = {"cut": None, "breaks": [], "flags": [], "think_end": None, "probes": 0, "answers": None}
        if extract is not None:
            out.update(answers=[], final_answer=extract(decode(comp)))
        return out
    end = comp.index(ids.think_end)
    breaks = step_boundaries(comp, ids.split, 0, end)
    prompts = probe_prompts(prompt, comp, breaks, ids.oracle_close)
    kw = dict(max_tokens=max_tokens, temperature=0.0, seed=None, extra=False)
    outs = (yield [Req(p, kw) for p in prompts]) if prompts else []
    texts = [decode(o.token_ids) for o in outs]
    flags = [bool(grade_text(t)) for t in texts]
    full = decode(comp)
    cut = oracle_cut(breaks, flags, bool(grade_text(full)), end)
    out = {"cut": cut, "breaks": breaks, "flags": flags, "think_end": end, "probes": len(prompts), "answers": None}
    if extract is not None:
        out.update(answers=[extract(t) for t in texts], final_answer=extract(full))
    return out


def oracle_replay(ids: Ids, prompt: list[int], eagle: Result, pr: dict, common: dict) -> Method:
    """The oracle's own run: the request replayed with the budget that stops right after the oracle
    break; the EAGLE-3 trace itself when no earlier break qualifies (or it is wrong or unfinished)."""
    cut, end = pr["cut"], pr["think_end"]
    if cut is not None and end is not None and cut < end:
        o = yield Req(prompt, dict(extra=budget_extra(cut), **common))
        think, ans = _counts(ids, o.token_ids, True)
        res = Result(o.token_ids, think, ans, info={"finish_reason": o.finish_reason, "replayed": True})
    else:
        res = Result(
            list(eagle.completion),
            eagle.think_tokens,
            eagle.answer_tokens,
            latency_s=eagle.latency_s,
            requests=1,
            num_drafts=eagle.num_drafts,
            num_accepted=eagle.num_accepted,
            info={"replayed": False},
        )
    res.probe_requests = pr["probes"]
    res.info.update(
        cut=cut,
        think_end=end,
        prefix_matches=list(res.completion[: res.think_tokens]) == list(eagle.completion[: res.think_tokens]),
    )
    if pr.get("answers") is not None:  # per break, as `boundaries`: what calibration's disagreement loss reads
        res.info.update(probe_answers=pr["answers"], final_answer=pr["final_answer"])
    res.oracle = pr
    return res


def budget_replay(ids: Ids, prompt: list[int], eagle: Result, budget: int, *, opened: bool, max_tokens: int) -> Method:
    """A static budget at greedy, from the EAGLE-3 greedy trace: a greedy budget run follows that
    very trace until it has `budget` think tokens, where the engine's `max_think_tokens` forces
    `</think>`. A trace that thinks <= `budget` tokens is the budget's output as it is (no request);
    a longer one keeps its first `budget` think tokens, closes the block, and the answer is generated
    greedily (one request, its prefix cached)."""
    comp = list(eagle.completion)
    info = {"replayed": "eagle3 greedy trace", "timed": False, "batched": True}
    if eagle.think_tokens <= budget:
        return Result(comp, eagle.think_tokens, eagle.answer_tokens, requests=0, info=info)
        yield  # a generator that sends nothing
    start = 0 if opened else comp.index(ids.think_start) + 1
    prefix = comp[: start + budget] + [ids.think_end]
    out: list[int] = []
    if len(prefix) < max_tokens:
        o = yield Req(
            prompt + prefix, dict(max_tokens=max_tokens - len(prefix), temperature=0.0, seed=None, extra=False)
        )
        out, info["finish_reason"] = list(o.token_ids), o.finish_reason
    completion = (prefix + out)[:max_tokens]
    think, ans = _counts(ids, completion, opened)
    return Result(completion, think, ans, requests=int(len(prefix) < max_tokens), info=info)


def oracle(
    ids: Ids,
    prompt: list[int],
    eagle: Result,
    *,
    probe_max_tokens: int,
    grade_text: Callable[[str], bool],
    decode: Callable[[list[int]], str],
    common: dict,
    peers: dict | None = None,
    extract: Callable[[str], str | None] | None = None,
) -> Method:
    """The whole oracle on one problem as requests (for the lockstep driver): the break probes, with
    `peers` (`peer_points` keywords) the DEER / Dynasor / budget candidates, then the replay."""
    pr = yield from oracle_probe(
        ids,
        prompt,
        eagle.completion,
        max_tokens=probe_max_tokens,
        grade_text=grade_text,
        decode=decode,
        extract=extract,
    )
    points = {}
    if peers:
        points = yield from peer_points(ids, prompt, eagle.completion, grade_text=grade_text, decode=decode, **peers)
    res = yield from oracle_replay(ids, prompt, eagle, pr, common)
    res.info.update(points)
    return res


def peer_points(
    ids: Ids,
    prompt: list[int],
    comp: list[int],
    *,
    deer_cfg,
    dynasor_cfg,
    stride: int,
    budgets: list[int],
    answer_max_tokens: int,
    grade_text: Callable[[str], bool],
    extract: Callable[[str], str | None],
    decode: Callable[[list[int]], str],
) -> Generator[list[Req], list[Out], dict]:
    """Every exit candidate of DEER and Dynasor along one finished greedy trace, probed once (two
    batched generates, prefix-cached), so that calibration can replay any threshold / interval /
    window: at greedy, both methods follow this very trace until they exit.

    deer_points: [index, arithmetic confidence, geometric confidence, forced answer right] at each
      transition word inside the think block (index = think tokens kept = the word's position);
    dynasor_points: [index, probe answer, probe text, probe answer right] at every `stride`-th think
      token up to the end of thinking (the probed answer is Dynasor's output when it exits there);
    budget_points: [budget, answer right] for each budget below the trace's think tokens: `</think>`
      forced after that many think tokens, then the answer (what the engine's `max_think_tokens` does)."""
    if ids.think_end not in comp:
        return {"deer_points": [], "dynasor_points": [], "budget_points": []}
    end = comp.index(ids.think_end)
    words = [i for i in range(end) if comp[i] in ids.deer_transitions]
    pos = list(range(0, end + 1, stride))  # 0: before any thinking (the reference implementation probes there)
    reqs: list[tuple[list[int], dict]] = []
    for i in words:
        reqs.append((prompt + comp[:i] + ids.deer_probe, dict(max_tokens=deer_cfg.trial_max_tokens, logprobs=True)))
        reqs.append((prompt + comp[:i] + ids.deer_exit, dict(max_tokens=answer_max_tokens)))
    for p in pos:
        reqs.append((prompt + comp[:p] + ids.dynasor_probe, dict(max_tokens=dynasor_cfg.probe_max_tokens)))
    cut = sorted(b for b in set(budgets) if b < end)
    for b in cut:  # the answer starts after `</think>` alone: a few more tokens than a forced probe's
        reqs.append((prompt + comp[:b] + [ids.think_end], dict(max_tokens=answer_max_tokens + 4)))
    outs = yield [Req(r[0], dict(temperature=0.0, seed=None, extra=False, **r[1])) for r in reqs]
    deer_pts = []
    for j, i in enumerate(words):
        trial, forced = outs[2 * j], outs[2 * j + 1]
        _, lps = _trim_eos(trial.token_ids, trial.logprobs, ids.eos)
        confs = [deer_confidence(lps, skip_first=deer_cfg.skip_first, mean=m) for m in ("arithmetic", "geometric")]
        deer_pts.append([i, round(confs[0], 5), round(confs[1], 5), bool(grade_text(decode(forced.token_ids)))])
    dyn_pts = []
    for p, o in zip(pos, outs[2 * len(words) : 2 * len(words) + len(pos)]):
        text = decode(_trim_eos(o.token_ids, [], ids.eos)[0])
        dyn_pts.append([p, extract(text), text, bool(grade_text(text))])
    budget_pts = [[b, bool(grade_text(decode(o.token_ids)))] for b, o in zip(cut, outs[2 * len(words) + len(pos) :])]
    return {"deer_points": deer_pts, "dynasor_points": dyn_pts, "budget_points": budget_pts}


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
