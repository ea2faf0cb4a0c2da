"""`python -m pipelines.train_heads --config FILE`: see pipelines/train_heads/job.py."""

import sys

from pipelines.common.stage_cli import main
from pipelines.train_heads.config import TrainHeadsConfig
from pipelines.train_heads.job import run

sys.exit(main("train_heads", TrainHeadsConfig, run))
