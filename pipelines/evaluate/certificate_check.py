"""Does the certified exit hold on the test problems? The calibrated file's certificate against the
loss the evaluation itself measures.

`specexit calibrate` certifies, per sampling profile, that the exit's loss on new prompts is at most
epsilon with probability 1 - delta (pipelines/calibrate/certificate.py), and records the certified
upper bound it found on the dev split. An evaluation run with that file (`EvalConfig.calibrated`)
then has what the certificate speaks of: new prompts. Per problem-sample at each temperature, the same
loss the certificate used, measured between `specexit` (run with the profile's exit) and `eagle3`
(the same request without an exit: same seed, so the same trace until SpecExit leaves it):

- `disagreement`: SpecExit's answer differs from EAGLE-3's;
- `accuracy_drop`: EAGLE-3's answer is right and SpecExit's is wrong.

The record gives the test loss with its 95% interval (problems resampled, each with all its samples),
next to epsilon, delta and the certified bound; the report plots them (`pipelines/report/job.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from pipelines.evaluate.intervals import accuracy_ci95
from pipelines.evaluate.samples import sample_key

# the columns `measured_losses` reads
COLUMNS = ["problem_id", "status", "method", "temperature", "correct", "completion_text", "info"]


def measured_losses(rows: Sequence[dict], loss: str, extract: Callable[[str], str | None]) -> dict[str, dict]:
    """{temperature label: {(problem id, sample): loss}} over the problem-samples where both `specexit`
    and `eagle3` gave an ok row; `extract`: the grader's answer extractor."""
    by: dict = {}
    for r in rows:
        if r["status"] == "ok" and r["method"] in ("specexit", "eagle3"):
            by.setdefault(f"{float(r['temperature']):g}", {}).setdefault(sample_key(r), {})[r["method"]] = r
    out: dict[str, dict] = {}
    for t, pairs in by.items():
        for key, d in pairs.items():
            if "specexit" not in d or "eagle3" not in d:
                continue
            s, e = d["specexit"], d["eagle3"]
            if loss == "disagreement":
                value = float(extract(s["completion_text"] or "") != extract(e["completion_text"] or ""))
            else:
                value = float(bool(e["correct"]) and not bool(s["correct"]))
            out.setdefault(t, {})[key] = value
    return out


def certificates_by_temperature(calibrated: str | Path, profiles: dict[str, str]) -> dict[str, dict]:
    """{temperature label: the certificate that speaks for it}: the profile's own (`calibration.by_profile`)
    where the calibrated file has one for that temperature's profile and its exit is that choice, else
    the joint one (no such profile, or it fell back to the joint exit: `source: joint`). `profiles`:
    {temperature label: profile name} (the evaluation summary's `sampling_profiles`)."""
    cal = json.loads(Path(calibrated).read_text()).get("calibration") or {}
    joint = cal.get("certificate")
    by = cal.get("by_profile") or {}
    out = {}
    for t, name in profiles.items():
        entry = by.get(name) or {}
        own = entry.get("certificate") if entry.get("source", "profile") != "joint" else None
        cert = own or joint
        if cert:
            out[t] = {
                "profile": name if own else None,  # None: the joint exit and its certificate
                **{k: cert.get(k) for k in ("epsilon", "delta", "loss", "bound", "n_dev")},
            }
    return out


def certificate_check(
    rows: Sequence[dict], calibrated: str | Path, profiles: dict[str, str], extract: Callable[[str], str | None]
) -> dict[str, dict]:
    """Per temperature: the certificate (epsilon, delta, loss, certified bound, dev prompts) and the
    test loss (mean, 95% interval, problem-samples, problems); `within_epsilon` judges the point loss,
    `holds` the whole interval (None when there is nothing to judge: no certified setting, no rows)."""
    certs = certificates_by_temperature(calibrated, profiles)
    out = {}
    for t, cert in certs.items():
        losses = measured_losses(rows, cert["loss"] or "disagreement", extract).get(t, {})
        keys = list(losses)
        mean = sum(losses.values()) / len(keys) if keys else None
        ci = accuracy_ci95([losses[k] for k in keys], keys=keys) if keys else None
        certified = cert["bound"] is not None
        out[t] = {
            **cert,
            "test_loss": mean,
            "test_loss_ci95": ci,
            "n": len(keys),
            "problems": len({k[0] for k in keys}),
            "within_epsilon": (mean <= cert["epsilon"]) if certified and mean is not None else None,
            "holds": (ci[1] <= cert["epsilon"]) if certified and ci is not None else None,
        }
    return out
