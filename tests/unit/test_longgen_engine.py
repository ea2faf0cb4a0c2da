"""The TokenSwift loop reproduces plain decoding: greedy token for token (penalty off and on, partial KV
reselecting, heads and n-grams drafting), on the toy teacher and a tiny random Llama."""

import pytest
import torch

from specexit_core.longgen.engine import LongGenConfig, LongGenEngine
from specexit_core.longgen.heads import heads_for
from specexit_core.longgen.partial_kv import PartialKVConfig
from specexit_core.longgen.penalty import PenaltyConfig
from specexit_core.longgen.plain import plain_decode
from specexit_core.longgen.tree import TreeConfig
from support.tiny_lm import tiny_lm

pytestmark = pytest.mark.usefixtures("one_torch_thread")


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


def test_sampled_rounds_verify_against_the_penalised_target(monkeypatch):
    """Sampled losslessness of the whole loop = (verification is lossless, test_longgen_verify) + (every tree
    row the engine hands it is the plain decoder's penalised, tempered target distribution after that node)."""
    import specexit_core.longgen.engine as engine_mod
    from specexit_core.longgen.plain import next_token_logits

    model = tiny_lm("qwen3", vocab=48, seed=5)
    cfg = LongGenConfig(
        tree=TreeConfig(widths=[1, 2, 2], ngram_top_k=2), partial_kv=PartialKVConfig(budget=16, sinks=2, room=4)
    )
    eng = LongGenEngine(model, None, cfg)
    eng.heads = _random_heads(eng.target, seed=2)
    rounds = []
    real = engine_mod.verify_tree_sampled

    def record(tree, probs, gen):
        out = real(tree, probs, gen)
        rounds.append((tree, probs.clone(), out))
        return out

    monkeypatch.setattr(engine_mod, "verify_tree_sampled", record)
    prompt, temp, pen = [3, 8, 20, 8, 3, 11], 0.7, PenaltyConfig(theta=1.4, window=6)
    res = eng.generate(prompt, 24, temperature=temp, seed=1, penalty=pen)
    seq = prompt + res.token_ids[:1]
    for tree, probs, (path, nxt) in rounds[:3]:
        assert tree.tokens[0] == seq[-1]
        for n in range(len(tree)):
            ctx = seq + tree.path_tokens(n)
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([ctx])).logits[0, -1].float()
            want = torch.softmax(next_token_logits(logits, ctx, pen) / temp, -1)
            torch.testing.assert_close(probs[n], want, atol=1e-5, rtol=1e-4)
        seq = seq + [tree.tokens[i] for i in path] + [nxt]
    assert seq[len(prompt) :] == res.token_ids[: len(seq) - len(prompt)]


def test_sliding_window_greedy_identical_with_heads():
    """A windowed target (every layer sees 12 positions): plain decoding on the engine's forward equals the
    model's own (`use_hf`), and TokenSwift's rounds, whose drafts read the window, reproduce it."""
    model = tiny_lm("qwen3", vocab=64, seed=3, sliding_window=12)
    eng = LongGenEngine(model, None, LongGenConfig(partial_kv=PartialKVConfig(budget=32, sinks=2, room=6)))
    eng.heads = _random_heads(eng.target, seed=1)
    prompt = [5, 17, 3, 40, 22, 9, 1, 30]
    want = plain_decode(eng.target, prompt, 100, use_hf=True).token_ids
    assert plain_decode(eng.target, prompt, 100).token_ids == want
    got = eng.generate(prompt, 100)
    assert got.token_ids == want
    assert 0 < got.stats.draft_kv_max <= 11  # the window's cached positions, never the whole context
