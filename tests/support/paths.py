"""Where things are: the checkout the tests run against and the venv's executables."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # tests/support/paths.py -> the checkout
VENV_BIN = Path(sys.executable).parent  # the venv's `ray`, `serve`, `python`
