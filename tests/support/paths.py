"""Where things are: the checkout the tests run against and the venv's executables."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # tests/support/paths.py -> the checkout
VENV_BIN = Path(sys.executable).parent  # the venv's `ray`, `serve`, `python`


def load_script(relpath: str):
    """A script of the checkout that is not a package module (`studies/NAME.py`, `scripts/NAME.py`),
    imported as a module so a test can call its functions."""
    import importlib.util

    path = REPO_ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
