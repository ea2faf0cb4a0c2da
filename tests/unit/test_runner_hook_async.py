"""The vLLM runner hook driven with the runner state vLLM's async-scheduling path produces (GPU
default for EAGLE-3; the CPU platform forces it off, so no engine test sees it): no exception,
the exit where the pure `decide` puts it on the committed tokens, per-request fallback."""

import json
import random

import pytest
import torch

from specexit_app.bench.hook_bench import SPLIT, THINK_END, SyntheticDrafter, SyntheticRunner
from specexit_core.exit import ExitConfig, decide
from specexit_core.signals import activate_value
from specexit_core.vllm_plugin.runner_hook import FORCE_LOGIT, SpecExitRunnerState

K, N_PROMPT, VOCAB, H = 3, 20, 64, 1
EXIT_ARGS = {"specexit_method": "progress", "specexit_progress_threshold": 0.6}


def raw_signals(g: int) -> list[float]:
    """Raw fc outputs of generated token g: progress crosses 0.6 around token 62."""
    return [0.5 * ((g * 7) % 5 - 2), (g - 60) / 4.0, 3.0 + 0.01 * g]


def hook_signals(g: int) -> list[float]:
    """What the hook computes on CPU: the raw values in float32, activated per value."""
    raw = torch.tensor(raw_signals(g), dtype=torch.float32).double().tolist()
    return [activate_value(i, v) for i, v in enumerate(raw)]


class Sim:
    """One request's truth: the target's greedy continuation, drafts that are sometimes wrong,
    and the runner rows vLLM builds under async scheduling."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.truth = [self.think_token() for _ in range(400)]
        self.committed = [self.truth[0]]  # the prefill sampled token 0
        self.exit_at = None

    def think_token(self) -> int:
        return SPLIT if self.rng.random() < 0.15 else self.rng.randrange(4, VOCAB)

    def inputs(self, k: int = K) -> list[int]:
        g0 = len(self.committed) - 1
        drafts = [
            self.truth[g0 + i] if self.rng.random() < 0.7 else self.rng.randrange(4, VOCAB) for i in range(1, k + 1)
        ]
        return [self.committed[-1]] + drafts

    def verify(self, inputs: list[int], forced: list[bool]) -> None:
        """Target tokens per row (`</think>` where the hook forced it), accept the matching drafts."""
        g0, k = len(self.committed) - 1, len(inputs) - 1
        for j in range(k + 1):
            g = g0 + j  # row j predicts token g + 1
            if forced[j] and self.truth[g + 1] != THINK_END:
                self.truth[g + 1 :] = [THINK_END] + [self.rng.randrange(4, VOCAB) for _ in range(300)]
                self.exit_at = g
            target = self.truth[g + 1]
            if j < k and inputs[j + 1] == target:
                self.committed.append(target)
                continue
            self.committed.append(target)
            return


def async_output_token_ids(sim: Sim, prev_drafts: int) -> list[int]:
    """`requests[id].output_token_ids` under async scheduling when sample_tokens runs: the last
    step's sampled tokens are not in yet, one `-1` placeholder per draft of the last step."""
    return sim.committed[:-1] + [-1] * prev_drafts


def drive(
    monkeypatch, steps=120, seed=0, extra_args=None, break_request=None, events_dir=None, max_tokens=None, prompts=None
):
    monkeypatch.setenv("SPECEXIT_EXIT_CONFIG", json.dumps({"min_think_tokens": 50}))
    if events_dir:
        monkeypatch.setenv("SPECEXIT_TELEMETRY_DIR", str(events_dir))
    else:
        monkeypatch.delenv("SPECEXIT_TELEMETRY_DIR", raising=False)
    rng = random.Random(seed)
    runner = SyntheticRunner()
    state = SpecExitRunnerState(runner, SyntheticDrafter(hidden=H))
    state.model.weight = torch.eye(3)  # raw signals = the aux values, so the test knows them
    sims = {}
    for rid, args in (extra_args or {"a": EXIT_ARGS}).items():
        kw = {"max_tokens": max_tokens[rid]} if rid in (max_tokens or {}) else {}
        runner.add(rid, N_PROMPT, args, prompt_token_ids=(prompts or {}).get(rid), **kw)
        sims[rid] = Sim(rng)
    for step in range(steps):
        batch, rows = [], []
        for rid, sim in sims.items():
            ins = sim.inputs()
            g0 = len(sim.committed) - 1
            runner.requests[rid].output_token_ids = async_output_token_ids(sim, K if step else 0)
            batch.append((rid, ins, N_PROMPT + g0))
            rows += [raw_signals(g0 + j) for j in range(len(ins))]
        aux = [torch.tensor([[r[i]] for r in rows], dtype=torch.float32) for i in range(3)]
        ex = runner.step(batch, aux, VOCAB)
        if break_request and step == 5:  # a broken draft row: non-finite signals for this request only
            r = [b[0] for b in batch].index(break_request)
            for a in aux:
                a[r * (K + 1) : (r + 1) * (K + 1)] = float("nan")
        state.before_sample(runner, ex)
        forced = (ex.logits[:, THINK_END] == FORCE_LOGIT).tolist()
        for r, (rid, ins, _) in enumerate(batch):
            sims[rid].verify(ins, forced[r * (K + 1) : (r + 1) * (K + 1)])
    return state, sims


def expected_exit(sim: Sim, cfg: ExitConfig):
    c = sim.committed
    return decide(
        c,
        [hook_signals(g) for g in range(len(c))],
        cfg,
        split_token_ids=[SPLIT],
        think_start_id=1,
        think_end_id=THINK_END,
    )


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_async_placeholders_exit_where_decide_puts_it(monkeypatch, seed):
    state, sims = drive(monkeypatch, seed=seed)
    sim = sims["a"]
    cfg = ExitConfig(min_think_tokens=50).with_overrides({"method": "progress", "progress_threshold": 0.6})
    want = expected_exit(sim, cfg)
    assert want is not None and sim.exit_at == want.index
    assert sim.committed[want.index + 1] == THINK_END
    assert state.counters["exits"] == 1 and state.counters["fallbacks"] == 0
    assert state.reqs["a"].exit.index == want.index
    assert state.reqs["a"].exit == want  # index, reason, think tokens and smoothed values, bit for bit


def test_answer_reserve_closes_thinking_where_max_tokens_leaves_the_answer_room(monkeypatch, tmp_path):
    """max_tokens 60 with the default 16-token reserve: a think budget of 60 - 16 - 2 = 42, below the
    server's min_think_tokens of 50, so no signal exit can come first; `</think>` follows think token
    42 and the exit is reported as `answer_reserve` (a request of its own with max_tokens 400 is not
    touched)."""
    from specexit_core.exit.answer_reserve import ANSWER_RESERVE

    state, sims = drive(
        monkeypatch, extra_args={"a": EXIT_ARGS, "b": EXIT_ARGS}, max_tokens={"a": 60}, events_dir=tmp_path
    )
    ex = state.reqs["a"].exit
    assert ex.reason == ANSWER_RESERVE and ex.think_tokens == 42 and sims["a"].exit_at == ex.index == 41
    assert sims["a"].committed[ex.index + 1] == THINK_END
    assert state.reqs["b"].exit.reason == "signals"
    events = [json.loads(x) for f in tmp_path.rglob("*.jsonl") for x in f.read_text().splitlines()]
    assert {e["req_id"]: e["reason"] for e in events if "reason" in e} == {"a": ANSWER_RESERVE, "b": "signals"}


def test_a_prompt_that_closed_thinking_is_never_cut(monkeypatch):
    """Thinking closed in the prompt (`reasoning_effort: none`, `enable_thinking: false`): what the
    request generates is answer, so neither the signals nor the answer reserve may force `</think>`
    into it; a request whose prompt opened thinking is followed as before."""
    closed = [5, 1, 6, THINK_END, 7]  # `<think>` (1) ... `</think>`: the template closed it
    opened = [5, THINK_END, 6, 1]  # a closed block earlier, then `<think>` again: thinking
    state, sims = drive(
        monkeypatch,
        extra_args={"a": EXIT_ARGS, "b": EXIT_ARGS},
        max_tokens={"a": 60, "b": 60},
        prompts={"a": closed, "b": opened},
    )
    assert state.reqs["a"].slot is None and state.reqs["a"].exit is None and sims["a"].exit_at is None
    assert state.reqs["b"].exit.reason == "answer_reserve" and sims["b"].exit_at == 41
    assert state.counters["exits"] == 1 and state.counters["fallbacks"] == 0


def random_request_args(rng: random.Random) -> dict:
    """Per-request settings a client may send (the server's min_think_tokens is 50)."""
    args = {
        "specexit_method": rng.choice(["progress", "confidence", "confidence_progress", "progress_remain"]),
        "specexit_progress_threshold": rng.choice([0.3, 0.6, 0.9]),
        "specexit_confidence_threshold": rng.choice([0.2, 0.5]),
        "specexit_remaining_threshold": rng.choice([25.0, 200.0]),
        "specexit_alpha": rng.choice([0.1, 0.3, 1.0]),
        "specexit_min_think_tokens": rng.choice([50, 60, 90]),
    }
    if rng.random() < 0.3:
        args["specexit_max_think_tokens"] = rng.randrange(90, 200)
    return args


@pytest.mark.parametrize("seed", range(2))
def test_batch_of_requests_with_own_settings_exit_where_decide_puts_them(monkeypatch, seed):
    """Many requests with their own settings, joining and finishing at different steps (the batch
    changes), 0..K drafts per request and step, prefill rows, natural `</think>`: every request
    exits exactly where `decide` puts it on its committed tokens, with the same decision."""
    monkeypatch.setenv("SPECEXIT_EXIT_CONFIG", json.dumps({"min_think_tokens": 50}))
    monkeypatch.delenv("SPECEXIT_TELEMETRY_DIR", raising=False)
    rng = random.Random(100 + seed)
    runner = SyntheticRunner()
    state = SpecExitRunnerState(runner, SyntheticDrafter(hidden=H))
    state.model.weight = torch.eye(3)
    plan = {f"q{i}": (rng.randrange(0, 40), rng.randrange(150, 260)) for i in range(16)}  # (join, leave) step
    sims, cfgs, done = {}, {}, {}
    for step in range(220):
        for rid, (join, leave) in plan.items():
            if step == join:
                args = random_request_args(rng) if rng.random() < 0.85 else {"specexit": False}
                runner.add(rid, N_PROMPT, args)
                sims[rid] = Sim(rng)
                sims[rid].truth += [sims[rid].think_token() for _ in range(1000)]
                if rng.random() < 0.3:  # thinking that ends on its own
                    sims[rid].truth[rng.randrange(60, 300)] = THINK_END
                cfgs[rid] = ExitConfig(min_think_tokens=50).with_overrides(
                    {k.removeprefix("specexit_"): v for k, v in args.items() if k != "specexit"}
                    | ({"enabled": False} if "specexit" in args else {})
                )
            if rid in sims and (step == leave or len(sims[rid].truth) < len(sims[rid].committed) + K + 2):
                done[rid] = sims.pop(rid)
                del runner.requests[rid]
        batch, rows, joined = [], {}, set()
        for rid, sim in sims.items():
            if plan[rid][0] == step:  # its prefill row: the last prompt token
                batch.append((rid, [7], N_PROMPT - 1))
                rows[rid] = [raw_signals(-1)]
                joined.add(rid)
                continue
            ins = sim.inputs(rng.choice([0, 1, K, K, K]))
            g0 = len(sim.committed) - 1
            batch.append((rid, ins, N_PROMPT + g0))
            rows[rid] = [raw_signals(g0 + j) for j in range(len(ins))]
        if not batch:
            continue
        if step % 7 == 0:
            rng.shuffle(batch)  # vLLM reorders its batch now and then
        flat = [r for rid, _, _ in batch for r in rows[rid]]
        aux = [torch.tensor([[r[c]] for r in flat], dtype=torch.float32) for c in range(3)]
        ex = runner.step(batch, aux, VOCAB)
        state.before_sample(runner, ex)
        forced = (ex.logits[:, THINK_END] == FORCE_LOGIT).tolist()
        at = 0
        for rid, ins, _ in batch:
            if rid in joined:
                assert not any(forced[at : at + len(ins)])
            else:
                sims[rid].verify(ins, forced[at : at + len(ins)])
            at += len(ins)
    done.update(sims)
    assert state.counters["fallbacks"] == 0 and state.counters["hook_errors"] == 0
    n_exits = 0
    for rid, sim in done.items():
        want = expected_exit(sim, cfgs[rid])
        if want is None or want.index + 1 >= len(sim.committed):
            assert sim.exit_at is None, rid  # no exit (or not yet committed when it left)
            continue
        n_exits += 1
        assert sim.exit_at == want.index and sim.committed[want.index + 1] == THINK_END, rid
    assert n_exits >= 4, n_exits
    assert state.counters["exits"] >= n_exits - 3  # exits of requests that left right after are not counted


def test_bad_settings_and_internal_errors_fall_back_per_request(monkeypatch, tmp_path):
    events = tmp_path / "ev"
    args = {
        "a": EXIT_ARGS,
        "bad": {"specexit_max_think_tokens": 10},  # below the server's min 50
        "off": {"specexit": False},
        "broken": EXIT_ARGS,
    }
    state, sims = drive(monkeypatch, extra_args=args, break_request="broken", events_dir=events)
    assert state.reqs["bad"].slot is None and "max_think_tokens" in state.reqs["bad"].fallback
    assert "finite" in state.reqs["broken"].fallback
    assert state.counters["fallbacks"] == 2
    assert sims["bad"].exit_at is None and sims["off"].exit_at is None and sims["broken"].exit_at is None
    assert sims["a"].exit_at is not None and state.counters["exits"] == 1  # the others go on
    from specexit_core.vllm_plugin.telemetry import read_exit_events, read_fallback_events

    fb = read_fallback_events(events)
    assert set(fb) == {"bad", "broken"} and set(read_exit_events(events)) == {"a"}


def test_lost_track_falls_back(monkeypatch):
    """A step the hook never saw (committed tokens it cannot reconstruct): that request stops
    exiting, nothing raises."""
    monkeypatch.setenv("SPECEXIT_EXIT_CONFIG", "{}")
    runner = SyntheticRunner()
    state = SpecExitRunnerState(runner, SyntheticDrafter(hidden=H))
    runner.add("a", N_PROMPT, EXIT_ARGS)
    for g0 in (0, 1, 9):  # jumps from 1 to 9: tokens 2..8 were never inputs
        aux = [torch.zeros(K + 1, H) for _ in range(3)]
        state.before_sample(runner, runner.step([("a", [5, 6, 7, 8], N_PROMPT + g0)], aux, VOCAB))
    assert "never seen" in state.reqs["a"].fallback


def test_telemetry_write_failures_are_counted(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    from specexit_core.vllm_plugin.telemetry import EventWriter

    w = EventWriter(str(blocker / "sub"))  # a folder under a file: every write fails
    assert w.append("exits", {"req_id": "x"}) is False and w.append("exits", {"req_id": "y"}) is False
    assert w.errors == 2


def test_effort_none_on_an_open_prompt_makes_the_first_token_end_thinking(monkeypatch):
    """`specexit_effort: none` where the template left thinking open (R1-style: no `enable_thinking`):
    `</think>` is forced on the row that samples the request's first token -- not while its prefill is
    partial (that sample is discarded), and never again after; a prompt that closed thinking itself
    and a request without the level are left alone."""
    from types import SimpleNamespace

    import numpy as np

    monkeypatch.delenv("SPECEXIT_TELEMETRY_DIR", raising=False)
    runner = SyntheticRunner()
    state = SpecExitRunnerState(runner, SyntheticDrafter(hidden=H))
    none = {"specexit_effort": "none"}
    runner.add("open", N_PROMPT, none, prompt_token_ids=[5, 1])
    runner.add("plain", N_PROMPT, EXIT_ARGS, prompt_token_ids=[5, 1])
    runner.add("closed", N_PROMPT, none, prompt_token_ids=[5, 1, 6, THINK_END])
    runner.input_batch.req_ids = ["open", "plain", "closed"]

    def prefill_step(discard):
        runner.discard_request_mask = SimpleNamespace(np=np.array(discard))
        ex = SimpleNamespace(spec_decode_metadata=None, aux_hidden_states=None, logits=torch.zeros(3, VOCAB))
        state.before_sample(runner, ex)
        return (ex.logits[:, THINK_END] == FORCE_LOGIT).tolist()

    assert prefill_step([True, False, False]) == [False, False, False]  # a partial prefill: discarded
    assert prefill_step([False, False, False]) == [True, False, False]
    runner.requests["open"].output_token_ids = [THINK_END]
    assert prefill_step([False, False, False]) == [False, False, False] and not state.close_first
    assert state.reqs["open"].slot is None and state.reqs["closed"].slot is None  # answer only: not followed
    assert state.reqs["plain"].slot is not None
