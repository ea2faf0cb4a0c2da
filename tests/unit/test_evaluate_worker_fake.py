"""EvalWorker over a fake engine: the timed problems run every method one request at a time in a
shuffled order, the others get the single-request methods from one batched generate per method."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.evaluate.config import EvalConfig
from pipelines.evaluate.methods import Ids, Out
from pipelines.evaluate.worker import EvalWorker
from specexit_core.toy.paths import TEACHER_DIR


class FakeGen:
    """Answers every request with `4 </think> The answer is 7 .` (one-token toy words)."""

    def __init__(self, tok, speculative: bool):
        self.tok, self.speculative, self.requests, self.calls = tok, speculative, 0, []
        self.sent = []  # every request's params
        self.reply = tok.encode("4\n\n</think>\n\nThe answer is 7 .", add_special_tokens=False)

    def spec_counters(self):
        return None

    def params(self, **kw):
        return kw

    def many(self, prompts, sp):
        self.requests += len(prompts)
        self.calls.append((len(prompts), sp if isinstance(sp, dict) else sp[0]))
        self.sent += [sp] * len(prompts) if isinstance(sp, dict) else list(sp)
        return [Out(list(self.reply), "", [], "stop", None) for _ in prompts]

    def one(self, prompt, **kw):
        return self.many([prompt], self.params(**kw))[0]


def _worker(tmp_path, methods):
    from transformers import AutoTokenizer

    from pipelines.common.tokens import token_ids

    cfg = EvalConfig(
        output=str(tmp_path / "out"),
        engine={"model": str(TEACHER_DIR)},
        draft="unused",
        methods=methods,
        temperatures=[0.0, 0.6],
        budget_sweep=[8, 16],
        signals=False,
    )
    w = object.__new__(EvalWorker)
    tok = AutoTokenizer.from_pretrained(str(TEACHER_DIR))
    t = token_ids(tok, think_start="<think>", think_end="</think>", split_tokens=None, model_dir=str(TEACHER_DIR))
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    w.cfg, w.methods, w.tok = cfg, cfg.run_methods(), tok
    w.spec, w.plain = FakeGen(tok, True), FakeGen(tok, False)
    w.ids = Ids(t.think_start, t.think_end, t.split, t.eos, enc("</think>\n\n"), [], [], [], [])
    w.max_len, w.sig = 512, None
    w.exit = {t: {"method": "confidence", "confidence_threshold": 0.5} for t in cfg.temperatures}
    return w


def test_timed_problem_per_request_others_batched(tmp_path):
    methods = ["plain", "eagle3", "specexit", "specexit_paper", "budget", "nothink", "oracle"]
    w = _worker(tmp_path, methods)
    batch = pa.Table.from_pylist(
        [
            {"id": f"p{i}", "prompt": "Compute from left to right : 3 + 4", "gold": "7", "timed": i == 0}
            for i in range(3)
        ]
    )
    w(batch)
    rows = [r for f in (tmp_path / "out").glob("part-*.parquet") for r in pq.read_table(f).to_pylist()]
    assert len(rows) == 3 * 2 * 8 and all(r["status"] == "ok" and r["correct"] for r in rows)
    for r in rows:
        info = json.loads(r["info"])
        if r["problem_id"] == "p0":
            assert r["latency_s"] is not None and "timed" not in info
        else:
            assert info["timed"] is False
            assert r["latency_s"] is None and info["batched"]
        if r["method"] == "oracle":  # timed (p0) and lockstep alike: each break's answer, and the trace's own
            assert len(info["probe_answers"]) == len(r["boundaries"]) > 0 and info["final_answer"] == "7"
            assert set(info["probe_answers"]) == {"7"}  # the fake engine's every reply ends "The answer is 7 ."
    # per temperature: one batched generate of both untimed problems per single-request job, and one
    # for both problems' oracle probes (lockstep; the reply's one break needs no replay)
    batched = [sp for n, sp in w.spec.calls + w.plain.calls if n == 2]
    assert len(batched) == 2 * 8  # eagle3, specexit, specexit_paper, budget x2, nothink, plain; oracle probes
    paper = [sp for n, sp in w.spec.calls if sp.get("extra", {}) and sp["extra"].get("progress_threshold") == 0.3]
    assert paper and paper[0]["extra"]["confidence_threshold"] == 0.8 and paper[0]["extra"]["alpha"] == 0.1


def test_order_differs_between_problems(tmp_path):
    w = _worker(tmp_path, ["eagle3", "specexit", "specexit_paper", "nothink", "oracle"])
    firsts = set()
    for i in range(12):
        w.spec.calls.clear()
        w._methods(f"p{i}", {"prompt": "Compute from left to right : 3 + 4"}, w._prompt("3 + 4"), "7", 0.0)
        firsts.add(json.dumps(w.spec.calls[0][1].get("extra"), sort_keys=True))
    assert len(firsts) >= 3  # not always the same method first


def test_only_the_budget_chosen_on_dev_is_timed(tmp_path):
    w = _worker(tmp_path, ["eagle3", "budget"])
    w.cfg = w.cfg.model_copy(update={"budget_chosen": 16})
    batch = pa.Table.from_pylist(
        [{"id": "p0", "prompt": "Compute from left to right : 3 + 4", "gold": "7", "timed": True}]
    )
    w(batch)
    rows = [r for f in (tmp_path / "out").glob("part-*.parquet") for r in pq.read_table(f).to_pylist()]
    budget = {(r["setting"], r["temperature"]): r for r in rows if r["method"] == "budget"}
    assert len(budget) == 4  # settings 8 and 16 at both temperatures
    for (setting, _), r in budget.items():
        info = json.loads(r["info"])
        if setting == "16":  # the chosen budget: timed at concurrency 1 like every method
            assert r["latency_s"] is not None and "batched" not in info
        else:  # the rest of the sweep: accuracy and think tokens only
            assert r["latency_s"] is None and info["batched"]


def test_the_sweep_runs_only_at_its_temperatures_elsewhere_the_chosen_budget(tmp_path):
    w = _worker(tmp_path, ["eagle3", "budget"])
    w.cfg = w.cfg.model_copy(update={"budget_chosen": 16, "budget_sweep_temperatures": [0.0]})
    batch = pa.Table.from_pylist(
        [
            {"id": f"p{i}", "prompt": "Compute from left to right : 3 + 4", "gold": "7", "timed": i == 0}
            for i in range(3)
        ]
    )
    w(batch)
    rows = [r for f in (tmp_path / "out").glob("part-*.parquet") for r in pq.read_table(f).to_pylist()]
    settings = {
        t: sorted({r["setting"] for r in rows if r["method"] == "budget" and round(r["temperature"], 3) == t})
        for t in (0.0, 0.6)
    }
    assert settings == {0.0: ["16", "8"], 0.6: ["16"]}
    assert sum(r["method"] == "budget" for r in rows) == 3 * 3  # 3 problems x (2 budgets at T=0, 1 at 0.6)
    # no chosen budget: the method needs the whole sweep to pick from, at every temperature
    w.cfg = w.cfg.model_copy(update={"budget_chosen": None})
    assert w.cfg.budgets_at(0.6) == w.cfg.budgets_at(0.0) == [8, 16]


def test_greedy_sweep_points_are_replayed_from_the_eagle3_trace(tmp_path):
    """At T = 0 the sweep's points other than the chosen budget come from each problem's EAGLE-3
    trace (timed or not): no budget request for them; a trace thinking longer than the budget is cut
    after `budget` think tokens, closed, and its answer generated greedily; at T = 0.6 the sweep
    still runs as budget requests; "generate" runs every point as a request again."""
    w = _worker(tmp_path, ["eagle3", "budget"])
    w.cfg = w.cfg.model_copy(update={"budget_sweep": [1, 8, 16], "budget_chosen": 16})
    assert w.cfg.budgets_replayed(0.0) == [1, 8] and w.cfg.budgets_replayed(0.6) == []
    batch = pa.Table.from_pylist(
        [
            {"id": f"p{i}", "prompt": "Compute from left to right : 3 + 4", "gold": "7", "timed": i == 0}
            for i in range(3)
        ]
    )
    w(batch)
    rows = {r["id"]: r for f in (tmp_path / "out").glob("part-*.parquet") for r in pq.read_table(f).to_pylist()}
    assert len(rows) == 3 * 2 * 4 and all(r["status"] == "ok" for r in rows.values())
    sent = {
        (sp["temperature"], sp["extra"]["max_think_tokens"])
        for _, sp in w.spec.calls
        if isinstance(sp.get("extra"), dict)
    }
    assert sent == {(0.0, 16), (0.6, 1), (0.6, 8), (0.6, 16)}  # at T = 0 only the chosen budget is a request
    end = w.ids.think_end
    for pid in ("p0", "p1", "p2"):
        eagle = rows[f"{pid}/T0/eagle3"]
        assert eagle["think_tokens"] == 2  # the fake reply thinks "4" "\n\n"
        same, cut = rows[f"{pid}/T0/budget/8"], rows[f"{pid}/T0/budget/1"]
        for r in (same, cut):
            info = json.loads(r["info"])
            assert info["replayed"] and r["latency_s"] is None and info["timed"] is False
        assert same["completion_token_ids"] == eagle["completion_token_ids"] and same["requests"] == 0
        assert cut["requests"] == 1 and cut["think_tokens"] == 1
        assert cut["completion_token_ids"][:2] == [eagle["completion_token_ids"][0], end]
        assert cut["completion_token_ids"][2:] == w.spec.reply  # the greedy answer after `</think>`
        chosen = json.loads(rows[f"{pid}/T0/budget/16"]["info"])
        assert "replayed" not in chosen
        assert "replayed" not in json.loads(rows[f"{pid}/T0.6/budget/1"]["info"])
    w.cfg = w.cfg.model_copy(update={"budget_sweep_greedy": "generate"})
    assert w.cfg.budgets_replayed(0.0) == []


def test_timed_subset_none_all_or_first_n():
    from pipelines.evaluate.job import timed_ids

    problems = [{"id": f"p{i}"} for i in range(5)]
    assert timed_ids(problems, None) == {f"p{i}" for i in range(5)}
    assert timed_ids(problems, 2) == {"p0", "p1"}
    assert timed_ids(problems, 0) == set()  # calibration's dev run: every problem batched


@pytest.mark.parametrize("n,n_timed", [(100, 10), (40, 0), (7, 7), (5, 2), (4, 3)])
def test_timed_problems_are_spread_evenly_through_the_batches(n, n_timed):
    from pipelines.evaluate.job import spread_timed

    rows = [{"id": i, "timed": i < n_timed} for i in range(n)]
    out = spread_timed(rows)
    assert sorted(r["id"] for r in out) == list(range(n))  # every problem once
    pos = [i for i, r in enumerate(out) if r["timed"]]
    assert [out[i]["id"] for i in pos] == list(range(n_timed))  # the timed ones keep their order
    if n == 100:  # batches of 25 on two actors: each batch holds its share of the timed work
        assert [sum(1 for i in pos if b * 25 <= i < (b + 1) * 25) for b in range(4)] in ([3, 2, 3, 2], [3, 3, 2, 2])


def test_actor_plan_one_actor_per_core_and_even_batches():
    from pipelines.evaluate.config import EvalConfig
    from pipelines.evaluate.job import actor_plan

    cfg = EvalConfig(output="unused", engine={"model": str(TEACHER_DIR)}, draft="unused", concurrency=2, batch_size=30)
    assert actor_plan(cfg, {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, False, 40) == (2, 20)  # 30 + 10 would idle one
    assert actor_plan(cfg, {"VLLM_CPU_OMP_THREADS_BIND": "0"}, False, 40) == (1, 30)  # one core: one engine
    assert actor_plan(cfg, {}, True, 100) == (2, 30)  # GPUs: as configured


def test_graded_against_the_natural_end_no_gold_needed(tmp_path):
    """`grade_against: natural_end` (`specexit calibrate --prompts FILE`): prompts without gold are
    evaluated, not error rows; each answer is graded against the one the problem's EAGLE-3 trace
    reaches at its natural end, whatever order the methods ran in (timed and batched alike), and the
    oracle's probes too, so `probe_correct` is exactly "no disagreement" at each break."""
    w = _worker(tmp_path, ["eagle3", "specexit", "plain", "oracle"])
    w.cfg = w.cfg.model_copy(update={"grade_against": "natural_end"})
    five = w.tok.encode("4\n\n</think>\n\nThe answer is 5 .", add_special_tokens=False)
    answer_5 = FakeGen.many

    def many(self, prompts, sp):  # the exit-forced run answers 5, every other request 7
        outs = answer_5(self, prompts, sp)
        extra = (sp if isinstance(sp, dict) else sp[0]).get("extra")
        return [Out(list(five), "", [], "stop", None) for _ in outs] if isinstance(extra, dict) and extra else outs

    w.spec.many = many.__get__(w.spec)
    batch = pa.Table.from_pylist(
        [
            {"id": f"p{i}", "prompt": "Compute from left to right : 3 + 4", "gold": None, "timed": i == 0}
            for i in range(3)
        ]
    )
    w(batch)
    rows = [r for f in (tmp_path / "out").glob("part-*.parquet") for r in pq.read_table(f).to_pylist()]
    assert len(rows) == 3 * 2 * 4 and all(r["status"] == "ok" for r in rows)  # no "no usable gold answer"
    by_method = {m: {r["correct"] for r in rows if r["method"] == m} for m in ("eagle3", "specexit", "plain", "oracle")}
    assert by_method == {"eagle3": {True}, "specexit": {False}, "plain": {True}, "oracle": {True}}
    for r in (r for r in rows if r["method"] == "oracle"):
        info = json.loads(r["info"])
        assert r["probe_correct"] == [a == info["final_answer"] for a in info["probe_answers"]] == [True]
    # graded against gold (the default), the same rows without gold are error rows
    w2 = _worker(tmp_path / "gold", ["eagle3"])
    w2(pa.Table.from_pylist([{"id": "p0", "prompt": "Compute from left to right : 3 + 4", "gold": None}]))
    (row,) = [r for f in (tmp_path / "gold" / "out").glob("part-*.parquet") for r in pq.read_table(f).to_pylist()]
    assert row["status"] == "error" and "no usable gold answer" in row["error"]


def test_the_runs_sampling_profile_reaches_every_sampled_request_and_picks_the_exit(tmp_path):
    """`top_p` / `top_k` (e.g. Qwen3's 0.95 / 20) go with every sampled request, never a greedy one;
    a calibrated file's exit for that profile is the one the run sends; the run identity of a run
    without them is what it was before they existed."""
    from pipelines.evaluate.methods import Gen

    g = object.__new__(Gen)
    g._SP, g.speculative, g.top_p, g.top_k = dict, False, 0.95, 20
    assert g.params(max_tokens=8, temperature=0.6, seed=1) == dict(
        max_tokens=8, temperature=0.6, seed=1, top_p=0.95, top_k=20
    )
    assert g.params(max_tokens=8, temperature=0.0, seed=1) == dict(max_tokens=8, temperature=0.0)
    cal = tmp_path / "calibrated.json"
    cal.write_text(
        json.dumps(
            {
                "exit": {"confidence_threshold": 0.9},
                "by_profile": {
                    "T0.6-p0.95-k20": {
                        "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20},
                        "exit": {"alpha": 0.5},
                    }
                },
            }
        )
    )
    base = dict(output="unused", engine={"model": str(TEACHER_DIR)}, draft="unused", calibrated=str(cal))
    cfg = EvalConfig(**base, top_p=0.95, top_k=20)
    assert cfg.exit_overrides(0.6) == {"alpha": 0.5} and cfg.exit_overrides(0.0) == {"confidence_threshold": 0.9}
    plain = EvalConfig(**base)
    assert plain.exit_overrides(0.6) == {"confidence_threshold": 0.9}  # T0.6 without top-p / top-k: no match
    assert "top_p" not in plain.model_dump() and cfg.model_dump()["top_k"] == 20


def test_further_samples_run_the_sample_methods_batched_with_their_own_seeds(tmp_path):
    """`samples: 3` at T = 0.6 (greedy runs once): samples 1 and 2 of every problem run only the
    `sample_methods` (eagle3 added for the oracle), all batched and untimed, each with its own seed (the
    same for every method); sample 0 is what a one-sample run writes, seeds included."""
    w = _worker(tmp_path, ["plain", "eagle3", "specexit", "nothink", "oracle"])
    w.cfg = w.cfg.model_copy(update={"samples": 3, "sample_methods": ["specexit", "oracle"]})
    one = _worker(tmp_path / "one", ["plain", "eagle3", "specexit", "nothink", "oracle"])
    problems = [
        {"id": f"p{i}", "prompt": "Compute from left to right : 3 + 4", "gold": "7", "timed": i == 0} for i in range(2)
    ]
    w(pa.Table.from_pylist(problems))
    rows = {r["id"]: r for f in (tmp_path / "out").glob("part-*.parquet") for r in pq.read_table(f).to_pylist()}
    # per problem: 5 methods at T = 0 and on sample 0 at T = 0.6, 3 (eagle3, specexit, oracle) on samples 1, 2
    assert len(rows) == 2 * (5 + 5 + 2 * 3) and all(r["status"] == "ok" for r in rows.values())
    for pid in ("p0", "p1"):
        for j in (1, 2):
            got = {r["method"] for r in rows.values() if r["id"].startswith(f"{pid}/T0.6/s{j}/")}
            assert got == {"eagle3", "specexit", "oracle"}
            for m in got:
                r = rows[f"{pid}/T0.6/s{j}/{m}"]
                info = json.loads(r["info"])
                assert r["problem_id"] == pid and info["sample"] == j and info["timed"] is False
                assert r["latency_s"] is None  # latency is timed on sample 0 only
        assert "sample" not in json.loads(rows[f"{pid}/T0.6/specexit"]["info"])
        assert not any(k.startswith((f"{pid}/T0/s1/", f"{pid}/T0/s2/")) for k in rows)  # greedy: one sample
    seeds = {sp["seed"] for sp in w.spec.sent if sp.get("temperature") == 0.6 and sp.get("seed") is not None}
    assert len(seeds) == 2 * 3  # 2 problems x 3 samples, each its own seed
    assert w._seed("p1", 0.6) == one._seed("p1", 0.6) == w._row_seed({"id": "p1"}, 0.6)  # a one-sample run's
    assert w._row_seed({"id": "p1", "sample": 1}, 0.6) == w._seed("p1", 0.6, 1) != w._seed("p1", 0.6)


def test_problems_past_peer_problems_run_the_sample_methods_only(tmp_path):
    """`peer_problems`: the peers (the methods outside `sample_methods`) run on the problems the job marks
    (`peers`, the first N); the others run the sample methods on every sample, timed or batched, and the
    greedy budget sweep replayed from the EAGLE-3 trace skips them too."""
    methods = ["plain", "eagle3", "specexit", "budget", "nothink", "oracle"]
    w = _worker(tmp_path, methods)
    w.cfg = w.cfg.model_copy(
        update={"samples": 2, "sample_methods": ["specexit", "oracle"], "peer_problems": 2, "budget_chosen": 8}
    )
    problems = [
        {
            "id": f"p{i}",
            "prompt": "Compute from left to right : 3 + 4",
            "gold": "7",
            "timed": i in (0, 2),
            "peers": i < 2,
        }
        for i in range(4)
    ]  # p0 timed with peers, p1 batched with peers, p2 timed without, p3 batched without
    w(pa.Table.from_pylist(problems))
    rows = [r for f in (tmp_path / "out").glob("part-*.parquet") for r in pq.read_table(f).to_pylist()]
    assert all(r["status"] == "ok" for r in rows)
    got: dict = {}
    for r in rows:
        got.setdefault(r["problem_id"], set()).add(r["id"].split("/", 1)[1])
    full = {f"{m}" for m in ("plain", "eagle3", "specexit", "nothink", "oracle", "budget/8", "budget/16")}
    core = {"eagle3", "specexit", "oracle"}
    for pid in ("p0", "p1"):  # every method at T = 0 and on sample 0 at T = 0.6, the sample methods on sample 1
        assert got[pid] == {f"T0/{m}" for m in full} | {f"T0.6/{m}" for m in full} | {f"T0.6/s1/{m}" for m in core}
    for pid in ("p2", "p3"):
        assert got[pid] == {f"T0/{m}" for m in core} | {f"T0.6/{m}" for m in core} | {f"T0.6/s1/{m}" for m in core}
    timed = {r["problem_id"] for r in rows if r["latency_s"] is not None}
    assert timed == {"p0", "p2"}  # p2 is timed, on its sample methods


def test_peer_problems_needs_sample_methods():
    base = dict(output="o", engine={"model": "m"}, draft="d", methods=["eagle3", "specexit", "deer"])
    with pytest.raises(ValueError, match="peer_problems needs sample_methods"):
        EvalConfig(**base, peer_problems=10)
    cfg = EvalConfig(**base, samples=2, sample_methods=["specexit"], peer_problems=10)
    assert cfg.methods_for_sample(0, peers=False) == ["specexit"] == cfg.methods_for_sample(1)
    assert cfg.methods_for_sample(0) == ["eagle3", "specexit", "deer"]
    assert "peer_problems" not in EvalConfig(**base).model_dump()  # the run identity of earlier runs
    assert cfg.model_dump()["peer_problems"] == 10


def test_sample_methods_must_be_run_methods():
    base = dict(output="o", engine={"model": "m"}, draft="d", methods=["eagle3", "specexit", "oracle"])
    assert EvalConfig(**base, sample_methods=["specexit"]).methods_for_sample(1) == ["specexit"]
    assert EvalConfig(**base, sample_methods=["oracle"]).methods_for_sample(1) == ["eagle3", "oracle"]
    assert EvalConfig(**base, samples=4).methods_for_sample(2) == ["eagle3", "specexit", "oracle"]
    with pytest.raises(ValueError, match="sample_methods"):
        EvalConfig(**base, sample_methods=["deer"])
    # one sample per problem: the run identity is what it was before samples existed
    assert "samples" not in EvalConfig(**base).model_dump()
    assert EvalConfig(**base, samples=4).model_dump()["samples"] == 4


def test_peer_candidates_are_probed_on_the_marked_problems_only(tmp_path):
    """`peer_probe_problems: N`: the job marks the first N problems; the worker probes the peers'
    candidates (greedy) on those alone, and `choose_peers` picks on the traces that have them."""
    from pipelines.calibrate.config import CalibrateConfig
    from pipelines.calibrate.job import choose_peers
    from pipelines.evaluate.job import first_ids

    w = _worker(tmp_path, ["eagle3", "oracle"])
    w.cfg = w.cfg.model_copy(update={"peer_probes": True, "peer_probe_problems": 2})
    assert first_ids([{"id": f"p{i}"} for i in range(5)], 2) == {"p0", "p1"}
    assert first_ids([{"id": "p0"}], None) == {"p0"}
    assert w._peer_kw(0.0, {"peer_probe": True}) is not None and w._peer_kw(0.0, {}) is not None
    assert w._peer_kw(0.0, {"peer_probe": False}) is None and w._peer_kw(0.6, {"peer_probe": True}) is None

    def trace(i, probed):
        return {"correct": True, "think_tokens": 20, "think_end": 0, "deer_points": [] if probed else None,
                "dynasor_points": {}, "budget_points": {8: True, 16: True} if probed else {}}  # fmt: skip

    cfg = CalibrateConfig(output="x.json", eval={"output": "o", "engine": {"model": "m"}, "draft": "d"})
    traces = [trace(i, i < 2) for i in range(6)]
    assert choose_peers(cfg, traces)["budget"] is None  # every trace must be probed unless peer_problems says
    chosen = choose_peers(cfg.model_copy(update={"peer_problems": 2}), traces)
    assert chosen["budget"]["setting"]["budget"] == 8  # chosen on the 2 probed traces


def test_the_effort_method_runs_each_level_at_its_exit(tmp_path):
    """`effort`: one row per reasoning effort level, each request carrying that level's exit in full
    (resolved once per level and temperature: EvalConfig.effort_exit)."""
    w = _worker(tmp_path, ["eagle3", "effort"])
    w.cfg = w.cfg.model_copy(update={"efforts": ["low", "max"]})
    w.effort_exit = {
        (lv, t): {"method": "confidence", "confidence_threshold": c}
        for lv, c in (("low", 0.3), ("max", 1.0))
        for t in (0.0, 0.6)
    }
    problems = [
        {"id": f"p{i}", "prompt": "Compute from left to right : 3 + 4", "gold": "7", "timed": i == 0} for i in range(2)
    ]
    w(pa.Table.from_pylist(problems))
    rows = [r for f in (tmp_path / "out").glob("part-*.parquet") for r in pq.read_table(f).to_pylist()]
    effort = sorted((r["problem_id"], r["temperature"], r["setting"]) for r in rows if r["method"] == "effort")
    assert len(effort) == 2 * 2 * 2 and {s for *_, s in effort} == {"low", "max"}
    sent = {sp["extra"]["confidence_threshold"] for sp in w.spec.sent if isinstance(sp.get("extra"), dict)}
    assert sent == {0.3, 1.0}


def test_an_effort_level_resolves_from_the_calibrated_file_and_the_draft(tmp_path):
    from specexit_core.toy.paths import DRAFT_DIR

    cal = tmp_path / "calibrated.json"
    cal.write_text(
        json.dumps({"exit": {}, "efforts": {"low": {"epsilon": 0.05, "exit": {"confidence_threshold": 0.3}}}})
    )
    cfg = EvalConfig(output="o", engine={"model": "m"}, draft=str(DRAFT_DIR), calibrated=str(cal), methods=["effort"])
    assert cfg.effort_exit("low", 0.0)["confidence_threshold"] == 0.3
    assert cfg.effort_exit("minimal", 0.6)["confidence_threshold"] == 0.3  # served by the next level up
    assert cfg.effort_exit("max", 0.0)["confidence_threshold"] == 1.0  # never fires
    with pytest.raises(ValueError, match="nothink"):
        EvalConfig(output="o", engine={"model": "m"}, draft="d", efforts=["none"])
    plain = EvalConfig(output="o", engine={"model": "m"}, draft="d")
    assert "effort" not in plain.methods  # opt-in
    # without the effort method the dump (a run's identity) is what it was before efforts existed
    assert "efforts" not in plain.model_dump() and "efforts" in cfg.model_dump()


def test_jobs_that_send_the_same_request_run_it_once(tmp_path):
    """An effort level certified at the calibrated exit sends what `specexit` sends, and one whose exit is
    off (`enabled: false`: the engine keeps no tracker for it) what `eagle3` sends: one generate each,
    timed or batched; the rows say whose result they carry."""
    w = _worker(tmp_path, ["eagle3", "specexit", "effort"])
    w.cfg = w.cfg.model_copy(update={"efforts": ["low", "high", "max"]})
    w.effort_exit = {}
    for t in w.cfg.temperatures:
        w.effort_exit[("low", t)] = {"enabled": True, "method": "confidence", "confidence_threshold": 0.3}
        w.effort_exit[("high", t)] = dict(w.exit[t])  # the calibrated exit itself
        w.effort_exit[("max", t)] = {"enabled": False, "method": "confidence", "confidence_threshold": 0.9}
    problems = [
        {"id": f"p{i}", "prompt": "Compute from left to right : 3 + 4", "gold": "7", "timed": i == 0} for i in range(3)
    ]
    w(pa.Table.from_pylist(problems))
    rows = {r["id"]: r for f in (tmp_path / "out").glob("part-*.parquet") for r in pq.read_table(f).to_pylist()}
    assert len(rows) == 3 * 2 * 5 and all(r["status"] == "ok" for r in rows.values())
    for pid in ("p0", "p1", "p2"):
        for t in ("0", "0.6"):
            info = {k: json.loads(r["info"]) for k, r in rows.items() if k.startswith(f"{pid}/T{t}/")}
            assert "same_request_as" not in info[f"{pid}/T{t}/effort/low"]
            for k, m in (("effort/high", "specexit"), ("effort/max", "eagle3")):  # whichever ran first
                a, b = f"{pid}/T{t}/{k}", f"{pid}/T{t}/{m}"
                assert {info[a].get("same_request_as"), info[b].get("same_request_as")} in ({m, None}, {k, None})
                assert rows[a]["completion_token_ids"] == rows[b]["completion_token_ids"]
                assert rows[a]["latency_s"] == rows[b]["latency_s"]
    # three requests per problem and temperature, not five: batched for p1, p2 (one generate each), one
    # at a time for the timed p0
    assert w.spec.requests == 3 * 2 * 3
    assert sorted(n for n, _ in w.spec.calls) == [1] * 6 + [2] * 6
