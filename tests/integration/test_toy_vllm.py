"""The toy teacher in a real vLLM engine (CPU build): loads and matches transformers' greedy output."""

import pytest

from specexit_core.toy.hf_generate import generate
from specexit_core.toy.paths import TEACHER_DIR
from specexit_core.toy.task import grade, problems
from specexit_core.toy.teacher_eval import prompt_ids

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def llm():
    from specexit_core.toy.vllm_generate import make_llm

    engine = make_llm(TEACHER_DIR)
    yield engine
    engine.llm_engine.engine_core.shutdown()  # in this process (apply_cpu_defaults): gives its memory back


def test_vllm_greedy_equals_transformers_greedy(llm, teacher):
    from specexit_core.toy.vllm_generate import vllm_generate

    model, tok = teacher
    ps = problems("test", 16, seed=3)
    prompts = [prompt_ids(tok, p) for p in ps]
    hf = generate(model, tok, prompts, max_new_tokens=400)
    vl = vllm_generate(llm, prompts, max_tokens=400)
    assert vl == hf
    assert sum(grade(tok.decode(o), p.answer) for o, p in zip(vl, ps)) >= 13


def test_vllm_chat_template_and_reasoning_tokens(llm):
    from vllm import SamplingParams

    out = llm.chat(
        [{"role": "user", "content": "Compute from left to right : 7 + 5 * 3 - 4"}],
        SamplingParams(max_tokens=300, temperature=0),
        use_tqdm=False,
    )
    text = out[0].outputs[0].text
    assert "</think>" in text and grade(text, 32)


def test_the_offline_engine_and_its_model_run_in_this_process(llm):
    """The CPU defaults (specexit_core/vllm_env.py `apply_cpu_defaults`): the offline engine's core is
    this process (no engine-core process importing torch and vLLM again), and the plugin's one-rank rule
    (specexit_core/vllm_plugin/cpu_uniprocess.py) runs the model there too, with no worker process; the
    greedy equality above ran on that layout."""
    import psutil
    from vllm.v1.engine.core_client import InprocClient

    assert isinstance(llm.llm_engine.engine_core, InprocClient)
    assert llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend == "uni"
    names = [p.name() for p in psutil.Process().children(recursive=True)]
    assert not [n for n in names if "EngineCore" in n or "Worker" in n], names
