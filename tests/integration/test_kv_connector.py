"""The tiered KV connector in real vLLM CPU engines with the toy teacher: two short engine starts
sharing one directory tier simulate a replica restart.

Engine A (empty directory: it loads nothing, so it computes every prompt token as an engine without
the connector would) serves a long shared prompt and three fault prompts, and writes their blocks.
Between the engines three of the fault prompts' block files are damaged (a flipped byte, a
truncated file, a deleted file). Engine B then serves the same prompts: the shared prompt's blocks
come from the directory tier and the damaged blocks are recomputed; every output is token-identical.
"""

import json
import time

import pytest

from specexit_core.kv_cache.block_keys import prefix_block_keys
from specexit_core.kv_cache.directory_tier import DirectoryTier
from specexit_core.kv_cache.settings import kv_transfer_config
from specexit_core.toy.paths import TEACHER_DIR
from specexit_core.toy.task import problems
from specexit_core.toy.teacher_eval import prompt_ids

pytestmark = pytest.mark.vllm

BLOCK = 32  # the CPU backend's smallest block size (multiples of 32); the toy has 512 positions
PREFIX_BLOCKS = 12
MAX_TOKENS = 40
SHARD = "tp0-pp0"


def _prompts():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TEACHER_DIR))
    qs = [prompt_ids(tok, p) for p in problems("test", 100, seed=11)]  # ~24 tokens each

    def history(start):  # earlier turns: whole toy prompts, cut at a block boundary
        ids = []
        for q in qs[start:]:
            ids += q
            if len(ids) >= PREFIX_BLOCKS * BLOCK:
                return ids[: PREFIX_BLOCKS * BLOCK]
        raise AssertionError("not enough toy prompts")

    shared = history(0)
    restart = [shared + qs[90 + i] for i in range(4)]  # one long shared prompt, four new questions
    faults = [history(20 * (i + 1)) + qs[95 + i] for i in range(3)]  # own prefixes: flip, truncate, delete
    return restart, faults


def _run(llm, prompts):
    from vllm import SamplingParams

    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=MAX_TOKENS, temperature=0), use_tqdm=False
    )
    return [list(o.outputs[0].token_ids) for o in outs], [len(p) - o.num_cached_tokens for p, o in zip(prompts, outs)]


def _stats(stats_dir):
    (f,) = stats_dir.glob("kv-stats-*.json")
    return json.loads(f.read_text())


def _engine(directory, stats_dir):
    from specexit_core.toy.vllm_generate import make_llm

    cfg = kv_transfer_config(str(directory), stats_dir=str(stats_dir), host_bytes=64 << 20)
    return make_llm(TEACHER_DIR, block_size=BLOCK, kv_transfer_config=cfg)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("kv")
    directory = root / "blocks"
    restart, faults = _prompts()
    res = {"restart_prompts": restart}

    llm = _engine(directory, root / "stats_a")
    # the long prompt's first request alone, then three more that share its prefix (local prefix-cache
    # hits, in both engines: the connector matters for the first one)
    res["a_first"], res["a_first_prefill"] = _run(llm, restart[:1])
    res["a_rest"], _ = _run(llm, restart[1:])
    res["a_faults"], _ = _run(llm, faults)
    res["a_stats"] = stats_a = _stats(root / "stats_a")
    tier = DirectoryTier(directory, SHARD)
    keys = {k for p in restart + faults for k in prefix_block_keys(stats_a["namespace"], p, BLOCK)}
    deadline = time.monotonic() + 60
    while not all(tier.contains(k) for k in keys) and time.monotonic() < deadline:
        time.sleep(0.2)  # the writer thread publishes in the background
    res["files_after_a"] = sum(tier.contains(k) for k in keys)
    res["blocks_needed"] = len(keys)
    llm.llm_engine.engine_core.shutdown()
    del llm

    # damage the fault prompts' files: block 3 of the first (a flipped byte), block 2 of the second
    # (truncated), block 1 of the third (deleted)
    fkeys = [prefix_block_keys(stats_a["namespace"], p, BLOCK) for p in faults]
    p = tier.path(fkeys[0][3])
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x40
    p.write_bytes(bytes(data))
    p = tier.path(fkeys[1][2])
    p.write_bytes(p.read_bytes()[:1000])
    tier.path(fkeys[2][1]).unlink()

    llm = _engine(directory, root / "stats_b")
    res["b_first"], res["b_first_prefill"] = _run(llm, restart[:1])
    res["b_stats_restart"] = _stats(root / "stats_b")
    res["b_rest"], _ = _run(llm, restart[1:])
    res["b_faults"], res["b_faults_prefill"] = _run(llm, faults)
    res["b_stats"] = _stats(root / "stats_b")
    llm.llm_engine.engine_core.shutdown()
    del llm
    return res


def test_after_a_restart_the_shared_prompt_loads_from_the_directory_with_identical_output(runs):
    a = runs["a_stats"]["scheduler"]
    assert a["matched_blocks_host"] + a["matched_blocks_directory"] == 0  # engine A computed everything
    assert runs["files_after_a"] == runs["blocks_needed"]
    s = runs["b_stats_restart"]["scheduler"]  # after the first request of engine B
    prompt = runs["restart_prompts"][0]
    hit_share = s["matched_blocks_directory"] / s["prompt_blocks"]
    print(
        f"\nafter the restart: hit share {hit_share:.2f} ({s['matched_blocks_directory']}/{s['prompt_blocks']} full "
        f"blocks of a {len(prompt)}-token prompt from the directory tier); prefill tokens computed "
        f"{runs['b_first_prefill'][0]} vs {runs['a_first_prefill'][0]} before it (no blocks held)"
    )
    assert s["prompt_blocks"] == len(prompt) // BLOCK and hit_share >= 0.9
    assert runs["b_first_prefill"][0] <= len(prompt) - 0.9 * (len(prompt) // BLOCK) * BLOCK
    assert runs["a_first_prefill"][0] == len(prompt)
    assert runs["b_first"] == runs["a_first"] and runs["b_rest"] == runs["a_rest"]
    assert runs["b_stats_restart"]["worker"]["directory_hits"] == s["matched_blocks_directory"]


def test_damaged_block_files_are_recomputed_not_used(runs):
    w = runs["b_stats"]["worker"]
    assert runs["b_faults"] == runs["a_faults"]
    assert w["corrupt_files"] == 2 and w["load_failures"] == 2  # flipped byte, truncated file
    # the deleted block is simply not matched: the third prompt loads block 0 only
    assert runs["b_faults_prefill"][2] == len(_prompts()[1][2]) - BLOCK
