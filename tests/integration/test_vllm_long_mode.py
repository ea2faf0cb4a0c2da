"""The long mode inside a real vLLM engine (CPU build): the toy teacher + its shipped SpecExit draft.

N-gram reuse beside EAGLE-3 and the windowed contextual penalty, per request, in the same engine as
SpecExit. Lossless: greedy output equals EAGLE-3 without the mode and plain decoding (transformers'
own forward), with the penalty equal to plain decoding with the same penalty (longgen/plain.py).
"""

import pytest

from specexit_core.longgen.penalty import PenaltyConfig
from specexit_core.longgen.plain import plain_decode
from specexit_core.longgen.target import Target
from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR
from specexit_core.toy.task import problems
from specexit_core.toy.teacher_eval import prompt_ids
from specexit_core.vllm_env import apply_cpu_defaults, toy_llm_kwargs

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=1.5)]
MAX_TOKENS = 200
# `always`: every full n-gram match replaces EAGLE's drafts, so the n-gram path runs as often as it can
NGRAM_ONLY = {"specexit": False, "long": {"ngram": True, "ngram_min": 2, "ngram_policy": "always"}}
ADAPTIVE = {"specexit": False, "long": {"ngram": True, "ngram_min": 2}}  # the default policy


@pytest.fixture(scope="module")
def llm(telemetry_dir):
    apply_cpu_defaults()
    from vllm import LLM

    spec = {"method": "eagle3", "model": str(DRAFT_DIR), "num_speculative_tokens": 3}
    engine = LLM(**toy_llm_kwargs(str(TEACHER_DIR), speculative_config=spec))
    yield engine
    engine.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="module")
def prompts(teacher):
    _, tok = teacher
    return [prompt_ids(tok, p) for p in problems("test", 6, seed=21)]


def run(llm, prompts, extra_args, temperature=0.0, ignore_eos=True, max_tokens=MAX_TOKENS):
    from vllm import SamplingParams

    sps = extra_args if isinstance(extra_args, list) else [extra_args] * len(prompts)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        [
            SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=ignore_eos, extra_args=x)
            for x in sps
        ],
        use_tqdm=False,
    )
    return [list(o.outputs[0].token_ids) for o in outs]


def counters(llm) -> dict:
    return llm.collective_rpc("specexit_counters")[0]


def test_ngram_reuse_is_lossless_and_drafts(llm, prompts, teacher):
    """EOS ignored, 200 tokens: the toy repeats itself after its answer, so n-grams find matches."""
    model, _ = teacher
    target = Target(model)
    before = counters(llm)
    got = run(llm, prompts, NGRAM_ONLY)
    after = counters(llm)
    eagle = run(llm, prompts, {"specexit": False})
    assert got == eagle
    assert run(llm, prompts, ADAPTIVE) == eagle
    for p, g in zip(prompts[:3], got):
        assert g == plain_decode(target, p, MAX_TOKENS, use_hf=True).token_ids
    drafted = after["long_ngram_drafted_tokens"] - before.get("long_ngram_drafted_tokens", 0)
    accepted = after["long_ngram_accepted_tokens"] - before.get("long_ngram_accepted_tokens", 0)
    assert drafted > 0 and 0 < accepted <= drafted
    assert after["long_hook_errors"] == 0 and after["long_fallbacks"] == 0


@pytest.mark.parametrize("penalty", [PenaltyConfig(theta=1.3, window=48), PenaltyConfig(theta=1.5, window=4)])
def test_penalty_equals_plain_penalised_decoding(llm, prompts, teacher, penalty):
    """Window 4 with 3 drafts: row j's window is mostly drafts 1..j, so a row penalised with the
    wrong context (without its drafts, or with its own token) changes the output."""
    model, _ = teacher
    target = Target(model)
    pen = {"theta": penalty.theta, "window": penalty.window}
    got = run(llm, prompts[:3], {"specexit": False, "long": {"ngram": True, "penalty": pen}})
    plain = run(llm, prompts[:3], {"specexit": False})
    for p, g in zip(prompts[:3], got):
        assert g == plain_decode(target, p, MAX_TOKENS, penalty=penalty, use_hf=True).token_ids
    assert got != plain  # the penalty changed the output (a missing penalty would not pass)
    # the penalty alone (no n-gram), through the flat xargs form
    flat = {
        "specexit": False,
        "long_ngram": 0,
        "long_penalty_theta": penalty.theta,
        "long_penalty_window": penalty.window,
    }
    assert run(llm, prompts[:3], flat) == got


def test_specexit_exit_fires_with_long_mode(llm, prompts, teacher, telemetry_dir):
    from specexit_core.vllm_plugin.telemetry import read_exit_events, read_long_events

    _, tok = teacher
    close = tok.convert_tokens_to_ids("</think>")
    sub = prompts[:4]
    spec_only = run(llm, sub, None, ignore_eos=False, max_tokens=400)
    with_long = run(llm, sub, {"long": True}, ignore_eos=False, max_tokens=400)
    assert with_long == spec_only  # SpecExit's forced `</think>` survives the n-gram drafts
    exits = read_exit_events(telemetry_dir)
    assert exits and any(close in ids for ids in with_long)
    run(llm, sub[:1], None, max_tokens=2)  # one more step: the worker writes finished requests' events
    events = read_long_events(telemetry_dir)
    assert len(events) >= len(sub)
    ev = next(iter(events.values()))
    assert {"ngram_drafted_tokens", "eagle_drafted_tokens", "ngram_accepted_tokens", "config"} <= set(ev)


def test_invalid_long_controls_are_rejected(llm, prompts):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match="long-mode control"):
        SamplingParams(max_tokens=5, extra_args={"long": {"ngram_min": 9, "ngram_max": 3}})
    with pytest.raises(VLLMValidationError, match="unknown long-mode control"):
        SamplingParams(max_tokens=5, extra_args={"long_bogus": 1})
    with pytest.raises(VLLMValidationError, match="theta"):
        SamplingParams(max_tokens=5, extra_args={"long_penalty_theta": -1})
    assert run(llm, prompts[:1], {"long": True}, max_tokens=5)[0]


SAMPLES, SAMPLE_TOKENS, TEMPERATURE = 300, 24, 0.6


def test_sampling_with_ngram_drafts_is_lossless(llm, prompts, teacher):
    """At T = 0.6 the long mode (n-gram drafts verified by vLLM's rejection sampler with
    draft_probs=None) samples the same continuations as EAGLE-3 alone: per-position token
    frequencies agree (permutation test, bench/token_distributions.py). Prefixes: a repetitive
    EOS-ignored trace (so n-grams match) cut where the teacher is least sure of the next token.
    Unseeded (see test_vllm_plugin.sample_positions): a lossless engine fails with probability ~0.1%."""
    import torch
    from vllm import SamplingParams

    from specexit_app.bench.token_distributions import position_matrix, same_distribution_test

    model, _ = teacher
    prefixes = []
    for p, out in zip(prompts[:3], run(llm, prompts[:3], {"specexit": False}, max_tokens=150)):
        seq = p + out
        with torch.inference_mode():
            probs = torch.softmax(model(torch.tensor([seq])).logits[0].float() / TEMPERATURE, -1)
        entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1)
        cut = len(p) + 60 + int(entropy[len(p) + 60 : len(seq) - 1].argmax()) + 1
        prefixes.append(seq[:cut])

    def sample(extra):
        sps = [
            SamplingParams(
                n=SAMPLES, temperature=TEMPERATURE, max_tokens=SAMPLE_TOKENS, ignore_eos=True, extra_args=extra
            )
            for _ in prefixes
        ]
        outs = llm.generate([{"prompt_token_ids": p} for p in prefixes], sps, use_tqdm=False)
        return [position_matrix([c.token_ids for c in o.outputs], SAMPLE_TOKENS) for o in outs]

    before = counters(llm)
    got = sample(NGRAM_ONLY)
    after = counters(llm)
    want = sample({"specexit": False})
    drafted = after["long_ngram_drafted_tokens"] - before.get("long_ngram_drafted_tokens", 0)
    accepted = after["long_ngram_accepted_tokens"] - before.get("long_ngram_accepted_tokens", 0)
    # not vacuous: the continuations vary, n-gram drafts ran and some were rejected (resampling ran)
    assert all(len({tuple(r) for r in m.tolist()}) >= 2 for m in want), "no randomness to test"
    assert 0 < accepted < drafted
    res = same_distribution_test(want, got)
    print(f"long (n-grams) vs EAGLE-3 alone at T = {TEMPERATURE}: {res.summary()}; n-gram {accepted}/{drafted}")
    assert res.p_value > 0.001, res.summary()
