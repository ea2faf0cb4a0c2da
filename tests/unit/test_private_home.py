"""The test session runs with a private HOME (tests/conftest.py): nothing it starts writes into the
user's home directory (Ray's ~/.ray/auth_token, vLLM/torch/matplotlib caches)."""

import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path

USER_HOME = Path(pwd.getpwuid(os.getuid()).pw_dir)


def test_home_is_private_to_the_session():
    home = Path.home()
    assert home != USER_HOME and home.is_relative_to(tempfile.gettempdir())
    for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        assert Path(os.environ[var]).is_relative_to(home)
    # vLLM's cache: one per test pass, shared by its pytest-xdist workers, also a temporary folder
    vllm_cache = Path(os.environ["VLLM_CACHE_ROOT"])
    assert vllm_cache.is_relative_to(tempfile.gettempdir()) and not vllm_cache.is_relative_to(USER_HOME)


def test_child_processes_inherit_it():
    out = subprocess.run(
        [sys.executable, "-c", "from pathlib import Path; print(Path.home() / '.ray' / 'auth_token')"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(out).is_relative_to(Path.home())
