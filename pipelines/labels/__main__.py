"""`python -m pipelines.labels --config FILE`: see pipelines/labels/job.py."""

import sys

from pipelines.common.stage_cli import main
from pipelines.labels.config import LabelsConfig
from pipelines.labels.job import run

sys.exit(main("labels", LabelsConfig, run))
