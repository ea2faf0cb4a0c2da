"""`python -m pipelines.report`: see pipelines/report/job.py."""

import sys

from pipelines.report.job import main

sys.exit(main())
