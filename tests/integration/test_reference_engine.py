"""The reference engine on the real toy teacher and its trained SpecExit draft."""

import pytest

from specexit_core.draft.checkpoint import load_draft
from specexit_core.engine.reference import ReferenceEngine
from specexit_core.engine.types import GenerationRequest
from specexit_core.exit import ExitConfig, decide
from specexit_core.toy.paths import DRAFT_DIR
from specexit_core.toy.task import extract_answer, grade, problems
from specexit_core.toy.teacher_eval import prompt_ids

pytestmark = pytest.mark.slow(minutes=1.5)

N_PROMPTS = 24  # greedy: 22 of 24 exit and think 31% less (50 prompts: 41, 30%), for half the time
OFF = ExitConfig(enabled=False)


@pytest.fixture(scope="module")
def engines(teacher):
    model, tok = teacher
    draft = load_draft(DRAFT_DIR)
    return {
        "plain": ReferenceEngine(model, tok, None),
        "spec": ReferenceEngine(model, tok, draft, num_speculative_tokens=3),
        "tok": tok,
    }


@pytest.fixture(scope="module")
def prompts(engines):
    ps = problems("test", N_PROMPTS, seed=5)
    return ps, [prompt_ids(engines["tok"], p) for p in ps]


@pytest.fixture(scope="module")
def greedy(engines, prompts):
    return engines["plain"].generate([GenerationRequest(p, max_tokens=400) for p in prompts[1]])


@pytest.fixture(scope="module")
def spec_off(engines, prompts):
    return engines["spec"].generate([GenerationRequest(p, max_tokens=400, exit=OFF) for p in prompts[1]])


@pytest.fixture(scope="module")
def spec_on(engines, prompts):
    return engines["spec"].generate([GenerationRequest(p, max_tokens=400) for p in prompts[1]])


def test_plain_reference_matches_transformers_greedy(teacher, prompts, greedy):
    from specexit_core.toy.hf_generate import generate

    model, tok = teacher
    hf = generate(model, tok, prompts[1][:10], max_new_tokens=400, batch_size=1)
    assert [r.token_ids for r in greedy[:10]] == hf


def test_exit_disabled_is_lossless(greedy, spec_off):
    assert [r.token_ids for r in spec_off] == [r.token_ids for r in greedy]
    assert not any(r.exited for r in spec_off)


def test_trained_draft_acceptance_length(spec_off):
    rounds = sum(r.stats.rounds for r in spec_off)
    accepted = sum(r.stats.accepted for r in spec_off)
    mean_len = (accepted + rounds) / rounds
    assert mean_len >= 2.0, mean_len


def test_exit_enabled_equals_greedy_up_to_split_then_answers(engines, greedy, spec_on, prompts):
    tok = engines["tok"]
    close, brk = tok.convert_tokens_to_ids("</think>"), tok.convert_tokens_to_ids("\n\n")
    exited = 0
    for g, r, _p in zip(greedy, spec_on, prompts[0]):
        if not r.exited:
            assert r.token_ids == g.token_ids
            continue
        exited += 1
        i = r.exit.index
        assert r.token_ids[: i + 1] == g.token_ids[: i + 1]  # identical text up to the split token
        assert r.token_ids[i] == brk and r.token_ids[i + 1] == close  # then </think>
        assert extract_answer(r.text) is not None  # then an answer
        assert r.think_tokens == i + 1 <= g.think_tokens  # (= when greedy closed there anyway)
    assert exited >= N_PROMPTS // 2
    saved = 1 - sum(r.think_tokens for r in spec_on) / sum(g.think_tokens for g in greedy)
    assert saved > 0.3, saved
    acc_on = sum(grade(r.text, p.answer) for r, p in zip(spec_on, prompts[0]))
    acc_off = sum(grade(g.text, p.answer) for g, p in zip(greedy, prompts[0]))
    assert acc_on >= acc_off - 3


def test_exit_decision_depends_only_on_text(engines, spec_on):
    """Replaying the committed tokens and their signals through the pure policy gives the same exit."""
    tok = engines["tok"]
    eng = engines["spec"]
    for r in spec_on:
        if not r.exited:
            continue
        n = r.exit.index + 1
        d = decide(
            r.token_ids[:n],
            r.signals[:n] + [(0.0, 0.0, 1e9)] * (n - len(r.signals[:n])),
            ExitConfig(),
            split_token_ids=eng.split_ids,
            think_start_id=tok.convert_tokens_to_ids("<think>"),
            think_end_id=tok.convert_tokens_to_ids("</think>"),
        )
        assert d == r.exit


def test_speculation_depth_does_not_change_the_exit(engines, teacher, prompts, spec_on):
    """Different acceptance patterns (k = 1 vs 3) -> same text and same exit position."""
    model, tok = teacher
    eng1 = ReferenceEngine(model, tok, engines["spec"].draft, num_speculative_tokens=1)
    res = eng1.generate([GenerationRequest(p, max_tokens=400) for p in prompts[1][:12]])
    for a, b in zip(res, spec_on[:12]):
        assert a.token_ids == b.token_ids
        assert (a.exit.index if a.exit else None) == (b.exit.index if b.exit else None)


def test_batch_mixes_per_request_settings(engines, prompts, greedy, spec_on):
    reqs = []
    for i, p in enumerate(prompts[1][:6]):
        ex = [None, OFF, ExitConfig(confidence_threshold=0.99, progress_threshold=0.9, remaining_threshold=5)][i % 3]
        reqs.append(GenerationRequest(p, max_tokens=400, exit=ex))
    res = engines["spec"].generate(reqs)
    for i, r in enumerate(res):
        if i % 3 == 0:
            assert r.token_ids == spec_on[i].token_ids
        elif i % 3 == 1:
            assert r.token_ids == greedy[i].token_ids and not r.exited
        else:  # stricter thresholds never exit earlier than the defaults
            assert r.think_tokens >= spec_on[i].think_tokens


def test_sampled_generation_is_seeded_and_finishes(engines, prompts):
    reqs = [GenerationRequest(p, max_tokens=400, temperature=0.6, seed=7, exit=OFF) for p in prompts[1][:4]]
    a = engines["spec"].generate(reqs)
    b = engines["spec"].generate(reqs)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert all(r.finish_reason == "stop" for r in a)


def test_max_think_tokens_forces_close(engines, prompts):
    r = engines["spec"].generate(
        [GenerationRequest(prompts[1][0], max_tokens=400, exit=ExitConfig(max_think_tokens=10))]
    )[0]
    assert r.exit.reason == "max_think_tokens" and r.think_tokens == 10
    assert r.token_ids[10] == engines["tok"].convert_tokens_to_ids("</think>")


def test_bench_reference_cli_json(capsys):
    """`specexit bench reference --n 1 --json`: the `bench vllm` methods and keys on this engine,
    the last line of stdout one JSON object."""
    import json

    from specexit_app.cli import main as specexit_main

    assert specexit_main(["bench", "reference", "--n", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(res["methods"]) == ["eagle3", "specexit_never_fires", "specexit"] and res["n"] == 1
    for m in res["methods"].values():
        assert set(m) == {"accuracy", "think_tokens", "latency_s", "latency_s_c16", "tokens", "acceptance_length"}
        assert m["latency_s_c16"] is None and 1.0 < m["acceptance_length"] <= 4.0
    assert set(res["ratios"]) == {
        "speedup_c1_specexit_vs_eagle3",
        "speedup_c16_specexit_vs_eagle3",
        "think_tokens_specexit_vs_eagle3",
        "overhead_never_fires_vs_eagle3_c1",
        "accuracy_delta_points",
    }
    eagle3, never, spec = (res["methods"][m] for m in ("eagle3", "specexit_never_fires", "specexit"))
    assert never["tokens"] == eagle3["tokens"] and never["acceptance_length"] == eagle3["acceptance_length"]
    assert spec["think_tokens"] <= eagle3["think_tokens"]  # the exit only ever shortens thinking
