"""The hook's fast paths give what the full computation gives: signals only for the requests that
still think (device rows of the others skipped), the signed threshold comparison, and a batch with
finished / SpecExit-off requests deciding exactly as the same requests alone."""

import random

import numpy as np
import pytest
import torch
from test_runner_hook_async import EXIT_ARGS, N_PROMPT, VOCAB, K, Sim, raw_signals

from specexit_app.bench.hook_bench import THINK_END, SyntheticDrafter, SyntheticRunner
from specexit_core.exit.signal_names import SIGNALS
from specexit_core.exit.thresholds import PASS_SIDE, signal_passes
from specexit_core.vllm_plugin.runner_hook import FORCE_LOGIT, SpecExitRunnerState, _compact


def test_signal_rows_do_not_depend_on_which_rows_are_computed():
    """`_host_rows` on a subset of the logit rows returns those rows of the full computation, bit for bit."""
    g = torch.Generator().manual_seed(0)
    runner, drafter = SyntheticRunner(), SyntheticDrafter(hidden=64)
    state = SpecExitRunnerState(runner, drafter)
    n_drafts = np.array([3, 3, 0, 1, 3, 2, 3, 3] * 16, np.int64)
    start = np.concatenate([[0], np.cumsum(n_drafts + 1)[:-1]])
    batch = [(f"r{i}", [5] * (int(d) + 1), N_PROMPT + i) for i, d in enumerate(n_drafts)]
    for rid, _, _ in batch:
        runner.add(rid, N_PROMPT, EXIT_ARGS)
    rows = int((n_drafts + 1).sum())
    aux = [torch.randn(rows, 64, generator=g) for _ in range(3)]
    ex = runner.step(batch, aux, VOCAB)
    sig, tok, pos = state._host_rows(runner, ex.spec_decode_metadata, aux)
    for trial in range(20):
        fol = np.sort(np.random.default_rng(trial).choice(len(n_drafts), size=1 + trial * 6, replace=False))
        n, first, keep = _compact(n_drafts, start, fol)
        assert n.tolist() == n_drafts[fol].tolist()
        assert keep[first].tolist() == start[fol].tolist()  # each kept request's input 0
        s2, t2, p2 = state._host_rows(runner, ex.spec_decode_metadata, aux, keep)
        assert np.array_equal(s2, sig[keep]) and np.array_equal(t2, tok[keep]) and np.array_equal(p2, pos[keep])


def test_signed_comparison_is_the_threshold_rule():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.random(200), [0.5, 0.0, -0.0, np.inf, -np.inf, np.nan]])
    for name in SIGNALS:
        t = 0.5
        side = PASS_SIDE[name]
        direct = values > t if side > 0 else values < t
        assert np.array_equal(signal_passes(name, values, type("T", (), {f"{name}_threshold": t})), direct)
        assert np.array_equal(side * values > side * t, direct)


def _drive(batch_of, steps, seed):
    """The `drive` loop of test_runner_hook_async for several requests; `batch_of(step, sims)` picks
    the rows a step holds (request id, its inputs or None for a row SpecExit does not follow)."""
    rng = random.Random(seed)
    runner = SyntheticRunner()
    state = SpecExitRunnerState(runner, SyntheticDrafter(hidden=1))
    state.model.weight = torch.eye(3)
    sims = {}
    for rid in ("a", "b", "c"):
        runner.add(rid, N_PROMPT, EXIT_ARGS)
        sims[rid] = Sim(rng)
    for rid in ("off1", "off2"):
        runner.add(rid, N_PROMPT, {"specexit": False})
    forced_at = {rid: [] for rid in sims}
    draft_rng = random.Random(seed + 1)
    for step in range(steps):
        batch, rows, own = [], [], {}
        for rid in batch_of(step):
            if rid in sims:
                sim = sims[rid]
                sim.rng = draft_rng  # the same drafts whichever rows share the step
                ins = sim.inputs()
                g0 = len(sim.committed) - 1
                own[rid] = (len(rows), ins)
                batch.append((rid, ins, N_PROMPT + g0))
                rows += [raw_signals(g0 + j) for j in range(len(ins))]
            else:
                batch.append((rid, [9] * (K + 1), N_PROMPT + step))
                rows += [[0.0, 0.0, 0.0]] * (K + 1)
        aux = [torch.tensor([[r[i]] for r in rows], dtype=torch.float32) for i in range(3)]
        ex = runner.step(batch, aux, VOCAB)
        state.before_sample(runner, ex)
        forced = (ex.logits[:, THINK_END] == FORCE_LOGIT).tolist()
        for rid, (at, ins) in own.items():
            f = forced[at : at + len(ins)]
            forced_at[rid].append(f)
            sims[rid].verify(ins, f)
    return state, sims, forced_at


@pytest.mark.parametrize("seed", range(3))
def test_rows_of_requests_not_followed_change_nothing(seed):
    """Requests SpecExit does not follow (off, or exited and done) between the followed ones: the
    hook computes signals for the followed rows only, and every decision is the one it makes with
    the followed requests alone in the batch."""
    mixed = _drive(lambda step: ["off1", "a", "off2", "b", "c"] if step % 3 else ["a", "off1", "b", "c"], 80, seed)
    alone = _drive(lambda step: ["a", "b", "c"], 80, seed)
    (s1, sims1, f1), (s2, sims2, f2) = mixed, alone
    assert f1 == f2
    for rid in ("a", "b", "c"):
        assert sims1[rid].committed == sims2[rid].committed
        assert s1.reqs[rid].exit == s2.reqs[rid].exit
    assert s1.counters["exits"] == s2.counters["exits"] == 3
    assert s1.counters["fallbacks"] == s2.counters["fallbacks"] == 0


def test_a_cpu_engine_in_bf16_takes_the_torch_rows():
    """Aux states in bf16 on CPU (no numpy dtype for them): the torch rows, no transfer, the same
    tokens and positions, signals as the float32 rows' to bf16 precision, and no hook error."""
    g = torch.Generator().manual_seed(1)
    runner, drafter = SyntheticRunner(), SyntheticDrafter(hidden=64)
    batch = [(f"r{i}", [5, 6, 7, 8], N_PROMPT + i) for i in range(6)]
    for rid, _, _ in batch:
        runner.add(rid, N_PROMPT, EXIT_ARGS)
    aux = [torch.randn(24, 64, generator=g) for _ in range(3)]
    ex32 = runner.step(batch, aux, VOCAB)
    s32 = SpecExitRunnerState(runner, drafter)._host_rows(runner, ex32.spec_decode_metadata, aux)
    aux16 = [h.to(torch.bfloat16) for h in aux]
    state = SpecExitRunnerState(runner, drafter)
    s16 = state._host_rows(runner, ex32.spec_decode_metadata, aux16)
    assert state._compiled_rows is False
    assert np.array_equal(s16[1], s32[1]) and np.array_equal(s16[2], s32[2])
    np.testing.assert_allclose(s16[0], s32[0], rtol=0.05, atol=0.05)
    ex16 = runner.step(batch, aux16, VOCAB)
    state.before_sample(runner, ex16)
    assert state.counters["hook_errors"] == 0 and state.counters["steps"] == 1


@pytest.mark.parametrize("seed", range(2))
def test_the_gpu_transfers_layout_decides_the_same(monkeypatch, seed):
    """On a GPU the rows come back as views of one pinned [R, 5] block (signals a non-contiguous
    [R, 3] view); the compiled step must decide on them exactly as on the CPU rows."""
    batch_of = lambda step: ["off1", "a", "off2", "b", "c"] if step % 3 else ["a", "off1", "b", "c"]  # noqa: E731
    want = _drive(batch_of, 80, seed)
    orig = SpecExitRunnerState._host_rows

    def as_gpu(self, *args, **kwargs):
        sig, tok, pos = orig(self, *args, **kwargs)
        block = np.concatenate([sig, tok[:, None].astype(np.float64), pos[:, None].astype(np.float64)], 1)
        assert not block[:, :3].flags.c_contiguous
        return block[:, :3], block[:, 3].astype(np.int64), block[:, 4].astype(np.int64)

    monkeypatch.setattr(SpecExitRunnerState, "_host_rows", as_gpu)
    got = _drive(batch_of, 80, seed)
    assert got[2] == want[2]
    for rid in ("a", "b", "c"):
        assert got[1][rid].committed == want[1][rid].committed and got[0].reqs[rid].exit == want[0].reqs[rid].exit
    assert got[0].counters == want[0].counters


def test_a_drafter_that_normalises_fcs_input_gets_signals_of_the_normalised_features():
    """norm_before_fc / fc_norm drafters (docs/draft_formats.md): their signal rows multiply `fc_input` of
    the target features, as their `fc` does; the compiled CPU loop (raw features) is not used for them."""
    g = torch.Generator().manual_seed(1)
    runner = SyntheticRunner()
    plain_state = SpecExitRunnerState(runner, SyntheticDrafter(hidden=8))
    normed = SyntheticDrafter(hidden=8)
    normed.weight = plain_state.model.weight
    normed.plain_fc_input = False
    normed.fc_input = lambda feats: torch.nn.functional.normalize(feats, dim=-1) * 3.0
    normed_state = SpecExitRunnerState(runner, normed)
    n_drafts = np.array([3, 2, 3], np.int64)
    batch = [(f"r{i}", [5] * (int(d) + 1), N_PROMPT + i) for i, d in enumerate(n_drafts)]
    for rid, _, _ in batch:
        runner.add(rid, N_PROMPT, EXIT_ARGS)
    rows = int((n_drafts + 1).sum())
    aux = [torch.randn(rows, 8, generator=g) for _ in range(3)]
    ex = runner.step(batch, aux, VOCAB)
    sig, _, _ = normed_state._host_rows(runner, ex.spec_decode_metadata, aux)
    assert normed_state._compiled_rows is False
    want, _, _ = plain_state._host_rows(
        runner, ex.spec_decode_metadata, [normed.fc_input(torch.cat(aux, -1))[:, i * 8 : (i + 1) * 8] for i in range(3)]
    )
    assert np.allclose(sig, want, atol=1e-6)
    raw, _, _ = plain_state._host_rows(runner, ex.spec_decode_metadata, aux)
    assert not np.allclose(sig, raw, atol=1e-3)
