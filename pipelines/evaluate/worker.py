"""The evaluation actor: the engines, and every method on every problem of its batch, one request at a time.

A Ray Data callable class (`map_batches(EvalWorker, ...)`). It holds one vLLM engine with EAGLE-3
speculation and the SpecExit draft (eagle3, specexit, budget, deer, dynasor, nothink, oracle) and a
plain engine (plain), plus the transformers target for the per-token signals. On a timed problem
(`EvalConfig.latency_problems`) every method runs one request at a time, in a per-problem shuffled
order (`order.method_order`), so each latency is an honest concurrency-1 end-to-end time; on the
others the single-request methods run as one batched generate per method over the batch, and DEER
and Dynasor as request loops in lockstep, one batched generate per round (accuracy and think tokens
only). Each batch is written as one atomic Parquet part by the actor itself (all
rows of a problem together: the unit of resume).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import traceback
from functools import partial

import pyarrow as pa

from pipelines.common.graders import EXTRACTORS, grade, reference_answer
from pipelines.common.parts import write_part
from pipelines.common.runtime import stable_seed
from pipelines.evaluate.config import SINGLE_REQUEST
from pipelines.evaluate.methods import (
    Gen,
    Ids,
    Result,
    batched,
    budget_extra,
    budget_replay,
    deer,
    drive,
    drive_lockstep,
    dynasor,
    oracle,
    oracle_probe,
    oracle_replay,
    paper_extra,
    peer_points,
    single,
    timed,
)
from pipelines.evaluate.order import method_order
from pipelines.evaluate.samples import sample_info
from specexit_core.vllm_env import THREADS_BIND_ENV, bind_this_process, claim_core_set

# single-request methods on the EAGLE-3 engine with the think prompt, told apart only by their SpecExit
# controls: two of them that send the same controls send the same request (`EvalWorker._request_key`);
# `plain` runs on the other engine, `nothink` on another prompt
SHAREABLE = tuple(m for m in SINGLE_REQUEST if m not in ("plain", "nothink"))
_ids = pa.list_(pa.int32())
_f32 = pa.list_(pa.float32())
EVAL = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),  # problem_id/T<temperature>[/s<sample>]/<method>[/<setting>]
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("error", pa.string()),
        pa.field("method", pa.string()),
        pa.field("setting", pa.string()),  # budget: the budget; effort: the level; "" otherwise
        pa.field("temperature", pa.float32()),
        pa.field("prompt", pa.string()),
        pa.field("gold", pa.string()),
        pa.field("correct", pa.bool_()),
        pa.field("think_tokens", pa.int32()),
        pa.field("answer_tokens", pa.int32()),
        pa.field("latency_s", pa.float64()),  # wall clock of all the method's requests for this problem
        pa.field("requests", pa.int32()),  # engine requests (probes included)
        pa.field("probe_requests", pa.int32()),
        pa.field("num_drafts", pa.int64()),  # vLLM spec-decode counters, diffed around this method's requests
        pa.field("num_accepted", pa.int64()),
        pa.field("prompt_token_ids", _ids),
        pa.field("completion_token_ids", _ids),
        pa.field("completion_text", pa.string()),
        pa.field("signal_confidence", _f32),  # eagle3 rows: per completion token, from the draft
        pa.field("signal_progress", _f32),
        pa.field("signal_remaining", _f32),
        pa.field("boundaries", _ids),  # oracle rows: probed paragraph breaks (completion indices)
        pa.field("probe_correct", pa.list_(pa.bool_())),  # oracle rows: forced answer right at each break
        pa.field("info", pa.string()),  # JSON: method details (exit index, DEER confidences, Dynasor answers, ...)
    ]
)


def row_id(pid: str, temp: float, method: str | None, setting: str = "", sample: int = 0) -> str:
    if method is None:
        return pid
    return f"{pid}/T{temp:g}" + (f"/s{sample}" if sample else "") + f"/{method}" + (f"/{setting}" if setting else "")


def error_row(
    pid: str,
    error: str,
    *,
    temp: float | None = None,
    method: str | None = None,
    setting: str = "",
    sample: int = 0,
    **known,
) -> dict:
    row = {f.name: None for f in EVAL}
    row.update(known)
    if sample:
        row["info"] = json.dumps(sample_info(sample))
    row.update(
        id=row_id(pid, temp or 0.0, method, setting, sample),
        problem_id=pid,
        status="error",
        error=error,
        method=method,
        setting=setting,
        temperature=temp,
    )
    return row


class EvalWorker:
    def __init__(self, *, cfg_json: str, env: dict, actors: int = 1):
        os.environ.update(env)  # before vLLM is imported in this process
        self._core_lock = None  # held while this actor lives: its claim on its cores
        if actors > 1 and THREADS_BIND_ENV in env:  # CPU: this actor's own share of the cores
            bind, self._core_lock = claim_core_set(env[THREADS_BIND_ENV], actors)
            bind_this_process(bind)
            print(f"[evaluate] engine actor bound to cores {bind} (one of {actors})", flush=True)
        from vllm import LLM

        from pipelines.common.tokens import token_ids
        from pipelines.evaluate.config import EvalConfig

        self.cfg = cfg = EvalConfig.model_validate_json(cfg_json)
        self.methods = cfg.run_methods()
        e = cfg.engine
        kw = dict(model=e.model, **e.engine_kwargs(), disable_log_stats=False)
        self.spec = self.plain = None
        # plain first: each LLM re-registers vLLM's Prometheus metrics, and get_metrics() (the
        # spec-decode counters diffed per method) must read the speculative engine's
        if "plain" in self.methods:
            self.plain = Gen(LLM(**kw), False, cfg.top_p, cfg.top_k)
        if any(m != "plain" for m in self.methods):
            self.spec = Gen(
                LLM(
                    **kw,
                    speculative_config={
                        "method": "eagle3",
                        "model": cfg.draft,
                        "num_speculative_tokens": cfg.num_speculative_tokens,
                    },
                ),
                True,
                cfg.top_p,
                cfg.top_k,
            )
        self.tok = tok = (self.spec or self.plain).llm.get_tokenizer()
        t = token_ids(
            tok, think_start=cfg.think_start, think_end=cfg.think_end, split_tokens=cfg.split_tokens, model_dir=e.model
        )
        enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
        trans = []
        for w in cfg.deer.transition_words:
            for v in (w, " " + w):
                x = enc(v)
                if len(x) == 1:
                    trans.append(x[0])
        if "deer" in self.methods and not trans:
            raise ValueError(f"no DEER transition word is a single token: {cfg.deer.transition_words}")
        self.ids = Ids(
            think_start=t.think_start,
            think_end=t.think_end,
            split=t.split,
            eos=t.eos,
            oracle_close=enc(cfg.oracle.close_text + cfg.oracle.answer_prompt),
            deer_probe=enc(cfg.deer.probe_text),
            deer_exit=enc(cfg.deer.exit_text),
            deer_transitions=sorted(set(trans)),
            dynasor_probe=enc(cfg.dynasor.probe_text),
        )
        self.max_len = (self.spec or self.plain).llm.llm_engine.model_config.max_model_len
        self.exit = {t: cfg.exit_overrides(t) for t in cfg.temperatures}  # per sampling profile
        self.effort_exit = (  # per reasoning effort level and temperature, resolved once
            {(lv, t): cfg.effort_exit(lv, t) for lv in cfg.efforts for t in cfg.temperatures}
            if "effort" in self.methods
            else {}
        )
        self.sig = None
        if cfg.signals and "eagle3" in self.methods:
            from pipelines.evaluate.trace_signals import SignalModel

            self.sig = SignalModel(e.model, cfg.draft)
        for g in (self.spec, self.plain):  # warm-up: the first request of each kind pays one-off costs
            if g is not None:
                g.one(enc("1"), max_tokens=4, temperature=0.0, seed=None, extra=False)
                g.one(
                    enc("1"),
                    max_tokens=4,
                    temperature=0.0,
                    seed=None,
                    extra=False,
                    logprobs=True,
                    stop_ids=ids_stop if (ids_stop := self.ids.deer_transitions) else None,
                )
                if any(t > 0 for t in cfg.temperatures):
                    g.one(enc("1"), max_tokens=4, temperature=0.6, seed=1, extra=False)
        print(f"[evaluate] engines ready: methods {self.methods}, specexit {self.exit}", flush=True)

    # -- prompts -------------------------------------------------------------------------------
    def _prompt(self, text: str, think: bool = True) -> list[int]:
        kw = dict(self.cfg.chat_template_kwargs)
        if not think:
            kw["enable_thinking"] = False
        s = self.tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True, **kw
        )
        ids = self.tok.encode(s, add_special_tokens=False)
        if not think and self._opened(ids):  # the template ignores enable_thinking: close it ourselves
            ids = ids + self.tok.encode(self.cfg.think_end + "\n\n", add_special_tokens=False)
        return ids

    def _opened(self, ids: list[int]) -> bool:
        from pipelines.common.tokens import think_opened

        return think_opened(ids, self.ids.think_start, self.ids.think_end)

    # -- one problem ---------------------------------------------------------------------------
    def _check(self, row: dict) -> tuple[list[int] | None, str | None, list[dict] | None]:
        """(prompt ids, reference answer, None), or (None, None, [error row]) for an unusable problem."""
        pid = row["id"]
        if row.get("error"):
            return None, None, [error_row(pid, row["error"], prompt=row.get("prompt"), gold=row.get("gold"))]
        ref = None if self.natural_end else reference_answer(self.cfg.grader, row.get("gold"), None)
        if ref is None and not self.natural_end:
            bad = f"no usable gold answer ({row.get('gold')!r})"
            return None, None, [error_row(pid, bad, prompt=row["prompt"], gold=row.get("gold"))]
        prompt = self._prompt(row["prompt"])
        if len(prompt) + 1 >= self.max_len:
            bad = f"prompt of {len(prompt)} tokens exceeds max_model_len {self.max_len}"
            return None, None, [error_row(pid, bad, prompt=row["prompt"], gold=row.get("gold"))]
        return prompt, ref, None

    def _jobs(self, temp: float, sample: int = 0, peers: bool = True) -> list[tuple[str, str]]:
        jobs: list[tuple[str, str]] = []
        for m in self.cfg.methods_for_sample(sample, peers):
            if m == "budget":
                jobs += [("budget", str(b)) for b in self.cfg.budgets_at(temp)]
            elif m == "effort":
                jobs += [("effort", level) for level in self.cfg.efforts]
            else:
                jobs.append((m, ""))
        return jobs

    def _extra(self, m: str, setting: str, temp: float):
        """The `specexit` request controls of a single-request method at temperature `temp`."""
        if m == "effort":  # the level's exit in full
            return self.effort_exit[(setting, temp)]
        return {
            "eagle3": False,
            "nothink": False,
            "plain": None,
            "specexit": self.exit[temp],
            "specexit_paper": paper_extra(),
            "specexit_default": None,
            "budget": budget_extra(int(setting) if setting else 0),
        }[m]

    def _request_key(self, m: str, setting: str, temp: float) -> str | None:
        """What a single-request job on the EAGLE-3 engine sends besides the prompt, sampling and seed
        (every method of a problem-sample shares those): its SpecExit controls. Jobs with one key send
        the same request, so one runs and the others take its result (`_shared`): an effort level
        certified at the calibrated exit, or whose exit is off as EAGLE-3's (a request with
        `enabled: false` gets no exit tracker at all, whatever its other fields). None: not such a job."""
        if m not in SHAREABLE:
            return None
        extra = self._extra(m, setting, temp)
        if extra is False or (isinstance(extra, dict) and extra.get("enabled") is False):
            return "off"
        return json.dumps(extra, sort_keys=True)  # None (the server's defaults) -> "null"

    @staticmethod
    def _shared(res: Result, job: tuple[str, str]) -> Result:
        """Another job's result for a job that sends the same request, saying whose it is."""
        return dataclasses.replace(res, info={**res.info, "same_request_as": "/".join(filter(None, job))})

    def _replayed(self, temp: float, methods: list[str] | None = None) -> list[tuple[str, str]]:
        """The budget jobs taken from the EAGLE-3 greedy trace at `temp` (`budget_sweep_greedy`), where
        `methods` (default: every method of the run) include the budget."""
        if "budget" not in (self.methods if methods is None else methods):
            return []
        return [("budget", str(b)) for b in self.cfg.budgets_replayed(temp)]

    def _replay(self, prompt: list[int], eagle: Result, setting: str):
        """The request generator of one replayed budget point."""
        return budget_replay(
            self.ids, prompt, eagle, int(setting), opened=self._opened(prompt), max_tokens=self.cfg.max_tokens
        )

    def _peer(self, m: str, prompt: list[int], common: dict, decode):
        """The request generator of a multi-request peer (DEER / Dynasor) on one problem."""
        if m == "deer":
            return deer(self.ids, prompt, self.cfg.deer, **common)
        return dynasor(self.ids, prompt, self.cfg.dynasor, extract=EXTRACTORS[self.cfg.grader], decode=decode, **common)

    def _seed(self, pid: str, temp: float, sample: int = 0) -> int:
        """A problem-sample's seed, the same for every method (sample 0's names no sample)."""
        return stable_seed(self.cfg.seed, f"{pid}/{temp:g}" + (f"/s{sample}" if sample else ""))

    def _row_seed(self, row: dict, temp: float) -> int:
        return self._seed(row["id"], temp, row.get("sample", 0))

    @staticmethod
    def _key(row: dict) -> tuple[str, int]:
        """A problem-sample: (problem id, sample)."""
        return row["id"], row.get("sample", 0)

    def _batched(
        self,
        problems: list[tuple[dict, list[int]]],
        temp: float,
        only: set | None = None,
        sample: int = 0,
        peers: bool = True,
    ) -> dict:
        """{(problem id, sample): {(method, setting): Result}}: every single-request method over
        `problems`, one generate per method, and DEER / Dynasor with all problems' request loops in
        lockstep (one generate per round); a failing method is left out (it then runs per problem).
        `only`: just these (method, setting) jobs. `sample`: 0 (every method) or any further one (the
        rows are then further samples, of any index, and run `sample_methods`). `peers`: False for
        problems past `peer_problems` (they run `sample_methods` too)."""
        out: dict = {self._key(row): {} for row, _ in problems}
        if not problems:
            return out
        methods = self.cfg.methods_for_sample(sample, peers)
        replayed = self._replayed(temp, methods)
        ran: dict = {}  # request key -> the job that sent it (`_request_key`)
        for m, setting in self._jobs(temp, sample, peers):
            if m not in SINGLE_REQUEST or (only is not None and (m, setting) not in only) or (m, setting) in replayed:
                continue
            key = self._request_key(m, setting, temp)
            if key in ran:  # the same request ran for another job: its results, not a second generate
                for row, _ in problems:
                    got = out[self._key(row)]
                    if ran[key] in got:
                        got[(m, setting)] = self._shared(got[ran[key]], ran[key])
                continue
            gen = self.plain if m == "plain" else self.spec
            try:
                prompts = [self._prompt(row["prompt"], think=False) if m == "nothink" else p for row, p in problems]
                params = [
                    gen.params(
                        max_tokens=self.cfg.max_tokens,
                        temperature=temp,
                        seed=self._row_seed(row, temp),
                        extra=self._extra(m, setting, temp),
                    )
                    for row, _ in problems
                ]
                t0 = time.perf_counter()
                res = batched(gen, self.ids, prompts, [self._opened(p) for p in prompts], params)
                self._took(m + (f"/{setting}" if setting else ""), temp, len(problems), t0)
            except Exception:  # noqa: BLE001 -- the per-problem path runs it again and records the error
                traceback.print_exc()
                continue
            for (row, _), r in zip(problems, res):
                out[self._key(row)][(m, setting)] = r
            if key is not None:
                ran[key] = (m, setting)
        if only is not None:
            return out
        with_eagle = [(row, p) for row, p in problems if ("eagle3", "") in out[self._key(row)]]
        if replayed and with_eagle:  # the sweep's greedy points from the EAGLE-3 traces, one generate
            try:
                t0 = time.perf_counter()
                res = drive_lockstep(
                    self.spec,
                    [
                        self._replay(p, out[self._key(row)][("eagle3", "")], s)
                        for row, p in with_eagle
                        for _, s in replayed
                    ],
                )
                self._took("budget sweep (replayed)", temp, len(with_eagle), t0)
            except Exception:  # noqa: BLE001 -- the per-problem path then generates the points
                traceback.print_exc()
            else:
                pairs = [(self._key(row), job) for row, _ in with_eagle for job in replayed]
                for (pid, job), r in zip(pairs, res):
                    out[pid][job] = r
        decode = lambda t: self.tok.decode(t, skip_special_tokens=False)  # noqa: E731
        for m in ("deer", "dynasor"):  # many requests per problem: all problems' loops in lockstep
            if m not in methods:
                continue
            try:
                common = [
                    dict(max_tokens=self.cfg.max_tokens, temperature=temp, seed=self._row_seed(row, temp))
                    for row, _ in problems
                ]
                t0 = time.perf_counter()
                res = drive_lockstep(self.spec, [self._peer(m, p, c, decode) for (_, p), c in zip(problems, common)])
                self._took(m, temp, len(problems), t0)
            except Exception:  # noqa: BLE001 -- the per-problem path runs it again and records the error
                traceback.print_exc()
                continue
            for (row, _), r in zip(problems, res):
                r.info["batched"] = True
                out[self._key(row)][(m, "")] = r
        if "oracle" in methods and all(("eagle3", "") in out[self._key(row)] for row, _ in problems):
            try:  # every problem's probes (and the peers' candidates) and replays in lockstep
                methods = [
                    oracle(
                        self.ids,
                        p,
                        out[self._key(row)][("eagle3", "")],
                        probe_max_tokens=self.cfg.oracle.probe_max_tokens,
                        grade_text=self._grade_text(
                            self._reference(
                                reference_answer(self.cfg.grader, row.get("gold"), None),
                                out[self._key(row)][("eagle3", "")],
                                decode,
                            )
                        ),
                        decode=decode,
                        common=dict(max_tokens=self.cfg.max_tokens, temperature=temp, seed=self._row_seed(row, temp)),
                        peers=self._peer_kw(temp, row),
                        extract=EXTRACTORS[self.cfg.grader],
                    )
                    for row, p in problems
                ]
                t0 = time.perf_counter()
                res = drive_lockstep(self.spec, methods)
                self._took("oracle", temp, len(problems), t0)
            except Exception:  # noqa: BLE001 -- the per-problem path runs it again and records the error
                traceback.print_exc()
            else:
                for (row, _), r in zip(problems, res):
                    r.requests = 1 + r.probe_requests
                    r.info["batched"] = True
                    out[self._key(row)][("oracle", "")] = r
        return out

    @staticmethod
    def _took(what: str, temp: float, n: int, t0: float, how: str = "batched") -> None:
        """One log line per batched method or timed problem: where an evaluation's time goes."""
        print(f"[evaluate] T={temp:g} {what}: {n} problem(s) {how} in {time.perf_counter() - t0:.1f}s", flush=True)

    def _methods(
        self, pid: str, row: dict, prompt: list[int], ref: str, temp: float, pre: dict | None = None, timed_here=True
    ) -> list[dict]:
        """Every method on one problem, in a shuffled order; `pre`: results of batched runs to use;
        `timed_here`: False marks its rows as left out of the latency means."""
        cfg, ids = self.cfg, self.ids
        sample, peers = row.get("sample", 0), row.get("peers", True)
        seed = self._seed(pid, temp, sample)
        common = dict(max_tokens=cfg.max_tokens, temperature=temp, seed=seed)
        decode = lambda t: self.tok.decode(t, skip_special_tokens=False)  # noqa: E731
        rows, eagle = [], None
        pre = pre or {}
        replayed = [j for j in self._replayed(temp, cfg.methods_for_sample(sample, peers)) if j not in pre]
        jobs = method_order([j for j in self._jobs(temp, sample, peers) if j not in replayed], seed)
        ran: dict = {}  # request key -> (job, result) of this problem-sample (`_request_key`)
        for m, setting in jobs + replayed:  # the replayed sweep points last: they read the eagle3 trace
            try:
                gen = self.plain if m == "plain" else self.spec
                p = self._prompt(row["prompt"], think=False) if m == "nothink" else prompt
                opened = self._opened(p)
                key = self._request_key(m, setting, temp) if (m, setting) not in pre else None
                if (m, setting) in pre:
                    res = pre[(m, setting)]
                elif key in ran:  # the same request ran for another job of this problem-sample
                    res = self._shared(*ran[key][::-1])
                elif (m, setting) in replayed:
                    if eagle is None:
                        raise RuntimeError("the replayed budget needs the eagle3 trace, which failed")
                    res = drive(gen, self._replay(p, eagle[0], setting))
                elif m in ("deer", "dynasor"):
                    res = timed(gen, partial(drive, gen, self._peer(m, p, common, decode)))
                elif m == "oracle":
                    res = self._oracle(
                        pid, row, p, eagle, self._reference(ref, eagle and eagle[0], decode), common, decode
                    )
                else:
                    extra = self._extra(m, setting, temp)
                    res = timed(gen, partial(single, gen, ids, p, opened=opened, extra=extra, **common))
                    if key is not None:
                        ran[key] = ((m, setting), res)
                if not timed_here:  # latency is compared on the timed problems only
                    res.info["timed"] = False
                res.info.update(sample_info(sample))
                text = decode(res.completion)
                r = self._row(pid, row, temp, m, setting, p, res, text, grade(cfg.grader, text, ref) > 0.5)
                if m == "eagle3":
                    eagle = (res, r)
                    if self.sig is not None:
                        sig = self.sig.signals(p, res.completion)
                        r.update(
                            signal_confidence=[s[0] for s in sig],
                            signal_progress=[s[1] for s in sig],
                            signal_remaining=[s[2] for s in sig],
                        )
                rows.append(r)
            except Exception as ex:  # one failing method is an error row, the others still run
                traceback.print_exc()
                rows.append(
                    error_row(
                        pid,
                        f"{m}: {type(ex).__name__}: {ex}",
                        temp=temp,
                        method=m,
                        setting=setting,
                        sample=sample,
                        prompt=row["prompt"],
                        gold=row.get("gold"),
                    )
                )
        if self.natural_end:  # the reference is the EAGLE-3 trace's own answer, known once it ran
            self._grade_against_natural_end(rows, eagle and eagle[0], decode)
        return rows

    @property
    def natural_end(self) -> bool:
        return self.cfg.grade_against == "natural_end"

    def _reference(self, ref: str | None, eagle: Result | None, decode) -> str | None:
        """What answers are graded against: the gold `ref`, or (`grade_against: natural_end`) the answer
        the problem's EAGLE-3 trace reaches at its natural end (None: it gave none)."""
        if not self.natural_end:
            return ref
        return None if eagle is None else EXTRACTORS[self.cfg.grader](decode(eagle.completion))

    def _grade_against_natural_end(self, rows: list[dict], eagle: Result | None, decode) -> None:
        """Each ok row's `correct`: its answer agrees with the EAGLE-3 trace's at its natural end (no
        answer agrees with no answer, as in the disagreement loss). Without that trace (it failed)
        nothing agrees: the problem counts against every method, never for it."""
        ref = self._reference(None, eagle, decode)
        for r in rows:
            if r["status"] == "ok":
                r["correct"] = eagle is not None and grade(self.cfg.grader, r["completion_text"], ref) > 0.5

    def _grade_text(self, ref: str):
        return lambda text: grade(self.cfg.grader, text, ref) > 0.5

    def _peer_kw(self, temp: float, row: dict) -> dict | None:
        """`peer_points` keywords when this run probes the peers' candidates on this problem
        (calibration, greedy, the problems `peer_probe_problems` names)."""
        if not (self.cfg.peer_probes and temp == 0.0 and row.get("peer_probe", True)):
            return None
        return dict(
            deer_cfg=self.cfg.deer,
            dynasor_cfg=self.cfg.dynasor,
            stride=self.cfg.peer_probe_stride,
            budgets=self.cfg.budget_sweep,
            answer_max_tokens=self.cfg.oracle.probe_max_tokens,
            extract=EXTRACTORS[self.cfg.grader],
        )

    def _oracle(self, pid, row, prompt, eagle, ref, common, decode) -> Result:
        """The oracle on a timed problem: probes (their time apart), then the replay, timed."""
        if eagle is None:
            raise RuntimeError("the oracle needs the eagle3 trace, which failed")
        eres, _ = eagle
        grade_text = self._grade_text(ref)
        t0 = time.perf_counter()
        probe = oracle_probe(
            self.ids,
            prompt,
            eres.completion,
            max_tokens=self.cfg.oracle.probe_max_tokens,
            grade_text=grade_text,
            decode=decode,
            extract=EXTRACTORS[self.cfg.grader],
        )
        pr = drive(self.spec, probe)
        probe_s = time.perf_counter() - t0
        peers = self._peer_kw(common["temperature"], row)
        points = (
            drive(
                self.spec, peer_points(self.ids, prompt, eres.completion, grade_text=grade_text, decode=decode, **peers)
            )
            if peers
            else {}
        )
        replay = oracle_replay(self.ids, prompt, eres, pr, common)
        replays = pr["cut"] is not None and pr["think_end"] is not None and pr["cut"] < pr["think_end"]
        res = timed(self.spec, partial(drive, self.spec, replay)) if replays else drive(self.spec, replay)
        res.requests = 1 + pr["probes"]  # the replay (or the reused eagle3 request) and the probes
        res.info.update(probe_latency_s=round(probe_s, 4), **points)
        return res

    def _row(self, pid, row, temp, m, setting, prompt, res: Result, text: str, correct: bool) -> dict:
        r = {f.name: None for f in EVAL}
        r.update(
            id=row_id(pid, temp, m, setting, row.get("sample", 0)),
            problem_id=pid,
            status="ok",
            method=m,
            setting=setting,
            temperature=temp,
            prompt=row["prompt"],
            gold=row.get("gold"),
            correct=bool(correct),
            think_tokens=res.think_tokens,
            answer_tokens=res.answer_tokens,
            latency_s=None if res.info.get("batched") else res.latency_s,
            requests=res.requests,
            probe_requests=res.probe_requests,
            num_drafts=res.num_drafts,
            num_accepted=res.num_accepted,
            prompt_token_ids=prompt,
            completion_token_ids=res.completion,
            completion_text=text,
            info=json.dumps(res.info),
        )
        pr = res.oracle
        if pr is not None:
            r.update(boundaries=pr["breaks"], probe_correct=pr["flags"])
        return r

    def __call__(self, batch: pa.Table) -> pa.Table:
        t0 = time.time()
        rows = []
        todo = []
        for r in batch.to_pylist():
            prompt, ref, err = self._check(r)
            if err:
                rows += err
            else:
                todo.append((r, prompt, ref))
        untimed = [(r, p) for r, p, _ in todo if not r.get("timed", True)]
        pre = {t: self._batched([x for x in untimed if x[0].get("peers", True)], t) for t in self.cfg.temperatures}
        for t in self.cfg.temperatures:  # the problems past `peer_problems`: the sample methods only
            pre[t].update(self._batched([x for x in untimed if not x[0].get("peers", True)], t, peers=False))
        for t in self.cfg.temperatures:  # the further samples at a sampled temperature: all batched
            further = [({**r, "sample": j}, p) for r, p, _ in todo for j in range(1, self.cfg.samples_at(t))]
            pre[t].update(self._batched(further, t, sample=1))
        # on the timed problems too, the budget sweep's other points only draw the accuracy-vs-tokens
        # curve: batched; only the budget chosen on dev is timed like every method
        timed = [(r, p) for r, p, _ in todo if r.get("timed", True) and r.get("peers", True)]
        for t in self.cfg.temperatures:
            sweep_only = {("budget", str(b)) for b in self.cfg.budgets_at(t) if b != self.cfg.budget_chosen}
            sweep_only -= set(self._replayed(t))  # those follow each problem's eagle3 run (`_methods`)
            if self.cfg.budget_chosen is not None and "budget" in self.methods and timed and sweep_only:
                for pid, res in self._batched(timed, t, only=sweep_only).items():
                    pre[t].setdefault(pid, {}).update(res)
        if untimed:
            print(f"[evaluate] {len(untimed)} untimed problems batched in {time.time() - t0:.1f}s", flush=True)
        for i, (r, prompt, ref) in enumerate(todo):
            timed_here = r.get("timed", True)
            for t in self.cfg.temperatures:
                t1 = time.perf_counter()
                rows += self._methods(r["id"], r, prompt, ref, t, pre[t].get(self._key(r)), timed_here=timed_here)
                if timed_here:
                    self._took(r["id"], t, 1, t1, how="timed, every method one request at a time,")
                for j in range(1, self.cfg.samples_at(t)):  # latency is timed on sample 0 only
                    rj = {**r, "sample": j}
                    rows += self._methods(r["id"], rj, prompt, ref, t, pre[t].get(self._key(rj)), timed_here=False)
            if (i + 1) % 10 == 0:
                print(
                    f"[evaluate] {i + 1}/{batch.num_rows} problems of this batch ({time.time() - t0:.0f}s)", flush=True
                )
        table = pa.Table.from_pylist([{f.name: r.get(f.name) for f in EVAL} for r in rows], schema=EVAL)
        name = write_part(self.cfg.output, table)
        n_err = sum(r["status"] != "ok" for r in rows)
        print(
            f"[evaluate] {batch.num_rows} problems -> {len(rows)} rows ({n_err} errors) in "
            f"{time.time() - t0:.1f}s: {name}",
            flush=True,
        )
        return pa.table({"part": [name], "problems": [batch.num_rows], "rows": [len(rows)], "errors": [n_err]})
