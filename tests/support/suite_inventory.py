"""The suite's test inventory: how many tests each module holds, from pytest's own collection.

    .venv/bin/python tests/support/suite_inventory.py > docs/results/test_inventory_<commit>.json

Kept beside the suite profile (suite_profile.py) so that a change that trims the suite's time can show
that it moved tests rather than dropped them (README "The test suite"; docs/testing.md lists each
feature with the test that covers it end to end)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def collect(repo: Path = REPO_ROOT) -> list[str]:
    """Node ids of every collected test (vLLM-only and GPU-only ones included: they are skipped, not
    uncollected)."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=repo,
        capture_output=True,
        text=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    return [line for line in out.stdout.splitlines() if "::" in line]


def inventory(repo: Path = REPO_ROOT) -> dict:
    ids = collect(repo)
    per_module = Counter(i.split("::")[0] for i in ids)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=repo)
    return {
        "what": "tests per module, from `pytest --collect-only` (tests/support/suite_inventory.py)",
        "commit": commit.stdout.strip(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "tests": len(ids),
        "unit": sum(n for m, n in per_module.items() if m.startswith("tests/unit/")),
        "integration": sum(n for m, n in per_module.items() if m.startswith("tests/integration/")),
        "per_module": dict(sorted(per_module.items())),
    }


if __name__ == "__main__":
    print(json.dumps(inventory(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT), indent=1))
