"""Every `ray job submit` command of docs/runbook.md, run as written against a local Ray head on
loopback with the toy configs in `$CONFIGS` (the runbook keeps all GPU settings in the configs, so
the command lines are the same): the smoke job, traces, labels, draft training. Outputs are read
back: every id once, the chain complete, the exported draft in vLLM's EAGLE-3 layout.

The toy configs are examples/toy/*.yaml with paths moved into a temp folder and sizes shrunk
(24 problems, 8 training steps) so the chain takes ~3 minutes on 2 cores.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import pytest
import yaml

from support.cli import output_json, run
from support.paths import REPO_ROOT
from support.ray_head import LocalHead, retry_no_agent

RUNBOOK = REPO_ROOT / "docs" / "runbook.md"
N_PROBLEMS = 24
STEPS = 8


# -- the runbook's commands ------------------------------------------------------------------------
def shell_commands(markdown: str) -> list[str]:
    """Commands of the ```bash blocks, continuation lines joined, comments dropped."""
    cmds = []
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", markdown, re.S):
        cur = ""
        for line in block.splitlines():
            if not cur and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.rstrip().endswith("\\"):
                cur += line.rstrip()[:-1] + " "
                continue
            cur += line
            cmds.append(cur.strip())
            cur = ""
    return cmds


def job_commands() -> list[str]:
    return [c for c in shell_commands(RUNBOOK.read_text()) if c.startswith("ray job submit")]


def entrypoint(cmd: str) -> list[str]:
    words = shlex.split(cmd)
    return words[words.index("--") + 1 :]


def test_runbook_job_commands_are_the_pipeline_stages():
    cmds = job_commands()
    stages = [entrypoint(c)[2] for c in cmds if entrypoint(c)[:2] == ["python", "-m"]]
    assert stages == ["pipelines.traces", "pipelines.labels", "pipelines.train_draft"], (
        cmds
    )  # python -m pipelines.<stage>
    for c in cmds:
        ep = entrypoint(c)
        assert "--address" not in c  # RAY_ADDRESS, exported once in the runbook
        if ep[:2] == ["python", "-m"]:
            # every GPU-only setting lives in the config: the only argument is the config file
            stage = ep[2].split(".")[1]
            assert ep[3:] == ["--config", f"$CONFIGS/{stage}.yaml"], c
            assert "--working-dir ." in c
    # and the recipes the runbook points $CONFIGS at have those files
    for folder in re.findall(r"CONFIGS=(\S+)", RUNBOOK.read_text()):
        for stage in ("traces", "labels", "train_draft"):
            assert (REPO_ROOT / folder / f"{stage}.yaml").exists(), (folder, stage)


# -- a private Ray head ----------------------------------------------------------------------------
def toy_configs(dest: Path) -> Path:
    """examples/toy/*.yaml with every path in `dest` and sizes cut for a CI run."""
    work = dest / "runs"
    cfgs = dest / "configs"
    cfgs.mkdir(parents=True)
    t = yaml.safe_load((REPO_ROOT / "examples/toy/traces.yaml").read_text())
    t["input"]["n"] = N_PROBLEMS
    t["output"] = str(work / "traces")
    t["chunk_rows"] = 8
    lab = yaml.safe_load((REPO_ROOT / "examples/toy/labels.yaml").read_text())
    lab.update(input=str(work / "traces"), output=str(work / "labels"), chunk_rows=8)
    tr = yaml.safe_load((REPO_ROOT / "examples/toy/train_draft.yaml").read_text())
    tr.update(
        input=str(work / "labels"),
        output=str(work / "draft"),
        storage_path=str(work / "ray_train"),
        steps=STEPS,
        batch_size=4,
        warmup_steps=2,
        log_every=2,
        checkpoint_every=4,
    )
    for name, cfg in (("traces", t), ("labels", lab), ("train_draft", tr)):
        (cfgs / f"{name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cfgs


@pytest.fixture(scope="module")
def head():
    from specexit_core.toy.paths import TEACHER_DIR

    if not (Path(TEACHER_DIR) / "config.json").exists():
        pytest.skip("no toy teacher (run `specexit toy build`)")
    h = LocalHead(prefix="rayrb")
    h.start()
    yield h
    h.stop()


@pytest.mark.vllm
@pytest.mark.slow
def test_runbook_job_commands_run_with_the_toy_configs(head, tmp_path):
    from pipelines.common.parts import read_all
    from pipelines.common.schemas import LABELS, TRACES

    configs = toy_configs(tmp_path)
    env = dict(head.env, CONFIGS=str(configs), RAY_ADDRESS=head.address)
    summaries, timings = {}, {}
    for cmd in job_commands():
        t0 = time.time()
        r = retry_no_agent(lambda: run(["bash", "-c", cmd], env=env, timeout=600))  # noqa: B023 (called at once)
        timings[cmd] = round(time.time() - t0, 1)
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-5000:]}\n{r.stderr[-3000:]}"
        ep = entrypoint(cmd)
        if ep[:2] == ["python", "-m"]:
            stage = ep[2].split(".")[1]
            summaries[stage] = output_json(r.stdout)
        else:
            assert "'CPU': 8.0" in r.stdout, r.stdout[-2000:]  # the smoke job saw the cluster
    print(json.dumps(timings, indent=1))

    out = tmp_path / "runs"
    assert set(summaries) == {"traces", "labels", "train_draft"}
    s = summaries["traces"]
    assert s["complete"] and s["input_rows"] == N_PROBLEMS == s["ok"] + s["errors"]
    traces = read_all(out / "traces")
    assert traces.schema == TRACES and sorted(traces.column("id").to_pylist()) == sorted(
        set(traces.column("id").to_pylist())
    )
    s = summaries["labels"]
    assert s["complete"] and s["input_rows"] == N_PROBLEMS
    labels = read_all(out / "labels")
    assert labels.schema == LABELS and labels.num_rows == N_PROBLEMS
    assert sum(st == "ok" for st in labels.column("status").to_pylist()) >= N_PROBLEMS - 4
    s = summaries["train_draft"]
    assert s["complete"] and s["step"] == STEPS
    cfg = json.loads((out / "draft" / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 160 and cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert any((out / "draft").glob("*.safetensors"))
