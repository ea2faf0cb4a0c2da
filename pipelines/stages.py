"""The data stages by name (traces, labels, train_draft, train_heads) and their configs.

For callers above the stages (the demo, the bench, cluster rendering, tests) that pick a stage by
name; the stages themselves never import this.
"""

from __future__ import annotations

from pipelines.common.stage_cli import load_stage
from pipelines.labels.config import LabelsConfig
from pipelines.traces.config import TracesConfig
from pipelines.train_draft.config import TrainDraftConfig
from pipelines.train_heads.config import TrainHeadsConfig
from specexit_core.typed_config import StrictModel

STAGES: dict[str, type[StrictModel]] = {
    "traces": TracesConfig,
    "labels": LabelsConfig,
    "train_draft": TrainDraftConfig,
    "train_heads": TrainHeadsConfig,
}


def load_stage_config(
    stage: str,
    path: str | None,
    *,
    input: str | None = None,
    output: str | None = None,
    limit: int | None = None,
    raw: dict | None = None,
):
    """The named stage's config (see `stage_cli.load_stage`). Raises ConfigError."""
    return load_stage(STAGES[stage], stage, path, input=input, output=output, limit=limit, raw=raw)
