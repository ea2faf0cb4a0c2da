"""README's result tables match the raw JSON under docs/results/ (rounded as README prints them).

Every README table that reports measurements is tied to one file here; a table with measurement
columns that no file backs fails the test, so a figure cannot enter README without its raw JSON
(which carries command, commit, machine and date).
"""

from __future__ import annotations

import json
import re

import pytest

from support.paths import REPO_ROOT

RESULTS = REPO_ROOT / "docs" / "results"
PROVENANCE = ("command", "commit", "machine", "date")


def tables(md: str) -> list[list[list[str]]]:
    """Every Markdown table: a list of rows (header first, separator dropped), cells stripped."""
    out, cur = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                cur.append(cells)
        elif cur:
            out.append(cur)
            cur = []
    return out


def _name(cell: str) -> str:
    """`**specexit**` / `budget (best: 128)` / `eagle3 (stock draft, no hook)` -> the method name."""
    return cell.replace("*", "").split(" (")[0].strip()


def _ci(ci, scale=100.0) -> str:
    return f"[{scale * ci[0]:.1f}, {scale * ci[1]:.1f}]"


def demo_row(name: str, m: dict) -> list[str]:
    """A row of README's demo tables, from `methods[name]` of docs/results/demo_toy_cpu.json."""
    vs = m.get("accuracy_vs_eagle3")
    return [
        f"{100 * m['accuracy']:.1f}%",
        _ci(m["accuracy_ci95"]),
        "-" if vs is None else f"{vs['points']:+.1f} {_ci(vs['ci95'], 1.0)}",
        f"{m['think_tokens']:.1f}",
        f"{1000 * m['latency_s']:.0f}",
        f"{m['probe_requests']:.2f}",
    ]


def bench_row(name: str, m: dict) -> list[str]:
    """A row of README's `specexit bench vllm` table, from docs/results/bench_vllm_toy_cpu.json."""
    return [
        f"{100 * m['accuracy']:.0f}%",
        f"{m['think_tokens']:.1f}",
        f"{1000 * m['latency_s']:.0f} ms",
        f"{1000 * m['latency_s_c16']:.0f} ms",
        f"{m['acceptance_length']:.2f}",
    ]


def kv_row(name: str, m: dict) -> list[str]:
    """A row of README's `specexit bench kv` pressure table, from docs/results/kv_toy_cpu.json."""
    limit = " (sweep limit)" if m["sweep_limit_reached"] else ""
    return [
        f"{m['concurrent_without_preemption']}{limit}",
        f"{m['preemptions']}",
        f"{m['completed']} / {m['pressure_requests']}",
        f"{m['kv_block_seconds_per_request']:.2f}",
        f"{m['think_tokens']:.1f}",
        f"{100 * m['accuracy']:.0f}%",
    ]


def generalisation_row(name: str, d: dict) -> list[str]:
    """A row of README's generalisation table (one distribution), from
    docs/results/generalisation_toy_cpu.json `distributions[name]`."""
    m = d["methods"]
    e, s, p, o = m["eagle3"], m["specexit"], m["specexit_paper"], m["oracle"]
    vs = s["accuracy_vs_eagle3"]
    return [
        f"{100 * e['accuracy']:.1f}%",
        f"{100 * s['accuracy']:.1f}% {_ci(s['accuracy_ci95'])}",
        f"{vs['points']:+.1f} {_ci(vs['ci95'], 1.0)}",
        f"{e['think_tokens']:.1f} / {s['think_tokens']:.1f} / {o['think_tokens']:.1f}",
        f"{100 * s['think_saving_vs_eagle3']:.0f}% / {100 * p['think_saving_vs_eagle3']:.0f}%",
    ]


def kv_host_row(name: str, m: dict) -> list[str]:
    """A row of README's host-tier table, from docs/results/kv_toy_cpu.json `pressure_host_tier`."""
    return [
        f"{m['preemptions']}",
        f"{m['resumed_requests']}",
        f"{m['resumed_blocks_loaded']}",
        f"{m['completed']} / {m['pressure_requests']}",
        f"{m['wall_s_ratio_vs_without']:.2f}",
        "yes" if m["identical_to_without"] else "no",
    ]


def teacher_row(name: str, run: tuple[dict, str]) -> list[str]:
    """A row of README's realistic-teachers table (`teacher, T`), from docs/results/demo_<teacher>/demo.json:
    the figures at temperature T and the verdicts of the recipe's targets (`targets_of_the_recipe`)."""
    d, t = run
    m, chk = d["by_temperature"][t], d["targets_of_the_recipe"][t]
    e, s, o = m["eagle3"], m["specexit"], m["oracle"]
    vs, acc = s["accuracy_vs_eagle3"], chk["accuracy_within_1_point_of_eagle3"]
    (near,) = [c for k, c in chk.items() if k.startswith("think_within_")]
    sp = chk["speedup_vs_eagle3"]
    miss = float(sp["target"].split()[-1]) - sp["value"]
    # the paired bootstrap interval over the timed problems, where the run recorded it
    speed = f"{sp['value']:.2f}x" + (" [{:.2f}, {:.2f}]".format(*sp["ci95"]) if sp.get("ci95") else "")
    return [
        f"{100 * e['accuracy']:.0f}% / {100 * s['accuracy']:.0f}%",
        f"{vs['points']:+.1f} {_ci(vs['ci95'], 1.0)}"
        + (" ✓" if acc["pass"] else " **(missed)**" if vs["ci95"][1] <= -1.0 else " (not established)"),
        f"{e['think_tokens']:.0f} / {s['think_tokens']:.0f} / {o['think_tokens']:.0f}",
        f"{near['value']:.2f}x ✓" if near["pass"] else f"**{near['value']:.2f}x (missed)**",
        f"{speed} ✓" if sp["pass"] else f"**{speed} (missed by {miss:.2f})**",
        f"{d['seconds'] / 60:.0f} min" if t == next(iter(d["by_temperature"])) else "",
    ]


def _teacher_runs() -> dict:
    """`qwen3-like, 0` -> (that teacher's demo.json, "0"): every temperature of every bundled run; a
    further run of a teacher is `qwen3-like run 2, 0` (its bundle's `run.label`). README's table keeps the
    earlier runs beside the current ones, so their bundles in `archive/` count too."""
    out = {}
    for f in sorted([*RESULTS.glob("demo_*/demo.json"), *RESULTS.glob("archive/demo_*/demo.json")]):
        d = _load(str(f.relative_to(RESULTS)))
        label = d.get("run", {}).get("label")
        name = f"{d['teacher']} {label}" if label else d["teacher"]
        assert not any(k.startswith(name + ",") for k in out), f"two bundled runs are both {name!r}"
        out.update({f"{name}, {t}": (d, t) for t in d["by_temperature"]})
    return out


def _load(name: str) -> dict:
    d = json.loads((RESULTS / name).read_text())
    missing = [k for k in PROVENANCE if not d.get(k)]
    assert not missing, f"docs/results/{name} lacks {missing}"
    return d


# README tables whose raw JSON was never kept, named here one by one (README says so beside each);
# they must go once the full run that replaces them is committed (test_legacy_tables_are_replaced).
LEGACY: set[str] = set()  # none left: the full demo run replaced the last one


def effort_row(name: str, m: dict) -> list[str]:
    """A row of README's reasoning-effort table, from docs/results/certificate_coverage/toy_effort_levels.json
    at T = 0.6: the level's epsilon (`eagle3`: none), think tokens, accuracy and its difference to EAGLE-3."""
    vs = m.get("accuracy_vs_eagle3")
    return [
        "-" if m.get("epsilon") is None else f"{100 * m['epsilon']:g}%",
        f"{m['think_tokens']:.1f}",
        f"{100 * m['accuracy']:.1f}% {_ci(m['accuracy_ci95'])}",
        "-" if vs is None else f"{vs['points']:+.1f} {_ci(vs['ci95'], 1.0)}",
    ]


def _effort_levels() -> dict:
    """`eagle3` and each level at T = 0.6, with the level's epsilon."""
    d = _load("certificate_coverage/toy_effort_levels.json")
    t = d["by_temperature"]["0.6"]
    levels = {p["setting"]: {**p, "epsilon": d["epsilons"].get(p["setting"])} for p in t["effort"]}
    return {"eagle3": t["eagle3"], **levels}


def _backing(header: list[str]):
    """(the JSON's methods for this table, the row formatter), or None for a table of no measurements."""
    h = header[0]
    if h in LEGACY:
        return "legacy"
    if h.startswith("T = "):
        d = _load("demo_toy_cpu.json")
        return d["by_temperature"][h[4:].strip()], demo_row
    if h.startswith("toy distribution"):
        return _load("generalisation_toy_cpu.json")["distributions"], generalisation_row
    if h.startswith("toy, 50 test problems"):
        return _load("bench_vllm_toy_cpu.json")["methods"], bench_row
    if h.startswith("toy, same waves with a host tier"):
        return _load("kv_toy_cpu.json")["pressure_host_tier"], kv_host_row
    if h == "teacher, T":
        return _teacher_runs(), teacher_row
    if h.startswith("toy, KV pool"):
        return _load("kv_toy_cpu.json")["pressure"], kv_row
    if h.startswith("reasoning effort, toy"):
        return _effort_levels(), effort_row
    if h.startswith("rule, on each set of"):
        return _coverage_rules(), lambda name, cells: cells
    return None


def _coverage_rules() -> dict[str, list[str]]:
    """README's certificate-coverage table, from docs/results/certificate_coverage/toy_eps001.json."""
    d = _load("certificate_coverage/toy_eps001.json")
    lo, pe = d["loss_order"], d["point_estimate"]
    pct = lambda x, nd=1: f"{100 * x:.{nd}f}%"  # noqa: E731
    return {
        "certified": [
            pct(1 - d["coverage"]),
            pct(d["mean_pool_loss_certified"], 2),
            pct(d["certified_share"], 0),
            f"{d['mean_think_tokens_certified']:.1f}",
        ],
        "loss order": [
            pct(1 - lo["coverage"]),
            pct(lo["mean_pool_loss"], 2),
            pct(lo["certified_share"], 0),
            f"{lo['mean_think_tokens']:.1f}",
        ],
        "point estimate": [
            pct(pe["exceed_share"]),
            pct(pe["mean_pool_loss"], 2),
            "-",
            f"{pe['mean_think_tokens']:.1f}",
        ],
    }


MEASURED = re.compile(r"accuracy|latency|think tokens|acceptance", re.I)


def test_every_measurement_table_matches_its_json():
    md = (REPO_ROOT / "README.md").read_text()
    checked = 0
    for t in tables(md):
        header, rows = t[0], t[1:]
        backing = _backing(header)
        if backing == "legacy":
            continue
        if backing is None:
            assert not any(MEASURED.search(c) for c in header[1:]), f"README table without raw JSON: {header}"
            continue
        methods, fmt = backing
        for row in rows:
            name = _name(row[0])
            assert name in methods, f"README row {row[0]!r} is not in the JSON ({sorted(methods)})"
            assert row[1:] == fmt(name, methods[name]), f"README row {row[0]!r} differs from docs/results/"
            checked += 1
    assert checked >= 3


def test_hook_figures_match_their_json():
    md = (REPO_ROOT / "README.md").read_text()
    d = _load("bench_hook_cpu.json")
    m = re.search(r"1 / 16 / 64 / 256 running requests: ([\d, /]+) µs\s+per step, against ([\d, /]+) µs", md)
    assert m, "README no longer quotes the hook bench per size"
    for text, key in ((m.group(1), "hook_us_per_step"), (m.group(2), "step_us_without_hook")):
        want = [f"{round(d[key][s]):,}" for s in ("1", "16", "64", "256")]
        assert [x.strip() for x in text.split("/")] == want


def test_kv_restart_figures_match_their_json():
    md = (REPO_ROOT / "README.md").read_text()
    r = _load("kv_toy_cpu.json")["restart"]
    (row,) = [t[1] for t in tables(md) if t[0][0].startswith("after a restart")]
    assert row[1:] == [
        f"{r['hit_share']:.2f} ({r['blocks_from_directory'] + r['blocks_from_host']} / {r['prompt_blocks']} blocks)",
        f"{r['prefill_tokens_with']} / {r['prefill_tokens_without']} ({r['prefill_tokens_ratio']:.3f})",
        f"{1000 * r['ttft_s_with']:.1f} / {1000 * r['ttft_s_without']:.1f} ms ({r['ttft_ratio']:.2f})",
        "yes" if r["identical"] else "no",
    ]


def test_readme_cites_only_files_that_exist():
    md = (REPO_ROOT / "README.md").read_text()
    cited = set(re.findall(r"docs/results/[\w./-]+\.json", md))
    assert "docs/results/bench_vllm_toy_cpu.json" in cited
    pending = any(t[0][0] in LEGACY for t in tables(md))  # README names where the next full run goes
    for c in cited:
        if not (pending and c == "docs/results/demo_toy_cpu.json"):
            assert (REPO_ROOT / c).exists(), c


def test_legacy_tables_are_replaced():
    """Once the full demo run's JSON is committed, README's unbacked legacy table must be gone."""
    md = (REPO_ROOT / "README.md").read_text()
    legacy = [t[0][0] for t in tables(md) if t[0][0] in LEGACY]
    if (RESULTS / "demo_toy_cpu.json").exists():
        assert not legacy, f"docs/results/demo_toy_cpu.json exists: regenerate README's tables from it ({legacy})"


@pytest.mark.parametrize("md", ["| a | b |\n|---|---|\n| 1 | 2 |\n\ntext\n| c |\n"])
def test_table_parser(md):
    assert tables(md) == [[["a", "b"], ["1", "2"]], [["c"]]]
