"""`python -m pipelines.traces --config FILE`: see pipelines/traces/job.py."""

import sys

from pipelines.common.stage_cli import main
from pipelines.traces.config import TracesConfig
from pipelines.traces.job import run

sys.exit(main("traces", TracesConfig, run))
