"""The long mode's pure parts: controls, the n-gram / EAGLE-3 merge rule, penalty rows with drafts, and
the runner state driven with a fake V1 runner (history from step inputs, acceptance by source)."""

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specexit_core.longgen.penalty import PenaltyConfig, chain_presence, window_presence
from specexit_core.longgen.plain import next_token_logits
from specexit_core.vllm_plugin.long_controls import (
    LONG_DEFAULTS_ENV,
    LongConfig,
    overrides_from_extra_args,
    request_long_config,
    server_long_defaults,
    wants_long,
)
from specexit_core.vllm_plugin.long_mode import LongModeState, TokenHistory
from specexit_core.vllm_plugin.ngram_drafts import EAGLE, NGRAM, SourceRates, merge_drafts, ngram_continuation

D = LongConfig()


def test_off_by_default_and_requests_without_controls_unchanged():
    assert not D.active
    assert request_long_config(None, D) == D
    assert request_long_config({"specexit": False, "other": 1}, D) == D
    assert not wants_long({"specexit": False}) and wants_long({"long": False}) and wants_long({"long_ngram": 1})


def test_nested_and_flat_controls():
    c = request_long_config({"long": {"ngram_min": 3, "penalty": {"theta": 1.2, "window": 64}}}, D)
    assert c.enabled and c.ngram and c.ngram_min == 3 and c.penalty == PenaltyConfig(theta=1.2, window=64)
    assert c.active and c.penalty.enabled
    flat = request_long_config(
        {"long_ngram": "0", "long_penalty_theta": "1.2", "long_penalty_window": 64.0, "long_ngram_min": 3}, D
    )
    assert flat.model_dump() == c.model_copy(update={"ngram": False}).model_dump()
    assert request_long_config({"long": True}, D).active  # n-gram on, penalty off
    assert not request_long_config({"long": {"enabled": False, "ngram": True}}, D).active
    assert not request_long_config({"long": {"ngram": False}}, D).active  # nothing left to do
    # a partial penalty keeps the other field; false turns it off
    base = D.with_overrides({"enabled": True, "penalty": {"theta": 1.3, "window": 32}})
    assert request_long_config({"long": {"penalty": {"theta": 1.5}}}, base).penalty == PenaltyConfig(
        theta=1.5, window=32
    )
    assert not request_long_config({"long": {"penalty": False}}, base).penalty.enabled
    # the n-gram policy: adaptive by default, nested or flat
    assert c.ngram_policy == "adaptive" and c.telemetry()["ngram_policy"] == "adaptive"
    assert request_long_config({"long": {"ngram_policy": "always"}}, D).ngram_policy == "always"
    assert request_long_config({"long_ngram_policy": "always"}, D).ngram_policy == "always"


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"long": {"bogus": 1}}, "unknown long-mode control 'bogus'"),
        ({"long_bogus": 1}, "unknown long-mode control 'long_bogus'"),
        ({"long": {"ngram_min": 9, "ngram_max": 3}}, "ngram_min"),
        ({"long": {"penalty": {"theta": 0}}}, "theta"),
        ({"long": {"penalty": {"window": -1}}}, "window"),
        ({"long": {"penalty": {"beta": 1}}}, "unknown long penalty control"),
        ({"long": {"penalty": 3}}, "object"),
        ({"long": "maybe"}, "boolean"),
        ({"long_ngram_min": 2.5}, "integer"),
        ({"long_penalty_theta": "x"}, "number"),
        ({"long_ngram_policy": "sometimes"}, "'adaptive' or 'always'"),
        ({"long": {"ngram_policy": 1}}, "'adaptive' or 'always'"),
    ],
)
def test_bad_controls_name_the_problem(extra, match):
    with pytest.raises(ValueError, match=match):
        request_long_config(extra, D)


def test_server_defaults(monkeypatch):
    monkeypatch.delenv(LONG_DEFAULTS_ENV, raising=False)
    assert server_long_defaults() == D
    monkeypatch.setenv(LONG_DEFAULTS_ENV, '{"ngram": true, "penalty": {"theta": 1.2, "window": 1024}}')
    d = server_long_defaults()
    assert d.active and d.penalty.theta == 1.2
    assert not request_long_config({"long": False}, d).active  # a request opts out
    assert request_long_config(None, d) == d
    monkeypatch.setenv(LONG_DEFAULTS_ENV, "[1]")
    with pytest.raises(ValueError, match="JSON object"):
        server_long_defaults()
    assert overrides_from_extra_args({"long": {"ngram": 1}}) == {"ngram": True, "enabled": True}


def test_ngram_continuation_is_vllms_longest_match():
    ctx = np.array([5, 6, 7, 8, 9, 1, 2, 6, 7, 8], np.int32)  # suffix [6, 7, 8] occurred at 1..3, then 9, 1, 2
    assert ngram_continuation(ctx, 3, 2, 8, 512).tolist() == [9, 1, 2]
    assert ngram_continuation(ctx, 3, 4, 8, 512).tolist() == []  # no match of 4 tokens
    assert ngram_continuation(ctx, 3, 2, 8, 11).tolist() == [9]  # room for one more token only


def test_merge_rule_full_continuation_or_eagle():
    ctx = np.array([5, 6, 7, 8, 9, 1, 2, 6, 7, 8], np.int32)
    assert merge_drafts([40, 41, 42], ctx, 2, 8, 512) == ([9, 1, 2], NGRAM)
    # a continuation shorter than k (the match runs into the end of the context): EAGLE-3's drafts stay
    short = np.array([3, 6, 7, 8, 9, 6, 7, 8], np.int32)
    assert ngram_continuation(short, 3, 2, 8, 512).tolist() == [9, 6, 7]
    assert merge_drafts([40, 41, 42, 43, 44], short, 2, 8, 512) == ([40, 41, 42, 43, 44], EAGLE)
    assert merge_drafts([40, 41], np.array([1, 2, 3, 4], np.int32), 2, 8, 512) == ([40, 41], EAGLE)
    assert merge_drafts([], ctx, 2, 8, 512) == ([], EAGLE)
    assert merge_drafts([40, 41, 42], ctx, 2, 8, 512, use_ngram=False) == ([40, 41, 42], EAGLE)


def test_source_rates_try_each_source_then_follow_the_better_one():
    r = SourceRates()
    assert r.prefer_ngram()  # nothing tried yet
    r.observe(NGRAM, 0, 3)
    assert r.ngram == 0.0 and r.prefer_ngram()  # EAGLE-3 not measured yet
    r.observe(EAGLE, 3, 3)
    assert r.eagle == 1.0 and not r.prefer_ngram()
    r.observe(EAGLE, 0, 3)  # EWMA: one bad step does not erase the history
    assert r.eagle == pytest.approx(0.75) and not r.prefer_ngram()
    for _ in range(6):
        r.observe(EAGLE, 0, 3)
    assert r.eagle < 0.15 and not r.prefer_ngram()  # n-grams measured at 0: still not better
    r.observe(EAGLE, 0, 0)  # no drafts: nothing learnt
    r.ngram = r.eagle
    assert r.prefer_ngram()  # ties go to the n-gram (a full match)


def test_chain_presence_is_plain_window_of_each_row():
    rng = random.Random(0)
    for _ in range(200):
        seq = [rng.randrange(20) for _ in range(rng.randrange(0, 30))]
        drafts = [rng.randrange(20) for _ in range(rng.randrange(0, 5))]
        w = rng.randrange(0, 12)
        got = chain_presence(seq, drafts, 20, w)
        for j in range(len(drafts) + 1):
            assert torch.equal(got[j], window_presence(seq + drafts[:j], 20, w)), (seq, drafts, w, j)


def test_token_history():
    h = TokenHistory([1, 2, 3])
    h.extend(range(100))
    assert len(h) == 103 and h.view()[:4].tolist() == [1, 2, 3, 0] and h.tail(2) == [98, 99]
    h.truncate(4)
    h.extend([7])
    assert h.view().tolist() == [1, 2, 3, 0, 7] and h.tail(0) == []


# -- the runner state with a fake V1 runner -------------------------------------------------------
V = 16


class FakeRunner:
    """What the hook reads: requests, input_batch.req_ids, input_ids / positions (flat token buffers),
    discard_request_mask, max_model_len."""

    def __init__(self):
        self.requests = {}
        self.input_batch = SimpleNamespace(req_ids=[])
        self.max_model_len = 512
        self._draft_probs = None

    def add(self, rid, prompt, extra):
        sp = SimpleNamespace(extra_args=extra)
        self.requests[rid] = SimpleNamespace(prompt_token_ids=list(prompt), output_token_ids=[], sampling_params=sp)

    def step(self, rows: dict[str, tuple[int, list[int]]], logits):
        """rows: req id -> (position of input 0, [input 0, drafts...]); returns an exec state."""
        ids, pos, nd = [], [], []
        self.input_batch.req_ids = list(rows)
        for p0, toks in rows.values():
            ids += toks
            pos += list(range(p0, p0 + len(toks)))
            nd.append(len(toks) - 1)
        self.input_ids, self.positions = torch.tensor(ids), torch.tensor(pos)
        self.discard_request_mask = SimpleNamespace(np=np.zeros(len(rows), bool))
        sdm = SimpleNamespace(num_draft_tokens=nd, logits_indices=torch.arange(len(ids)))
        return SimpleNamespace(spec_decode_metadata=sdm, logits=logits)


def test_runner_state_penalises_rows_and_counts_acceptance(monkeypatch):
    monkeypatch.delenv(LONG_DEFAULTS_ENV, raising=False)
    pen = PenaltyConfig(theta=1.5, window=5)
    r = FakeRunner()
    prompt = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    r.add("a", prompt, {"long": {"ngram": True, "penalty": {"theta": 1.5, "window": 5}}})
    r.add("b", [9, 9], None)  # long mode off: untouched
    lm = LongModeState(r)
    torch.manual_seed(0)
    # step 1: prefill of a (row at the last prompt token), b decodes with 2 drafts
    logits = torch.randn(4, V)
    before = logits.clone()
    es = r.step({"a": (8, [3]), "b": (1, [9, 10, 11])}, logits)
    lm.before_sample(r, es)
    assert torch.equal(logits[0], next_token_logits(before[0], prompt, pen))
    assert torch.equal(logits[1:], before[1:])
    # propose: a sampled [4]; context 1 2 3 4 5 6 1 2 3 4 -> n-gram continuation [5, 6, 1]
    drafts = torch.tensor([[12, 13, 14], [7, 7, 7]])
    out = lm.after_propose(r, torch.tensor([[4, -1, -1, -1], [10, -1, -1, -1]]), drafts)
    assert out[0].tolist() == [5, 6, 1] and out[1].tolist() == [7, 7, 7]
    # step 2: a's inputs are [4, 5, 6, 1] at 9..12
    logits = torch.randn(5, V)
    before = logits.clone()
    es = r.step({"a": (9, [4, 5, 6, 1]), "b": (2, [10])}, logits)
    lm.before_sample(r, es)
    seq = prompt + [4]
    for j, d in enumerate([[], [5], [5, 6], [5, 6, 1]]):
        assert torch.equal(logits[j], next_token_logits(before[j], seq + d, pen)), j
    st = lm.reqs["a"]
    assert st.stats["ngram_drafted_tokens"] == 3 and st.prev_source == NGRAM
    # propose: 2 drafts accepted + a recovered token; no full continuation -> EAGLE's drafts
    lm.after_propose(r, torch.tensor([[5, 6, 15, -1], [3, -1, -1, -1]]), torch.tensor([[12, 13, 14], [0, 0, 0]]))
    assert st.next_source == EAGLE
    es = r.step({"a": (12, [15, 12, 13, 14]), "b": (3, [3])}, torch.randn(5, V))
    lm.before_sample(r, es)
    assert st.hist.view().tolist() == prompt + [4, 5, 6, 15]
    assert st.stats["ngram_accepted_tokens"] == 2 and st.stats["eagle_drafted_tokens"] == 3
    assert lm.counters["penalised_rows"] == 1 + 4 + 4 and lm.reqs["b"] is None
    # a step the hook did not see: long mode stops for the request (fallback), the others go on
    es = r.step({"a": (30, [1]), "b": (4, [3])}, torch.randn(2, V))
    lm.before_sample(r, es)
    assert st.fallback and lm.counters["fallbacks"] == 1
    events = []
    lm.events.append = lambda kind, ev: events.append((kind, ev))
    lm.finish(["a", "b"])
    assert events[0][0] == "long" and events[0][1]["ngram_accepted_tokens"] == 2 and events[0][1]["fallback"]
    assert "a" not in lm.reqs


@pytest.mark.parametrize("policy, step4_source", [("adaptive", EAGLE), ("always", NGRAM)])
def test_adaptive_policy_keeps_eagle_drafts_after_ngram_drafts_fail(monkeypatch, policy, step4_source):
    """n-gram drafts tried on the first full match and all rejected; EAGLE-3's next drafts all accepted;
    at the next full match the adaptive policy keeps EAGLE-3's drafts, `always` takes the match."""
    monkeypatch.delenv(LONG_DEFAULTS_ENV, raising=False)
    r = FakeRunner()
    prompt = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    r.add("a", prompt, {"long": {"ngram": True, "ngram_policy": policy}})
    lm = LongModeState(r)

    def step(p0, toks, sampled, eagle):
        lm.before_sample(r, r.step({"a": (p0, toks)}, torch.randn(len(toks), V)))
        out = lm.after_propose(r, torch.tensor([sampled]), torch.tensor([eagle]))
        return out[0].tolist(), lm.reqs["a"].next_source

    assert step(8, [3], [4, -1, -1, -1], [12, 13, 14]) == ([5, 6, 1], NGRAM)  # untried: the match is used
    assert step(9, [4, 5, 6, 1], [7, -1, -1, -1], [20, 21, 22]) == ([20, 21, 22], EAGLE)  # no match
    assert step(10, [7, 20, 21, 22], [20, 21, 22, 8], [2, 40, 41]) == ([2, 40, 41], EAGLE)  # no match
    st = lm.reqs["a"]
    assert st.rates.ngram == 0.0 and st.rates.eagle is None
    drafts, source = step(14, [8, 2, 40, 41], [2, 3, -1, -1], [50, 51, 52])  # context ends 2 3: a full match
    assert st.rates.eagle == 1.0 and source == step4_source
    ctx = np.array(prompt + [4, 7, 20, 21, 22, 8, 2, 3], np.int32)
    match = ngram_continuation(ctx, 3, 2, 8, 512).tolist()
    assert len(match) == 3 and drafts == ([50, 51, 52] if source == EAGLE else match)


# -- the Serve `long` profile ---------------------------------------------------------------------
def test_long_profile_is_gpu_tp2_plus_long_defaults_the_engine_reads(monkeypatch):
    import yaml

    from serve_app.app import llm_config
    from serve_app.config import load_args
    from support.paths import REPO_ROOT

    path = REPO_ROOT / "serve_app/profiles/long.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["applications"][0]["args"]["specexit"].pop("long_defaults")
    assert cfg == yaml.safe_load((REPO_ROOT / "serve_app/gpu_tp2.yaml").read_text())  # only the long mode differs
    args = load_args(yaml.safe_load(path.read_text())["applications"][0]["args"])
    env = llm_config(args).runtime_env["env_vars"]  # what the engine replica and its workers get
    monkeypatch.setenv(LONG_DEFAULTS_ENV, env[LONG_DEFAULTS_ENV])
    d = server_long_defaults()
    assert d.active and d.ngram and d.penalty == PenaltyConfig(theta=1.2, window=1024)
    assert not request_long_config({"long": 0}, d).active


def test_bad_long_defaults_fail_when_the_app_is_built():
    from serve_app.config import load_args
    from specexit_core.typed_config import ConfigError

    model = {"id": "m", "source": "toy:teacher", "draft": "toy:draft", "accelerator": "cpu"}
    assert load_args({"model": model, "specexit": {"long_defaults": {"ngram": True}}}).specexit.long_defaults
    with pytest.raises(ConfigError, match="ngram_mim"):
        load_args({"model": model, "specexit": {"long_defaults": {"ngram_mim": 2}}})
    with pytest.raises(ConfigError, match="needs model.draft"):
        load_args({"model": {**model, "draft": None}, "specexit": {"long_defaults": {"ngram": True}}})


# -- `usage.specexit.long` in the Serve replica ------------------------------------------------------
def test_long_events_reach_usage(tmp_path):
    import json

    from serve_app.engine import _final_usage_chunk
    from serve_app.telemetry import ExitEventIndex, choice_telemetry, usage_block

    idx = ExitEventIndex(tmp_path)
    assert not idx.has_long("chatcmpl-a")
    ev = {"config": {"ngram": True}, "steps": 4, "ngram_drafted_tokens": 6, "eagle_drafted_tokens": 6, "fallback": None}
    (tmp_path / "long-7.jsonl").write_text(json.dumps({"req_id": "chatcmpl-a-12345678", "time": 1.0, **ev}) + "\n")
    assert idx.has_long("chatcmpl-a") and idx.pop_long("chatcmpl-a") == ev and idx.pop_long("chatcmpl-a") is None
    one = usage_block(True, [choice_telemetry([1], 269, None, None, ev)])
    assert one["long"] == ev
    two = usage_block(True, [choice_telemetry([1], 269, None, None, ev), choice_telemetry([1], 269, None, None, ev)])
    assert (
        two["long"]["steps"] == 8
        and two["long"]["ngram_drafted_tokens"] == 12
        and two["long"]["config"] == ev["config"]
    )
    assert usage_block(True, [choice_telemetry([1], 269, None)])["long"] is None
    assert _final_usage_chunk('data: {"id":"c","choices":[],"usage":{"completion_tokens":4}}\n\n')
    assert not _final_usage_chunk('data: {"id":"c","choices":[{"index":0}],"usage":{"completion_tokens":4}}\n\n')
    assert not _final_usage_chunk('data: {"id":"c","choices":[],"usage":null}\n\n')
