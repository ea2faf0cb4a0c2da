"""The long-generation engine's parts: penalty windows, n-gram table, candidate tree, partial KV, heads."""

import pytest
import torch
from pydantic import ValidationError

from specexit_core.longgen.heads import DraftHeads, HeadsConfig, load_heads, save_heads
from specexit_core.longgen.ngram import NgramTable
from specexit_core.longgen.partial_kv import PartialKV, PartialKVConfig
from specexit_core.longgen.penalty import PenaltyConfig, penalise, tree_presence, window_presence
from specexit_core.longgen.target import KVCache
from specexit_core.longgen.tree import TreeConfig, build_tree

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_penalty_formula_and_windows():
    logits = torch.tensor([2.0, -2.0, 1.0, 0.0])
    present = torch.tensor([True, True, False, True])
    assert penalise(logits, present, 2.0).tolist() == [1.0, -4.0, 1.0, 0.0]
    assert window_presence([0, 1, 2, 3, 1], 5, 2).tolist() == [False, True, False, True, False]
    assert not PenaltyConfig(theta=1.0).enabled and PenaltyConfig().enabled
    seq, paths = [4, 0, 1, 2, 3], [[], [1], [1, 0], [2, 2, 2]]
    got = tree_presence(seq, paths, 5, 3)
    for row, path in zip(got, paths):  # each node's window is the last W tokens of seq + its path
        assert row.tolist() == window_presence(seq + path, 5, 3).tolist()


def test_ngram_table_counts_continuations_within_the_fed_prefix():
    seq = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 5, 1, 9]
    t = NgramTable()
    t.feed_until(seq, 8)  # 4-grams inside seq[:8] only
    assert t.candidates(1, 5) == [(2, 3, 5), (2, 3, 4)]  # equal counts: the most recent first
    t.feed_until(seq, 8)  # idempotent
    t.feed_until(seq, 12)
    assert t.candidates(1, 5) == [(2, 3, 5), (2, 3, 4)]
    assert t.counts[1][(2, 3, 5)] == 2 and t.counts[1][(2, 3, 4)] == 1
    assert t.candidates(9, 3) == [] and t.candidates(1, 1) == [(2, 3, 5)]


def test_tree_is_a_trie_of_draft_products_and_ngram_branches():
    V = 10
    draft = torch.zeros(4, V)
    for d, order in enumerate([[7], [1, 2, 3], [4, 5, 6], [8, 9, 0]]):
        for r, tok in enumerate(order):
            draft[d, tok] = 10.0 - r
    ng = NgramTable()
    ng.feed_until([7, 1, 4, 8, 7, 3, 3, 3], 8)
    tree = build_tree(5, draft, TreeConfig(), ng)
    # the 1-3-3-3 product, + (3, 3, 3) under 7 (7 -> 3 exists: 2 new nodes; 7 1 4 8 exists whole)
    assert len(tree) == 1 + 1 + 3 + 9 + 27 + 2
    assert tree.tokens[0] == 5 and tree.children[0] == {7: 1}
    for kids in tree.children:  # siblings carry distinct tokens by construction (dict keys), each once
        assert len(set(kids.values())) == len(kids)
    mask = tree.attention_mask()
    for n in range(len(tree)):
        anc = {n}
        p = tree.parents[n]
        while p >= 0:
            anc.add(p)
            p = tree.parents[p]
        assert set(torch.nonzero(mask[n]).flatten().tolist()) == anc
    assert len(build_tree(5, draft, TreeConfig(ngram_top_k=0), ng)) == 41


def _full(k: torch.Tensor) -> KVCache:
    cache = KVCache(1, k.shape[0], k.shape[2], k.dtype, "cpu", capacity=2)
    cache.append(0, k, k + 1)
    cache.commit()
    return cache


def test_partial_kv_keeps_sinks_and_top_scoring_positions_per_kv_head():
    g = torch.Generator().manual_seed(0)
    cfg = PartialKVConfig(budget=12, sinks=2, room=4)  # keep 8: 2 sinks + top 6
    k = torch.randn(2, 30, 4, generator=g)  # 2 KV heads, 30 positions
    q = torch.randn(4, 1, 4, generator=g)  # 4 query heads: GQA groups of 2
    full = _full(k)
    pkv = PartialKV(cfg, 1)
    sel_k, sel_v = pkv.layer(0, q, full)
    for h in range(2):
        score = (q[2 * h : 2 * h + 2, 0] @ k[h].T).sum(0)
        want = [0, 1] + sorted((score[2:].topk(6).indices + 2).tolist())
        torch.testing.assert_close(sel_k[h], k[h, want])
        torch.testing.assert_close(sel_v[h], k[h, want] + 1)
    assert pkv.size == 8 and not pkv.stale and pkv.covered == 30
    full.append(0, torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g))
    full.commit()
    pkv.append_from(full)
    assert pkv.size == 11 and not pkv.stale
    full.append(0, torch.randn(2, 1, 4, generator=g), torch.randn(2, 1, 4, generator=g))
    full.commit()
    pkv.append_from(full)
    assert pkv.stale  # room (4) appended: the budget is full, the next draft forward reselects
    pkv.layer(0, q, full)
    assert pkv.size == 8 and pkv.selections == 2


def test_partial_kv_is_the_full_cache_while_it_fits():
    k = torch.randn(2, 5, 4)
    pkv = PartialKV(PartialKVConfig(budget=12, sinks=2, room=4), 1)
    sel_k, _ = pkv.layer(0, torch.randn(4, 1, 4), _full(k))
    torch.testing.assert_close(sel_k, k)
    with pytest.raises(ValidationError):
        PartialKVConfig(budget=10, sinks=4, room=6)


def test_heads_save_load_round_trip(tmp_path):
    cfg = HeadsConfig(hidden_size=8, num_heads=3)
    heads = DraftHeads(cfg)
    lm_head = torch.nn.Linear(8, 11, bias=False)
    h = torch.randn(2, 8)
    # fresh heads (zero projections) predict what the shared LM head predicts from the normed state
    out = heads(h, lm_head)
    assert out.shape == (3, 2, 11)
    torch.testing.assert_close(out[2], lm_head(heads.heads[2].norm_out(h)))
    for p in heads.parameters():
        torch.nn.init.normal_(p)
    save_heads(heads, tmp_path / "heads")
    again = load_heads(tmp_path / "heads")
    assert again.cfg == cfg
    torch.testing.assert_close(again(h, lm_head), heads(h, lm_head))


def test_head_training_lowers_the_loss_and_labels_are_shifted():
    from specexit_core.longgen.target import Target
    from specexit_core.longgen.train_heads import IGNORE, HeadTrainConfig, collect_features, train_heads
    from support.tiny_lm import tiny_lm

    tg = Target(tiny_lm("llama", vocab=32, seed=0, layers=1))
    seqs = [[(3 * i + j) % 31 for i in range(40)] for j in range(4)]  # periodic: learnable far ahead
    feats, labels = collect_features(tg, seqs[:1], 3)
    assert feats.shape == (40, 64) and labels.shape == (3, 40)
    assert labels[0, :38].tolist() == seqs[0][2:] and labels[2, 36:].tolist() == [IGNORE] * 4
    heads, info = train_heads(tg, seqs, HeadTrainConfig(steps=60, batch_positions=64, lr=1e-2))
    assert info["loss_last"] < 0.5 * info["loss_first"]
