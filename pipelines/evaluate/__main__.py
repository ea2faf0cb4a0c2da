"""`python -m pipelines.evaluate`: see pipelines/evaluate/job.py."""

import sys

from pipelines.evaluate.job import main

sys.exit(main())
