"""The TokenSwift loop reproduces plain decoding: greedy token for token (penalty off and on, partial KV
reselecting, heads and n-grams drafting), on the toy teacher and a tiny random Llama."""

import pytest
import torch

from specexit_core.longgen.engine import LongGenConfig, LongGenEngine
from specexit_core.longgen.heads import heads_for
from specexit_core.longgen.partial_kv import PartialKVConfig
from specexit_core.longgen.penalty import PenaltyConfig
from specexit_core.longgen.plain import plain_decode
from support.tiny_lm import tiny_lm


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls on a shared 2-core machine: threads only contend
    yield
    torch.set_num_threads(n)


SMALL_KV = LongGenConfig(partial_kv=PartialKVConfig(budget=48, sinks=4, room=8))  # reselects every ~8 tokens


@pytest.fixture(scope="module")
def toy():
    from specexit_core.toy import task
    from specexit_core.toy.hf_generate import load_teacher
    from specexit_core.toy.paths import TEACHER_DIR
    from specexit_core.toy.teacher_eval import prompt_ids

    model, tok = load_teacher(TEACHER_DIR)
    return model, prompt_ids(tok, task.problems("test", 1)[0])


def _random_heads(target, seed=0):
    heads = heads_for(target)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for h in heads.heads:
            h.proj.weight.copy_(torch.randn(h.proj.weight.shape, generator=g) * 0.05)
    return heads


@pytest.mark.parametrize("penalty", [PenaltyConfig(theta=1.0), PenaltyConfig(theta=1.3, window=24)])
def test_toy_greedy_identical_to_plain(toy, penalty):
    model, prompt = toy
    eng = LongGenEngine(model, None, SMALL_KV)
    want = plain_decode(eng.target, prompt, 120, penalty=penalty, use_hf=True).token_ids
    got = eng.generate(prompt, 120, penalty=penalty)
    assert got.token_ids == want
    s = got.stats
    assert s.selections >= 2 and s.draft_kv_max <= 48  # the partial cache was used and reselected
    assert s.tokens_per_forward > 1.5  # the n-gram branches pay off on the toy's repetitive output
    assert s.rounds == s.draft_forwards and s.accepted + s.rounds + 1 >= 120  # + the prefill token


def test_toy_greedy_identical_with_heads_and_eos(toy):
    model, prompt = toy
    eng = LongGenEngine(model, None, SMALL_KV)
    eng.heads = _random_heads(eng.target)
    want = plain_decode(eng.target, prompt, 120, stop_at_eos=True, use_hf=True).token_ids
    got = eng.generate(prompt, 120, stop_at_eos=True)
    assert got.token_ids == want and 0 < len(want) < 120  # the trace ended at EOS


@pytest.mark.parametrize("penalty", [PenaltyConfig(theta=1.0), PenaltyConfig(theta=1.5, window=16)])
def test_tiny_llama_greedy_identical_with_heads(penalty):
    model = tiny_lm("llama", vocab=64, seed=3)
    eng = LongGenEngine(model, None, LongGenConfig(partial_kv=PartialKVConfig(budget=32, sinks=2, room=6)))
    eng.heads = _random_heads(eng.target, seed=1)
    prompt = [5, 17, 3, 40, 22, 9, 1, 30]
    want = plain_decode(eng.target, prompt, 100, penalty=penalty, use_hf=True).token_ids
    assert eng.generate(prompt, 100, penalty=penalty).token_ids == want


def test_sampling_runs_to_length_and_is_reproducible(toy):
    model, prompt = toy
    eng = LongGenEngine(model, None, SMALL_KV)
    pen = PenaltyConfig(theta=1.2, window=32)
    a = eng.generate(prompt, 48, temperature=0.8, seed=7, penalty=pen)
    b = eng.generate(prompt, 48, temperature=0.8, seed=7, penalty=pen)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 48
    assert a.stats.tokens_per_forward >= 1.0
