"""Test modules are imported by basename (rootdir conftest, no packages): two files with the same name
in tests/unit and tests/integration stop the whole run at collection ("import file mismatch")."""

from collections import Counter

from support.paths import REPO_ROOT


def test_test_file_names_are_unique_across_folders():
    names = Counter(p.name for p in (REPO_ROOT / "tests").rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1], [n for n, k in names.items() if k > 1]
