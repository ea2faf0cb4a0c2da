"""The labeling actor: one vLLM engine that probes whole traces and returns labeled rows.

Why not ray.data.llm here: labels need *all* probes of a trace together (they become one row), and
ray.data.llm streams one request per row in completion order. So each Ray Data batch holds whole
traces; the actor sends all their probes to vLLM in one `generate` call. Probes of one trace share
the prompt + trace prefix, so with prefix caching the engine computes that prefix once, and the
batch keeps the engine busy with many traces' probes at a time. A probe is one greedy answer, or with
`probe_sampling` k answers sampled at the serving settings (vLLM's `n`), the break's label then the
share of them that is right.

A probe that fails on its own is an error row for its trace; an engine that died fails the task
instead (the actor exits, Ray restarts it and retries the batch: pipelines/common/error_rows.py).
"""

from __future__ import annotations

import os
import time

import pyarrow as pa

from pipelines.common.error_rows import engine_dead, exit_for_restart
from pipelines.common.graders import grade, reference_answer
from pipelines.common.runtime import stable_seed
from pipelines.common.schemas import LABELS, empty_row
from pipelines.common.tokens import think_opened
from specexit_core.labels import find_think_span, label_trace, probe_prompts, step_boundaries

# Test hook: SPECEXIT_TEST_KILL_ENGINE_AFTER_BATCHES=N kills the engine once, after N batches.
KILL_ENGINE_ENV = "SPECEXIT_TEST_KILL_ENGINE_AFTER_BATCHES"
KILLED_MARKER = ".test-engine-killed"


def _probe_keys(row_id: str, bounds: list[int]) -> list[str]:
    """What seeds each break's sampled probes: the same trace and break draw the same samples on a rerun."""
    return [f"{row_id}@{b}" for b in bounds]


class ProbeLabeler:
    """Ray Data callable class: `map_batches(ProbeLabeler, fn_constructor_kwargs=...)`."""

    llm = None  # the vLLM engine (set in __init__)
    test_kill_engine: tuple[int, str] | None = None
    batches = 0  # batches this actor has started

    def __init__(
        self,
        *,
        model: str,
        engine_kwargs: dict,
        env: dict,
        grader: str,
        close_text: str,
        answer_prompt: str,
        probe_max_tokens: int,
        probe_sampling: dict | None = None,
        think_start: str,
        think_end: str,
        split_tokens: list[str] | None,
        shift: str,
        initial: float,
        gpu: bool,
        test_kill_engine: tuple[int, str] | None = None,
    ):
        os.environ.update(env)  # before vLLM is imported in this process
        from vllm import LLM, SamplingParams

        from pipelines.common.tokens import token_ids

        if gpu and engine_kwargs.get("tensor_parallel_size", 1) > 1:
            engine_kwargs = {"distributed_executor_backend": "mp", **engine_kwargs}
        self.llm = LLM(model=model, **engine_kwargs)
        tok = self.llm.get_tokenizer()
        self.ids = token_ids(
            tok, think_start=think_start, think_end=think_end, split_tokens=split_tokens, model_dir=model
        )
        self.close_ids = tok.encode(close_text + answer_prompt, add_special_tokens=False)
        self.max_len = self.llm.llm_engine.model_config.max_model_len
        self.params = SamplingParams(temperature=0.0, max_tokens=probe_max_tokens)
        self.sampling = probe_sampling  # None: one greedy probe per break; else k samples (ProbeSampling)
        self.grader, self.shift, self.initial = grader, shift, initial
        self.probe_max_tokens = probe_max_tokens
        self.test_kill_engine, self.batches = test_kill_engine, 0
        print(
            f"[labels] engine ready: split ids {self.ids.split}, close ids {self.close_ids}, "
            f"max_model_len {self.max_len}",
            flush=True,
        )

    # -- one trace -> probes ----------------------------------------------------------------
    def _plan(self, row: dict):
        """(probe prompts, context) for a labelable trace, or an error string."""
        if row["status"] != "ok":
            return f"trace error: {row['error']}"
        prompt, comp = list(row["prompt_token_ids"]), list(row["completion_token_ids"])
        opened = think_opened(prompt, self.ids.think_start, self.ids.think_end)
        span = find_think_span(
            comp, think_start_id=self.ids.think_start, think_end_id=self.ids.think_end, prompt_opened_think=opened
        )
        if span is None:
            return "unfinished trace: no closed think segment (raise sampling.max_tokens)"
        ref = reference_answer(self.grader, row.get("gold"), row.get("answer"))
        if ref is None:
            return "no reference answer: no gold and the trace's answer has none"
        bounds = step_boundaries(comp, self.ids.split, *span)
        probes = probe_prompts(prompt, comp, bounds, self.close_ids)
        if probes and len(probes[-1]) + 1 > self.max_len:
            return f"probe prompt of {len(probes[-1])} tokens exceeds max_model_len {self.max_len}"
        return probes, dict(prompt=prompt, comp=comp, opened=opened, ref=ref, bounds=bounds)

    def _label(self, row: dict, ctx: dict, outcomes: list[float]) -> dict:
        lab = label_trace(
            ctx["prompt"],
            ctx["comp"],
            outcomes,
            split_ids=self.ids.split,
            think_start_id=self.ids.think_start,
            think_end_id=self.ids.think_end,
            prompt_opened_think=ctx["opened"],
            initial=self.initial,
            shift=self.shift,
        )
        d = lab.to_dict()
        final_ok = grade(self.grader, row.get("answer") or "", ctx["ref"]) > 0.5
        return dict(
            id=row["id"],
            status="ok",
            error=None,
            gold=row.get("gold"),
            reference=ctx["ref"],
            prompt_token_ids=ctx["prompt"],
            completion_token_ids=ctx["comp"],
            probe_outcomes=[float(o) for o in outcomes],
            final_correct=final_ok,
            **d,
        )

    def _maybe_kill_engine(self) -> None:
        """Test hook (KILL_ENGINE_ENV): after N batches, SIGKILL this actor's engine core processes
        once per job (a marker file remembers it), as a crashed engine would die."""
        if self.test_kill_engine is None:
            return
        after, marker = self.test_kill_engine
        if self.batches < after or os.path.exists(marker):
            return
        import signal

        import psutil

        open(marker, "w").close()
        children = psutil.Process().children(recursive=True)
        for child in children:
            child.send_signal(signal.SIGKILL)
        psutil.wait_procs(children, timeout=10)
        for _ in range(100):  # until vLLM's liveness monitor has noticed (then every call raises)
            if engine_dead(RuntimeError(), self.llm):
                break
            time.sleep(0.1)
        print(f"[labels] test hook: killed the engine core after {self.batches} batches", flush=True)

    def _params(self, keys: list[str]) -> list:
        """One SamplingParams per probe: greedy, or k samples seeded by the probe's key (trace id, break)."""
        if self.sampling is None:
            return [self.params] * len(keys)
        from vllm import SamplingParams

        s = self.sampling
        return [
            SamplingParams(
                n=s["samples"],
                temperature=s["temperature"],
                top_p=s["top_p"],
                top_k=s["top_k"],
                seed=stable_seed(s["seed"], key),
                max_tokens=self.probe_max_tokens,
            )
            for key in keys
        ]

    def _generate(self, prompts: list[list[int]], keys: list[str]) -> list[list[str]]:
        """Each probe's answers: one greedy text, or the k sampled ones."""
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], self._params(keys), use_tqdm=False)
        return [[c.text for c in o.outputs] for o in outs]

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        t0 = time.time()
        self._maybe_kill_engine()
        self.batches += 1
        plans = [self._plan(r) for r in rows]
        flat, owner, keys = [], [], []
        for i, p in enumerate(plans):
            if not isinstance(p, str):
                flat.extend(p[0])
                owner.extend([i] * len(p[0]))
                keys.extend(_probe_keys(rows[i]["id"], p[1]["bounds"]))
        try:
            per_break = self._generate(flat, keys) if flat else []
        except Exception as e:  # isolate the trace that broke the batch, keep the others
            if engine_dead(e, self.llm):  # not the traces' fault: a fresh actor retries the batch
                exit_for_restart("labels", e)
            print(f"[labels] batch generate failed ({e}); probing trace by trace", flush=True)
            per_break, flat_ok = [], []
            for i, p in enumerate(plans):
                if isinstance(p, str):
                    continue
                try:
                    per_break.extend(self._generate(p[0], _probe_keys(rows[i]["id"], p[1]["bounds"])) if p[0] else [])
                except Exception as e1:
                    if engine_dead(e1, self.llm):
                        exit_for_restart("labels", e1)
                    plans[i] = f"probe generation failed: {type(e1).__name__}: {e1}"
                    continue
                flat_ok.extend([i] * len(p[0]))
            owner = flat_ok
        per_trace: dict[int, list[float]] = {i: [] for i, p in enumerate(plans) if not isinstance(p, str)}
        for i, answers in zip(owner, per_break):  # a break's label: the share of its probes that answer right
            per_trace[i].append(sum(grade(self.grader, a, plans[i][1]["ref"]) for a in answers) / len(answers))
        out = []
        for i, (row, p) in enumerate(zip(rows, plans)):
            if isinstance(p, str):
                out.append(empty_row(LABELS, row["id"], p, gold=row.get("gold")))
            else:
                out.append(self._label(row, p[1], per_trace[i]))
        t1 = time.time()
        n = sum(len(a) for a in per_break)
        print(f"[labels] {len(rows)} traces, {len(per_break)} breaks, {n} probes in {t1 - t0:.1f}s", flush=True)
        table = pa.Table.from_pylist([{f.name: r.get(f.name) for f in LABELS} for r in out], schema=LABELS)
        # busy-window stamps for the throughput report (dropped by the writer)
        return table.append_column("_t0", pa.array([t0] * len(out), pa.float64())).append_column(
            "_t1", pa.array([t1] * len(out), pa.float64())
        )
