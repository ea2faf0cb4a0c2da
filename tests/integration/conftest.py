"""Fixtures shared by the engine tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def telemetry_dir(tmp_path_factory):
    """A folder for the plugin's per-request telemetry (exits, fallbacks, long mode), for one module."""
    d = tmp_path_factory.mktemp("telemetry")
    os.environ["SPECEXIT_TELEMETRY_DIR"] = str(d)  # inherited by the engine's worker processes
    yield d
    os.environ.pop("SPECEXIT_TELEMETRY_DIR", None)
