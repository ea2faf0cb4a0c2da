"""The r1-llama-like teacher: R1's template renders the realistic traces as R1-Distill writes them
(the prompt opens `<think>\\n`, the completion is thinking + `\\n</think>\\n\\n` + answer + eos), vLLM's
`deepseek_r1` parser splits that text, and a tiny build -> materialise -> transformers round trip
gives the dense full-vocabulary model the compact one trained."""

from __future__ import annotations

import json
import random

import pytest
import torch

from specexit_core.teachers import r1_llama_like as r1
from specexit_core.teachers.check import well_formed
from specexit_core.teachers.realistic_traces import RealisticStyle
from specexit_core.toy.task import problems

SPEC = r1.SPEC
EOS = "<｜end▁of▁sentence｜>"


@pytest.fixture(scope="module")
def tok():
    return SPEC.load_tokenizer()


def test_template_renders_the_r1_thinking_format(tok):
    p = problems("test", 1)[0]
    prompt, completion = SPEC.render_example(tok, p, random.Random(0), RealisticStyle())
    assert prompt == f"<｜begin▁of▁sentence｜><｜User｜>{p.prompt}<｜Assistant｜><think>\n"
    assert not completion.startswith("<think>") and completion.endswith(EOS)
    think, answer = completion[: -len(EOS)].split("\n</think>\n\n")
    assert "\n\n" in think and not think.startswith("\n") and str(p.answer) in answer
    ids, plen = SPEC.encode_example(tok, prompt, completion)
    assert ids[0] == 128000 and ids[plen - 2 : plen] == [r1.THINK_START_ID, 198]  # "<think>", "\n"
    assert r1.THINK_START_ID not in ids[plen:] and ids[plen:].count(r1.THINK_END_ID) == 1
    assert ids[-1] == tok.eos_token_id == 128001
    assert well_formed(SPEC, ids[plen:-1], tok)  # the generated ids stop before eos


def test_well_formed_knows_the_r1_shape(tok):
    think, end, ans = tok.encode("a.\n\nb", add_special_tokens=False), r1.THINK_END_ID, tok.encode("7")[1:]
    assert well_formed(SPEC, [*think, end, *ans], tok)
    assert not well_formed(SPEC, [r1.THINK_START_ID, *think, end, *ans], tok)  # a second <think>
    assert not well_formed(SPEC, [*think, end], tok)  # no answer
    assert not well_formed(SPEC, [*think, end, *ans, end], tok)


def test_deepseek_r1_parser_splits_a_rendered_completion(tok):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager

    p = problems("test", 1, seed=2)[0]
    prompt, completion = SPEC.render_example(tok, p, random.Random(1), RealisticStyle())
    ids, plen = SPEC.encode_example(tok, prompt, completion)
    text = tok.decode(ids[plen:], skip_special_tokens=True)  # what vLLM hands the parser
    parser = ReasoningParserManager.get_reasoning_parser(SPEC.reasoning_parser)(tok)
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": p.prompt}])
    reasoning, content = parser.extract_reasoning(text, req)
    assert reasoning.strip() == completion.split("\n</think>")[0].strip()
    assert content.strip() == completion.split("\n</think>\n\n")[1][: -len(EOS)].strip()


TINY_ARCH = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "intermediate_size": 64,
}


def test_tiny_build_materialise_load_round_trip(tok, tmp_path, one_torch_thread):
    """build (2 steps of 2 sequences, a tiny shape) -> materialize -> LlamaForCausalLM: the dense
    128,256-row model's probabilities equal the compact model's restricted ones."""
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    from specexit_core.teachers.build import COMPACT_WEIGHTS, TEACHER_META, build, hf_config, load_build_config
    from specexit_core.teachers.materialize import load_vocab, materialize

    cfg = load_build_config(SPEC, {"steps": 2, "batch_size": 2, "log_every": 1, "threads": 1, "arch": TINY_ARCH})
    assets = build(SPEC, cfg, tmp_path / "assets")
    meta = json.loads((assets / TEACHER_META).read_text())
    assert meta["name"] == r1.NAME and meta["full_vocab_size"] == r1.FULL_VOCAB_SIZE == 128256
    vocab = load_vocab(assets)
    assert {r1.THINK_START_ID, r1.THINK_END_ID, 128000, 128001, 128015} <= set(vocab.used_ids)

    full = materialize(SPEC, assets, tmp_path / "full")
    cfg_json = json.loads((full / "config.json").read_text())
    assert cfg_json["architectures"] == ["LlamaForCausalLM"] and cfg_json["vocab_size"] == 128256
    assert (cfg_json["bos_token_id"], cfg_json["eos_token_id"], cfg_json["pad_token_id"]) == (128000, 128001, 128015)
    assert cfg_json["tie_word_embeddings"] and (full / "tokenizer.json").exists()
    dense = LlamaForCausalLM.from_pretrained(str(full), dtype=torch.float32).eval()

    compact = LlamaForCausalLM(hf_config(SPEC, cfg.arch, tok, vocab)).eval()
    compact.load_state_dict({k: v.float() for k, v in load_file(str(assets / COMPACT_WEIGHTS)).items()}, strict=False)
    compact.tie_weights()
    p = problems("test", 1)[0]
    ids, _ = SPEC.encode_example(tok, *SPEC.render_example(tok, p, random.Random(0), RealisticStyle()))
    x = torch.tensor([ids[:48]])
    with torch.no_grad():
        lp_c = vocab.log_probs(compact(input_ids=vocab.to_compact(x)).logits)
        lp_d = torch.log_softmax(dense(input_ids=x).logits.float(), dim=-1)
    torch.testing.assert_close(lp_c[..., :-1], lp_d[..., torch.tensor(vocab.used_ids)], atol=1e-4, rtol=1e-4)
    gen = dense.generate(x[:, :20], max_new_tokens=3, do_sample=False)
    assert gen.shape[1] == 23
