"""specexit_core.vllm_env's process-layout rule for vLLM engines on CPU (the plugin applies it to every
engine: offline, Serve replicas, the benches' direct path): the engine core runs the model itself at one
rank, and only there; and the core sets of several engine actors on one machine."""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from specexit_core.vllm_env import (
    claim_core_set,
    engine_actor_count,
    parse_cores,
    run_model_in_engine_core,
    split_cores,
)


def _cfg(device: str, world_size: int, backend: str) -> SimpleNamespace:
    return SimpleNamespace(
        device_config=SimpleNamespace(device_type=device),
        parallel_config=SimpleNamespace(world_size=world_size, distributed_executor_backend=backend),
    )


def test_cpu_one_rank_mp_becomes_uniprocess():
    cfg = _cfg("cpu", 1, "mp")
    assert run_model_in_engine_core(cfg) is True
    assert cfg.parallel_config.distributed_executor_backend == "uni"


@pytest.mark.parametrize(
    "device,world_size,backend",
    [("cuda", 1, "mp"), ("cuda", 1, "ray"), ("cpu", 2, "mp"), ("cpu", 1, "ray"), ("cpu", 1, "uni")],
)
def test_everything_else_is_left_as_it_is(device, world_size, backend):
    cfg = _cfg(device, world_size, backend)
    assert run_model_in_engine_core(cfg) is False
    assert cfg.parallel_config.distributed_executor_backend == backend


@pytest.mark.parametrize("bind,cores", [("0", [0]), ("0-3", [0, 1, 2, 3]), ("5,2-4", [5, 2, 3, 4]), (" 1 , 3", [1, 3])])
def test_parse_cores_reads_vllms_syntax(bind, cores):
    assert parse_cores(bind) == cores


@pytest.mark.parametrize("bind", ["", "0|1", "1,1", "a"])
def test_parse_cores_refuses_what_is_not_one_core_list(bind):
    with pytest.raises(ValueError):
        parse_cores(bind)


@pytest.mark.parametrize(
    "bind,n,sets",
    [
        ("0-1", 2, ["0", "1"]),
        ("0-1", 1, ["0,1"]),
        ("0", 2, ["0"]),  # never two engines on one core
        ("0-4", 2, ["0,1,2", "3,4"]),
        ("0-7", 3, ["0,1,2", "3,4,5", "6,7"]),
    ],
)
def test_split_cores_gives_disjoint_sets_covering_the_binding(bind, n, sets):
    got = split_cores(bind, n)
    assert got == sets
    assert sorted(c for s in got for c in parse_cores(s)) == sorted(parse_cores(bind))
    assert engine_actor_count(n, bind) == len(sets)


_CLAIM = """
import sys, time
from specexit_core.vllm_env import claim_core_set
bind, handle = claim_core_set("0-1", 2, lock_dir=sys.argv[1])
print(bind, flush=True)
time.sleep(30)
"""


def test_claims_are_distinct_while_held_and_freed_when_the_holder_dies(tmp_path):
    first, h = claim_core_set("0-1", 2, lock_dir=str(tmp_path))
    other = subprocess.Popen([sys.executable, "-c", _CLAIM, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        second = other.stdout.readline().strip()
        assert {first, second} == {"0", "1"}  # another process gets the other core
    finally:
        other.kill()
        other.wait()
    h.close()  # both freed: the next claim gets the first set again
    again, h2 = claim_core_set("0-1", 2, lock_dir=str(tmp_path))
    assert again == "0" and h2 is not None
    h2.close()


@pytest.mark.parametrize("bind", ["auto", "nobind", "0|1"])
def test_a_binding_that_is_not_one_core_list_is_left_as_it_is(bind, tmp_path):
    assert engine_actor_count(1, bind) == 1 and engine_actor_count(2, bind) == 2
    assert claim_core_set(bind, 2, lock_dir=str(tmp_path)) == (bind, None)


def test_bind_this_process_pins_the_engines_and_torch(monkeypatch):
    import torch

    from specexit_core.vllm_env import THREADS_BIND_ENV, bind_this_process

    monkeypatch.setenv(THREADS_BIND_ENV, "0-1")
    before = torch.get_num_threads()
    try:
        bind_this_process("0")
        assert os.environ[THREADS_BIND_ENV] == "0" and torch.get_num_threads() == 1
        bind_this_process("auto")  # left to vLLM: torch untouched
        assert os.environ[THREADS_BIND_ENV] == "auto" and torch.get_num_threads() == 1
    finally:
        torch._C.set_num_threads(before)  # torch.set_num_threads is a no-op after an in-process engine


def test_the_plugin_applies_the_rule_after_the_platforms_own_check(monkeypatch):
    """specexit_core/vllm_plugin/cpu_uniprocess.py: vLLM-CPU's check turns `uni` into `mp`; the wrapped
    check turns it back at one rank, unless SPECEXIT_CPU_UNIPROCESS=0."""
    from specexit_core.vllm_plugin.cpu_uniprocess import UNIPROCESS_ENV, after_platform_check

    class Platform:
        @classmethod
        def check_and_update_config(cls, cfg):
            cfg.parallel_config.distributed_executor_backend = "mp"  # what vLLM-CPU 0.32 does

    Platform.check_and_update_config = classmethod(after_platform_check(Platform.check_and_update_config.__func__))
    monkeypatch.delenv(UNIPROCESS_ENV, raising=False)
    for world_size, backend in ((1, "uni"), (2, "mp")):
        cfg = _cfg("cpu", world_size, "uni")
        Platform.check_and_update_config(cfg)
        assert cfg.parallel_config.distributed_executor_backend == backend
    monkeypatch.setenv(UNIPROCESS_ENV, "0")
    cfg = _cfg("cpu", 1, "uni")
    Platform.check_and_update_config(cfg)
    assert cfg.parallel_config.distributed_executor_backend == "mp"
