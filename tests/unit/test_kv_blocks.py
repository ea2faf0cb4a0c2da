"""KV cache: prefix-block keys, the block file format, the host tier's LRU budget, block copies."""

import pytest
import torch

from specexit_core.kv_cache import block_file
from specexit_core.kv_cache.block_copy import BlockLayout
from specexit_core.kv_cache.block_keys import model_fingerprint, namespace, prefix_block_keys
from specexit_core.kv_cache.host_tier import HostTier

NS = namespace({"model": "toy", "block_size": 4})


def test_key_depends_on_every_earlier_token_and_the_model():
    a = prefix_block_keys(NS, list(range(12)), 4)
    assert len(a) == 3 and len(set(a)) == 3
    b = prefix_block_keys(NS, [99] + list(range(1, 12)), 4)  # first token differs
    assert all(x != y for x, y in zip(a, b))
    c = prefix_block_keys(NS, list(range(8)) + [0, 0, 0, 0], 4)  # only the last block differs
    assert c[:2] == a[:2] and c[2] != a[2]
    other = prefix_block_keys(namespace({"model": "other", "block_size": 4}), list(range(12)), 4)
    assert set(other).isdisjoint(a)
    assert prefix_block_keys(NS, list(range(12)), 4, salt="s")[0] != a[0]
    assert prefix_block_keys(NS, list(range(13)), 4) == a  # a partial block has no key
    assert namespace({"a": 1, "b": 2}) == namespace({"b": 2, "a": 1})


def test_model_fingerprint_is_path_independent(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text('{"x": 1}')
        (tmp_path / name / "model.safetensors").write_bytes(b"0" * 10)
    assert model_fingerprint(str(tmp_path / "a")) == model_fingerprint(str(tmp_path / "b"))
    (tmp_path / "b" / "config.json").write_text('{"x": 2}')
    assert model_fingerprint(str(tmp_path / "a")) != model_fingerprint(str(tmp_path / "b"))
    assert model_fingerprint("org/model") == "org/model"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_block_file_round_trip(dtype):
    t = torch.randn(4, 1, 2, 8, 16).to(dtype)
    assert torch.equal(block_file.decode(block_file.encode(t)), t)


def test_block_file_rejects_truncated_corrupt_and_foreign_data():
    data = block_file.encode(torch.randn(2, 3, 4))
    with pytest.raises(block_file.CorruptBlock):
        block_file.decode(data[:-1])
    with pytest.raises(block_file.CorruptBlock):
        block_file.decode(data[:10])
    flipped = bytearray(data)
    flipped[-5] ^= 0xFF
    with pytest.raises(block_file.CorruptBlock, match="checksum"):
        block_file.decode(bytes(flipped))
    with pytest.raises(block_file.CorruptBlock):
        block_file.decode(b"x" * len(data))


def test_host_tier_keeps_the_most_recently_used_within_budget():
    one = torch.zeros(256, dtype=torch.uint8)  # 256 bytes
    tier = HostTier(budget_bytes=3 * 256)
    for k in "abc":
        assert tier.put(k, one.clone()) == []
    assert tier.get("a") is not None  # a is now most recent: b goes first
    assert tier.put("d", one.clone()) == ["b"]
    assert "b" not in tier and all(k in tier for k in "acd")
    assert tier.used_bytes == 3 * 256
    assert tier.put("huge", torch.zeros(1024, dtype=torch.uint8)) == []  # larger than the budget: not kept
    assert "huge" not in tier and len(tier) == 3


def test_block_layout_gathers_and_scatters_whole_blocks():
    # CPU backend layout: [num_blocks, kv heads, block size, 2 * head size], one tensor per layer
    caches = {f"layer.{i}": torch.randn(6, 2, 4, 8) for i in range(3)}
    layout = BlockLayout(caches, num_blocks=6)
    block = layout.gather(2)
    assert block.shape == (3, 1, 2, 4, 8)
    caches["layer.0"][2].zero_()  # the gathered copy is independent of the paged block
    assert not torch.equal(block[0, 0], caches["layer.0"][2])
    layout.scatter(5, block)
    assert torch.equal(caches["layer.1"][5], block[1, 0])
    assert not layout.fits(torch.zeros(3, 1, 2, 4, 9))
    with pytest.raises(ValueError):
        layout.scatter(0, torch.zeros(3, 1, 2, 4, 9))
    # kernel blocks smaller than manager blocks: two rows per manager block
    split = BlockLayout({"l": torch.arange(24.0).reshape(12, 2)}, num_blocks=6)
    assert torch.equal(split.gather(1)[0], torch.tensor([[4.0, 5.0], [6.0, 7.0]]))
    with pytest.raises(ValueError):
        BlockLayout({"a": torch.zeros(6, 2), "b": torch.zeros(6, 3)}, num_blocks=6)
