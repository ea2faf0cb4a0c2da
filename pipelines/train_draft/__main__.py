"""`python -m pipelines.train_draft --config FILE`: see pipelines/train_draft/job.py."""

import sys

from pipelines.common.stage_cli import main
from pipelines.train_draft.config import TrainDraftConfig
from pipelines.train_draft.job import run

sys.exit(main("train_draft", TrainDraftConfig, run))
