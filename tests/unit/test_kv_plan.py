"""KV cache: the scheduler-side plan (what to load, what to save) and the connector's settings."""

import pytest

from specexit_core.kv_cache.block_keys import namespace, prefix_block_keys
from specexit_core.kv_cache.request_plan import RequestPlanner
from specexit_core.kv_cache.settings import CONNECTOR_MODULE, CONNECTOR_NAME, KVCacheSettings, kv_transfer_config

BS = 4
NS = namespace({"model": "toy"})


def planner(**kw):
    return RequestPlanner(NS, BS, **kw)


def test_match_counts_consecutive_held_blocks_and_leaves_the_last_token():
    prompt = list(range(17))  # 4 full blocks; the last token is always computed
    keys = prefix_block_keys(NS, prompt, BS)
    held = {keys[0]: "host", keys[1]: "directory", keys[3]: "directory"}  # keys[2] missing
    p = planner()
    p.track("r", prompt)
    assert p.match("r", len(prompt), 0, held.get) == 2 * BS
    assert p.match("r", len(prompt), BS, held.get) == 1 * BS  # block 0 is a local hit
    held[keys[2]] = "directory"
    assert p.match("r", len(prompt), 0, held.get) == 4 * BS
    p2 = planner()
    p2.track("s", prompt[:16])  # 16 tokens: only 3 blocks are loadable
    assert p2.match("s", 16, 0, held.get) == 3 * BS
    p3 = planner(keep_last_block=True)
    p3.track("t", prompt)
    assert p3.match("t", len(prompt), 0, held.get) == 3 * BS


def test_loads_after_alloc_and_saves_as_blocks_fill():
    prompt = list(range(18))  # 4 full blocks
    keys = prefix_block_keys(NS, prompt, BS)
    held = {keys[0]: "directory"}
    p = planner()
    p.track("r", prompt)
    assert p.match("r", 18, 0, held.get) == BS
    assert p.matched_tiers("r", BS) == ["directory"]
    ids = [10, 11, 12, 13, 14]
    p.after_alloc("r", ids, BS)
    # chunked prefill: 8 tokens this step (after the 4 loaded), the rest the next
    plan = p.step([("r", ids, BS)], [], {"r": 8}, held.get)
    assert plan.loads == {"r": [(10, keys[0])]}
    assert plan.saves == [(11, keys[1]), (12, keys[2])]
    plan = p.step([], [("r", None, False, 12)], {"r": 6}, held.get)
    assert plan.loads == {} and plan.saves == [(13, keys[3])]
    plan = p.step([], [("r", [15], False, 18)], {"r": 1}, held.get)  # decoding: nothing more
    assert plan.saves == []
    p.finish("r")
    assert p.step([], [("r", None, False, 19)], {"r": 1}, held.get).saves == []


def test_held_blocks_are_not_saved_again_and_untracked_requests_never():
    prompt = list(range(8))
    keys = prefix_block_keys(NS, prompt, BS)
    p = planner()
    p.track("r", prompt)
    p.untracked("u")
    plan = p.step([("r", [1, 2], 0), ("u", [3, 4], 0)], [], {"r": 8, "u": 8}, {keys[0]: "host"}.get)
    assert plan.saves == [(2, keys[1])]


def test_requests_sharing_a_prefix_in_one_step_save_it_once():
    prompt = list(range(8))
    keys = prefix_block_keys(NS, prompt, BS)
    p = planner()
    p.track("a", prompt)
    p.track("b", prompt)
    plan = p.step([("a", [1, 2], 0), ("b", [3, 4], 0)], [], {"a": 8, "b": 8}, lambda k: None)
    assert plan.saves == [(1, keys[0]), (2, keys[1])]


def test_resumed_request_replaces_its_blocks():
    prompt = list(range(8))
    keys = prefix_block_keys(NS, prompt, BS)
    p = planner()
    p.track("r", prompt)
    p.step([("r", [1, 2], 0)], [], {"r": 2}, lambda k: None)
    plan = p.step([], [("r", [7, 8], True, 0)], {"r": 8}, lambda k: None)  # preempted, resumed
    assert plan.saves == [(7, keys[0]), (8, keys[1])]


def test_kv_transfer_config_names_the_connector_and_recomputes_failures():
    cfg = kv_transfer_config("/shared/kv", host_bytes=1 << 20)
    assert cfg["kv_connector"] == CONNECTOR_NAME and cfg["kv_connector_module_path"] == CONNECTOR_MODULE
    assert cfg["kv_load_failure_policy"] == "recompute" and cfg["kv_role"] == "kv_both"
    assert cfg["kv_connector_extra_config"] == {"directory": "/shared/kv", "host_bytes": 1 << 20}
    with pytest.raises(ValueError, match="host_byte"):
        KVCacheSettings.model_validate({"host_byte": 1})
    with pytest.raises(ValueError):
        kv_transfer_config("/x", host_bytes=-1)


def test_generated_blocks_are_saved_once_committed_and_reloaded_after_preemption():
    prompt = list(range(6))  # 1 full prompt block
    tokens = list(prompt)  # the request's live token list, extended as tokens are accepted
    p = planner(generated=True)
    p.track("r", prompt, tokens=tokens)
    assert p.num_tokens("r", len(prompt)) == 6
    plan = p.step([("r", [1, 2], 0)], [], {"r": 6}, lambda k: None)  # prefill
    assert [b for b, _ in plan.saves] == [1]
    tokens += [100, 101, 102]  # 9 tokens; 8 computed after the next step
    # a step with drafts scheduled past the block boundary saves nothing generated: only `computed` counts
    plan = p.step([], [("r", None, False, 6)], {"r": 4}, lambda k: None)
    assert plan.saves == []
    tokens += [103, 104]  # 11 tokens, 10 computed: block 1 (tokens 4..7) is committed
    plan = p.step([], [("r", [3], False, 10)], {"r": 1}, lambda k: None)
    keys = prefix_block_keys(NS, tokens, BS)
    assert plan.saves == [(2, keys[1])]
    # preempted: every block freed, the tokens kept; both blocks are loadable, the last token is computed
    held = {keys[0]: "host", keys[1]: "host"}
    assert p.match("r", p.num_tokens("r", 6), 0, held.get) == 2 * BS
    p.after_alloc("r", [7, 8, 9], 2 * BS)
    plan = p.step([], [("r", [7, 8, 9], True, 2 * BS)], {"r": 3}, held.get)
    assert plan.loads == {"r": [(7, keys[0]), (8, keys[1])]} and plan.saves == []


def test_without_generated_only_prompt_blocks_are_keyed():
    prompt = list(range(6))
    tokens = prompt + list(range(100, 110))
    p = planner()
    p.track("r", prompt, tokens=tokens)
    assert p.num_tokens("r", 6) == 6
    keys = prefix_block_keys(NS, tokens, BS)
    assert p.match("r", 6, 0, dict.fromkeys(keys, "host").get) == BS
    p.step([("r", [1, 2], 0)], [], {"r": 6}, lambda k: None)
    assert p.step([], [("r", [3, 4], False, 14)], {"r": 1}, lambda k: None).saves == []
