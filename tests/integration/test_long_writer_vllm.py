"""The long writer in a real vLLM engine (CPU build): loads at 20,480 positions with its sliding window, writes
a scored walk and matches plain greedy decoding on `longgen.target.Target` past the window (both engines mask
the same positions). Short here; 16K by hand (docs/longgen.md)."""

import pytest

pytestmark = [pytest.mark.vllm]

LENGTH = 1400  # past the 1,024-token window, so the window's edge is compared too


def test_vllm_loads_the_long_writer_and_writes_the_walk():
    import torch

    from specexit_app.long_writer_vllm import make_long_writer_llm, vllm_check
    from specexit_core.longgen.plain import plain_decode
    from specexit_core.longgen.target import Target
    from specexit_core.teachers.long_writer import load_long_writer
    from specexit_core.teachers.long_writer_task import prompts

    llm = make_long_writer_llm()
    try:
        res = vllm_check(llm, length=LENGTH, n_prompts=2, seed=1)
        assert llm.llm_engine.model_config.max_model_len == 20480
        assert llm.llm_engine.model_config.get_sliding_window() == 1024
    finally:  # the engine runs in this process (apply_cpu_defaults): its memory goes back at shutdown
        llm.llm_engine.engine_core.shutdown()
    assert all(r["tokens"] == LENGTH and r["correct"] >= 0.95 for r in res["prompts"])

    torch.set_num_threads(1)
    model, tok = load_long_writer()
    for p, r in zip(prompts("test", 2, seed=1), res["prompts"]):
        ref = plain_decode(Target(model), tok(p.text, add_special_tokens=False)["input_ids"], LENGTH).token_ids
        assert r["token_ids"] == ref
