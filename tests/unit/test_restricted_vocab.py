"""The compact teacher and its materialised full checkpoint are the same model (restricted_vocab.py):
the restricted softmax with the extra log(N_unused) class gives the dense model's exact probabilities."""

from __future__ import annotations

import json
import math

import pytest
import torch

from specexit_core.teachers.restricted_vocab import RestrictedVocab
from specexit_core.toy.teacher_model import TeacherArch

TINY = TeacherArch(
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    intermediate_size=64,
    max_position_embeddings=64,
)


def _tiny_pair(vocab: RestrictedVocab):
    """A random compact model and the dense model made from it by expanding the embedding."""
    from dataclasses import replace

    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    compact = Qwen3ForCausalLM(
        replace(TINY, vocab_size=vocab.n_used).hf_config(bos_token_id=0, eos_token_id=1, pad_token_id=2)
    ).eval()
    dense = Qwen3ForCausalLM(
        replace(TINY, vocab_size=vocab.full_size).hf_config(bos_token_id=0, eos_token_id=1, pad_token_id=2)
    ).eval()
    sd = dict(compact.state_dict())
    sd["model.embed_tokens.weight"] = vocab.expand_rows(sd["model.embed_tokens.weight"])
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    dense.load_state_dict(sd)
    return compact, dense


def test_restricted_softmax_equals_dense_softmax():
    vocab = RestrictedVocab((3, 5, 17, 40, 41, 99, 150), full_size=160)
    compact, dense = _tiny_pair(vocab)
    full_ids = torch.tensor([[5, 17, 3, 99, 41, 40, 150, 5]])
    with torch.no_grad():
        lp_compact = vocab.log_probs(compact(input_ids=vocab.to_compact(full_ids)).logits)
        lp_dense = torch.log_softmax(dense(input_ids=full_ids).logits.float(), dim=-1)
    used = torch.tensor(vocab.used_ids)
    unused = torch.ones(vocab.full_size, dtype=torch.bool)
    unused[used] = False
    torch.testing.assert_close(lp_compact[..., :-1], lp_dense[..., used], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        lp_compact[..., -1], torch.logsumexp(lp_dense[..., unused], dim=-1), atol=1e-5, rtol=1e-5
    )
    # every unused id carries logit 0 in the dense model (zero row, tied head)
    with torch.no_grad():
        assert float(dense(input_ids=full_ids).logits[..., unused].abs().max()) == 0.0
    assert math.isclose(vocab.unused_logit, math.log(160 - 7))


def test_restricted_vocab_rejects_ids_outside_it():
    vocab = RestrictedVocab((1, 4), full_size=10)
    assert vocab.to_compact(torch.tensor([4, 1])).tolist() == [1, 0]
    assert vocab.to_full(torch.tensor([1, 0])).tolist() == [4, 1]
    with pytest.raises(ValueError, match="outside"):
        vocab.to_compact(torch.tensor([2]))
    with pytest.raises(ValueError, match="sorted"):
        RestrictedVocab((4, 1), full_size=10)


def test_materialize_writes_the_dense_model(tmp_path):
    """materialize(): compact assets -> a folder AutoModelForCausalLM loads, same probabilities."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from specexit_core.teachers import qwen3_like as q3
    from specexit_core.teachers.build import BUILD_CONFIG, COMPACT_WEIGHTS, TEACHER_META, TeacherBuildConfig, hf_config
    from specexit_core.teachers.materialize import SOURCE_FILE, materialize

    tok = q3.load_tokenizer()
    ids = sorted({*tok("Compute 12 + 3 = 15.\n\n")["input_ids"], q3.THINK_START_ID, q3.THINK_END_ID, 151643, 151645})
    vocab = RestrictedVocab(tuple(ids), q3.FULL_VOCAB_SIZE)
    cfg = TeacherBuildConfig(arch=TINY.__class__(**{**TINY.__dict__, "vocab_size": q3.FULL_VOCAB_SIZE}))
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    compact = Qwen3ForCausalLM(hf_config(q3.SPEC, cfg.arch, tok, vocab)).eval()
    assets = tmp_path / "assets"
    assets.mkdir()
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in compact.state_dict().items() if k != "lm_head.weight"}
    save_file(sd, str(assets / COMPACT_WEIGHTS))
    (assets / TEACHER_META).write_text(json.dumps({"used_ids": ids, "full_vocab_size": q3.FULL_VOCAB_SIZE}))
    (assets / BUILD_CONFIG).write_text(json.dumps(cfg.to_json()))
    compact.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)

    out = materialize(q3.SPEC, assets, tmp_path / "full")
    assert (out / SOURCE_FILE).exists() and (out / "tokenizer.json").exists()
    cfg_json = json.loads((out / "config.json").read_text())
    assert cfg_json["architectures"] == ["Qwen3ForCausalLM"] and cfg_json["vocab_size"] == q3.FULL_VOCAB_SIZE
    dense = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    x = torch.tensor([ids[:6]])
    with torch.no_grad():
        lp_c = vocab.log_probs(compact(input_ids=vocab.to_compact(x)).logits)
        lp_d = torch.log_softmax(dense(input_ids=x).logits.float(), dim=-1)
    # float32 sums over 151,936 exp terms in the dense softmax: agreement to ~1e-5 relative
    torch.testing.assert_close(lp_c[..., :-1], lp_d[..., torch.tensor(ids)], atol=1e-4, rtol=1e-4)
    assert materialize(q3.SPEC, assets, out) == out  # reused: same source weights
