"""The long-generation engine's own forward equals the transformers model's, also with a tree mask."""

import pytest
import torch

from specexit_core.longgen.target import Target
from support.tiny_lm import tiny_lm

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_forward_matches_transformers(arch):
    model = tiny_lm(arch)
    tg = Target(model)
    ids = torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        want = model(input_ids=torch.tensor([ids])).logits[0].float()
    cache = tg.new_cache(capacity=4)  # grows while appending
    got_a = tg.logits(tg.forward(ids[:12], list(range(12)), cache))
    cache.commit()
    got_b = tg.logits(tg.forward(ids[12:], list(range(12, 20)), cache))
    cache.commit()
    torch.testing.assert_close(torch.cat([got_a, got_b]), want, atol=1e-4, rtol=1e-4)
    assert cache.length == 20


def test_tree_mask_rows_equal_each_branch_run_causally():
    model = tiny_lm("qwen3")
    tg = Target(model)
    ctx = [3, 9, 4, 7, 1]
    # root 11 with two branches: 11 -> 5 -> 6 and 11 -> 8
    tokens, parents = [11, 5, 6, 8], [-1, 0, 1, 0]
    depths = [0, 1, 2, 1]
    mask = torch.zeros(4, 4, dtype=torch.bool)
    for i in range(4):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    cache = tg.new_cache()
    tg.forward(ctx, list(range(5)), cache)
    cache.commit()
    rows = tg.logits(tg.forward(tokens, [5 + d for d in depths], cache, tree_mask=mask))
    cache.commit(keep=[0, 3])  # keep the root and the branch 11 -> 8
    with torch.inference_mode():
        a = model(input_ids=torch.tensor([ctx + [11, 5, 6]])).logits[0, -3:].float()
        b = model(input_ids=torch.tensor([ctx + [11, 8]])).logits[0, -1].float()
    torch.testing.assert_close(rows[:3], a, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rows[3], b, atol=1e-4, rtol=1e-4)
    # the compacted cache continues the kept branch exactly
    nxt = tg.logits(tg.forward([2], [7], cache))
    with torch.inference_mode():
        c = model(input_ids=torch.tensor([ctx + [11, 8, 2]])).logits[0, -1].float()
    torch.testing.assert_close(nxt[0], c, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["qwen3", "qwen2"])
def test_sliding_window_forward_matches_transformers(arch):
    """Every layer windowed (the long writer's shape): chunked forwards over the cache, past the window,
    equal the model's own forward; a tree after the context too."""
    model = tiny_lm(arch, sliding_window=6)
    tg = Target(model)
    assert tg.window == 6
    ids = torch.randint(0, 64, (24,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.inference_mode():
        want = model(input_ids=torch.tensor([ids])).logits[0].float()
        full = tiny_lm(arch)  # the same weights without the window: the window must change the logits
        full.load_state_dict(model.state_dict())
        unwindowed = full(input_ids=torch.tensor([ids])).logits[0].float()
    assert not torch.allclose(want[8:], unwindowed[8:], atol=1e-3)
    cache = tg.new_cache(capacity=4)
    got = []
    for a, b in [(0, 9), (9, 10), (10, 17), (17, 24)]:
        got.append(tg.logits(tg.forward(ids[a:b], list(range(a, b)), cache)))
        cache.commit()
    torch.testing.assert_close(torch.cat(got), want, atol=1e-4, rtol=1e-4)
    # a two-branch tree after 20 tokens: each row equals its branch run causally
    cache = tg.new_cache()
    tg.forward(ids[:20], list(range(20)), cache)
    cache.commit()
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    rows = tg.logits(tg.forward([5, 6, 8], [20, 21, 21], cache, tree_mask=mask))
    with torch.inference_mode():
        a = model(input_ids=torch.tensor([ids[:20] + [5, 6]])).logits[0, -2:].float()
        b = model(input_ids=torch.tensor([ids[:20] + [5, 8]])).logits[0, -1].float()
    torch.testing.assert_close(rows[:2], a, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rows[2], b, atol=1e-4, rtol=1e-4)


def test_mixed_window_layers_are_refused():
    model = tiny_lm("qwen3", sliding_window=6, layers=2)
    model.config.layer_types = ["full_attention", "sliding_attention"]
    with pytest.raises(ValueError, match="mixed sliding-window"):
        Target(model)
