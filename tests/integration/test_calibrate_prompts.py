"""`specexit calibrate --prompts FILE --json`: the certified exit calibrated on a user's own prompts, with
no answers, end to end as a user runs it (a local Ray cluster, vLLM CPU engines on the toy teacher and
its draft): EAGLE-3 traces greedy and sampled as the deployment serves (T = 0.6, top-p 0.95, 3 samples
per prompt), probes at every paragraph break, the replay over the exit grid, Learn then Test under the
gold-free disagreement loss with the prompt as its unit, the engine's confirmation run.

The recipe's epsilon is large (0.8 at delta 0.2) so that 12 prompts (6 to order the grid, 6 to test it)
certify a setting at all: the cheapest setting with no loss on 6 prompts is an aggressive one, which
then disagrees on some of the other 6 (measured: 2 of 6 at T = 0.6, p = 0.34 at epsilon 0.5). A
certificate of 1 point needs hundreds of prompts (`dev_size_for_zero_losses`)."""

from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest
import yaml

from support.cli import run_json, specexit

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=1.5)]

N_GOOD = 12
SAMPLES = 3  # per prompt at T = 0.6
SAMPLED = "T0.6-p0.95"  # the sampling profile served


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from specexit_core.toy.task import problems

    d = tmp_path_factory.mktemp("calibrate-prompts")
    lines = [json.dumps({"id": f"q{i}", "prompt": p.prompt}) for i, p in enumerate(problems("dev", N_GOOD, seed=5))]
    lines.insert(3, json.dumps({"id": "blank", "prompt": "  "}))  # a bad row: accounted for, never calibrated on
    (d / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    recipe = {
        "output": str(d / "unused.json"),
        "epsilon": 0.8,
        "delta": 0.2,
        "temperatures": [0.0, 0.6],
        "peers": False,
        "confirm": True,
        "eval_recipe": "examples/toy/evaluate.yaml",
        "eval": {"output": str(d / "unused-dev"), "batch_size": 16, "latency_problems": 0},
    }
    (d / "calibrate.yaml").write_text(yaml.safe_dump(recipe))
    out = d / "mine" / "calibrated.json"
    argv = ["calibrate", "--config", str(d / "calibrate.yaml"), "--prompts", str(d / "prompts.jsonl")]
    argv += ["--temperatures", "0,0.6", "--top-p", "0.95", "--samples", str(SAMPLES)]
    _, res = run_json(specexit(*argv, "--output", str(out), "--json"), timeout=900)
    return res, out


def test_the_certified_exit_is_chosen_without_gold(run):
    from specexit_core.exit import ExitConfig

    res, out = run
    c = res["calibration"]
    assert json.loads(out.read_text()) == res  # the calibrated file is the printed result
    assert c["graded_against"] == "natural_end" and c["selection"] == "certified"
    assert c["n_traces"] == N_GOOD and c["temperatures"] == [0.0, 0.6] and c["samples"] == SAMPLES
    assert c["by_temperature"]["0.6"]["n_traces"] == SAMPLES * N_GOOD  # every sample replayed ...
    k = c["certificate"]
    # ... and certified by prompt (each its samples' mean loss): the samples of one are not independent
    assert k["loss"] == "disagreement" and k["n_dev"] == N_GOOD and (k["epsilon"], k["delta"]) == (0.8, 0.2)
    assert k["chosen"] is not None and k["bound"] <= 0.8  # certified at this epsilon on 12 prompts ...
    assert ExitConfig.from_dict(res["exit"]).to_dict() == res["exit"] == k["chosen"] and res["exit"]["enabled"]
    for t in ("0", "0.6"):  # agreement with EAGLE-3's own answers: 1 for EAGLE-3 itself
        assert c["by_temperature"][t]["eagle3"]["accuracy"] == 1
        assert (
            c["by_temperature"][t]["chosen_replay"]["think_tokens"] <= c["by_temperature"][t]["eagle3"]["think_tokens"]
        )


def test_the_engine_confirms_the_exit_on_the_same_prompts(run):
    res, out = run
    conf = res["calibration"]["confirmed_by_temperature"]
    assert set(conf) == {"0", "0.6"}
    head = json.loads((out.parent / "calibrated-dev-confirm" / "_summary.json").read_text())
    vs = head["by_temperature"]["0.6"]["methods"]["specexit"]["accuracy_vs_eagle3"]
    assert (vs["n"], vs["problems"]) == (SAMPLES * N_GOOD, N_GOOD)  # paired by sample, resampled by prompt
    for t, d in conf.items():
        assert d["eagle3"]["accuracy"] == 1  # graded against its own natural end
        assert 0 <= d["specexit"]["accuracy"] <= 1 and d["specexit"]["think_tokens"] < d["eagle3"]["think_tokens"], t
        assert isinstance(d["within_tolerance"], bool)


def test_dev_traces_beside_the_calibrated_file_every_row_accounted_for(run):
    _, out = run
    dev = out.parent / "calibrated-dev"
    summary = json.loads((dev / "_summary.json").read_text())
    assert summary["graded_against"] == "natural_end" and summary["n"] == N_GOOD + 1
    rows = pq.read_table(sorted(dev.glob("part-*.parquet"))).to_pylist()
    errors = {r["problem_id"] for r in rows if r["status"] != "ok"}
    assert errors == {"blank"} and {r["problem_id"] for r in rows} == {f"q{i}" for i in range(N_GOOD)} | {"blank"}
    further = [r for r in rows if json.loads(r["info"] or "{}").get("sample")]  # samples 1 and 2 at T = 0.6
    assert all(re.fullmatch(r"q\d+/T0\.6/s[12]/(eagle3|oracle)", r["id"]) for r in further)  # what the replay needs
    assert len(further) == (SAMPLES - 1) * N_GOOD * 2
    for r in rows:
        if r["status"] == "ok" and r["method"] == "oracle" and r["boundaries"]:
            info = json.loads(r["info"])  # each break graded exactly by "no disagreement"
            assert r["probe_correct"] == [a == info["final_answer"] for a in info["probe_answers"]]


def test_one_exit_per_sampling_profile_each_run_where_it_was_chosen(run):
    """`by_profile`: each calibration temperature's own choice (its traces alone), besides the joint
    `exit`; the confirmation run's engine requests at each temperature carried that profile's exit."""
    from specexit_core.exit.profiles import load_exit_profiles

    res, out = run
    assert set(res["by_profile"]) == {"T0", SAMPLED}
    for name, t, top_p in (("T0", 0.0, 1.0), (SAMPLED, 0.6, 0.95)):
        p = res["by_profile"][name]
        assert p["sampling"] == {"temperature": t, "top_p": top_p, "top_k": 0}
        k = res["calibration"]["by_profile"][name]["certificate"]
        assert k["n_dev"] == N_GOOD and (k["chosen"] is None) == (p["exit"]["enabled"] is False)
    assert len(load_exit_profiles(str(out)).profiles) == 2  # what the plugin and the evaluation read
    confirm = json.loads((out.parent / "calibrated-dev-confirm" / "_summary.json").read_text())
    used = confirm.get("specexit_exit_by_temperature") or {t: confirm["specexit_exit"] for t in ("0", "0.6")}
    assert used == {"0": res["by_profile"]["T0"]["exit"], "0.6": res["by_profile"][SAMPLED]["exit"]}
