"""How many footer-reader actors a stage's Parquet read asks Ray Data for (pipelines/common/ray_parquet.py;
the read itself: tests/integration/test_pipelines_sources.py)."""

import os

from pipelines.common.ray_parquet import FOOTER_READERS_ENV, _footer_readers_env, footer_readers


def test_one_reader_per_64_files_at_most_rays_default():
    assert [footer_readers(n) for n in (0, 1, 64, 65, 640, 10**6)] == [1, 1, 1, 2, 10, 32]


def test_the_count_is_set_for_the_call_only_and_a_users_value_wins(monkeypatch):
    monkeypatch.delenv(FOOTER_READERS_ENV, raising=False)
    with _footer_readers_env(130):
        assert os.environ[FOOTER_READERS_ENV] == "3"
    assert FOOTER_READERS_ENV not in os.environ
    monkeypatch.setenv(FOOTER_READERS_ENV, "7")
    with _footer_readers_env(130):
        assert os.environ[FOOTER_READERS_ENV] == "7"
    assert os.environ[FOOTER_READERS_ENV] == "7"
