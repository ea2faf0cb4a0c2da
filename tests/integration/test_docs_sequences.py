"""The `ray start` + `ray job submit` sequence of pipelines/README.md, run exactly as written, in a
copy of the checkout, in both states a user meets, each with a temporary `HOME`:

- a fresh machine: no `~/.ray`;
- after the demo or any local `ray.init()`: Ray 2.60 has written `~/.ray/auth_token`, which makes
  the next `ray start --head` use token auth by itself. A sequence without `RAY_AUTH_MODE=token`
  then fails at `ray job submit` with "Missing authentication token" (issue #16, item 12).

The block starts a cluster on Ray's default ports, so this test must not share the machine with
another default-port Ray instance: it is marked `serial`, and scripts/test.sh runs it alone. It stops only its own cluster: the
processes that carry its temporary `HOME`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from support.cli import output_json, tail
from support.paths import REPO_ROOT, VENV_BIN
from support.ray_head import stop_processes

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.serial]

README = REPO_ROOT / "pipelines" / "README.md"
SECTION = "## On a cluster: `ray job submit`"


def cluster_block() -> str:
    """The first ```bash block of the README's cluster section, verbatim."""
    text = README.read_text()
    section = text[text.index(SECTION) :]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def checkout_copy(dest: Path) -> Path:
    """The checkout's files as `git` sees them (tracked and new, not ignored), plus its venv."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        src = REPO_ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    (dest / ".venv").symlink_to(VENV_BIN.parent)  # the block's `source .venv/bin/activate`
    return dest


def user_env(home: Path) -> dict[str, str]:
    """A user's shell: own HOME, no Ray settings inherited from the test run, venv not on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VIRTUAL_ENV"))}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != VENV_BIN)
    env.update(HOME=str(home), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def stop_cluster_of(home: Path) -> None:
    """Stop every process started with this HOME (the block's `ray start` and what it spawned);
    `ray stop` would also stop other Ray instances on the machine."""
    import psutil

    mine = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.environ().get("HOME") == str(home):
                mine.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    stop_processes(mine, timeout=10)


def ray_address_file() -> Path:
    """Where `ray start` records the latest cluster; a later `ray.init()` without an address joins it."""
    from ray._private.utils import get_ray_address_file

    return Path(get_ray_address_file(None))


def run_block(workdir: Path, home: Path) -> dict:
    """The README block in bash (`set -e`), then the job's summary line. Afterwards the cluster is
    stopped and Ray's latest-cluster file put back as it was (what `ray stop` does), so later tests'
    `ray.init()` starts its own cluster instead of dialing this stopped one."""
    address_file = ray_address_file()
    before = address_file.read_text() if address_file.exists() else None
    try:
        r = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + cluster_block()],
            cwd=workdir,
            env=user_env(home),
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        stop_cluster_of(home)
        if before is None:
            address_file.unlink(missing_ok=True)
        else:
            address_file.write_text(before)
    assert r.returncode == 0, tail(r)
    return output_json(r.stdout)


def test_block_is_what_this_test_runs():
    firsts = [line.split("#")[0].strip() for line in cluster_block().splitlines()]
    order = ["export RAY_AUTH_MODE=token", "ray get-auth-token --generate", "ray start --head", "ray job submit"]
    at = [next(i for i, line in enumerate(firsts) if line.startswith(cmd)) for cmd in order]
    assert at == sorted(at), firsts


def test_cluster_sequence_works_on_a_fresh_machine_and_after_the_demo(tmp_path):
    from specexit_core.toy.paths import TEACHER_DIR

    if not (Path(TEACHER_DIR) / "config.json").exists():
        pytest.skip("no toy teacher (run `specexit toy build`)")
    workdir = checkout_copy(tmp_path / "checkout")

    fresh = tmp_path / "home-fresh"
    fresh.mkdir()
    s = run_block(workdir, fresh)
    assert s["complete"] and s["input_rows"] == 16 == s["ok"] + s["errors"], s
    assert (fresh / ".ray" / "auth_token").exists()  # the block made the token it then used

    # after the demo: a stage's local ray.init() (no RAY_AUTH_MODE) leaves ~/.ray/auth_token behind
    used = tmp_path / "home-after-demo"
    used.mkdir()
    init = subprocess.run(
        [str(VENV_BIN / "python"), "-c", "import ray; ray.init(address='local', num_cpus=1); ray.shutdown()"],
        env=user_env(used),
        capture_output=True,
        text=True,
        timeout=300,
    )
    stop_cluster_of(used)
    assert init.returncode == 0, tail(init)
    assert (used / ".ray" / "auth_token").exists()
    s = run_block(workdir, used)  # same checkout: the job resumes the first run's output
    assert s["complete"] and s["input_rows"] == 16 and s["skipped_already_done"] == 16, s
