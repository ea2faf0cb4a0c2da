import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The suite leaves nothing in the user's home: Ray writes ~/.ray/auth_token on a local ray.init(), vLLM,
# torch and matplotlib write caches under ~/.cache and ~/.config. Every process the tests start inherits
# a private HOME (and XDG dirs inside it), removed when the session ends.
USER_HOME = os.path.expanduser("~")
TEST_HOME = tempfile.mkdtemp(prefix="specexit-test-home-")
os.environ.update(
    HOME=TEST_HOME,
    XDG_CACHE_HOME=os.path.join(TEST_HOME, ".cache"),
    XDG_CONFIG_HOME=os.path.join(TEST_HOME, ".config"),
)
# vLLM's cache (VLLM_CACHE_ROOT, ~/.cache/vllm by default) holds what it learnt about each model class:
# a cold lookup inspects the class in a subprocess that imports torch and vLLM (~7 s per architecture).
# One cache for the whole pass: pytest-xdist's workers start after this runs in the controller and
# inherit the controller's path (they would otherwise each start cold in their own HOME); the
# controller removes its HOME, and so the cache, when the pass ends.
os.environ["VLLM_CACHE_ROOT"] = os.environ.setdefault(
    "SPECEXIT_TEST_VLLM_CACHE", os.path.join(TEST_HOME, ".cache", "vllm")
)


def _profile_the_suite() -> None:
    """SPECEXIT_TEST_PROFILE=1: every process from here on records what it starts (support/suite_profile.py).
    First, before anything imports Ray or vLLM."""
    from support.suite_profile import enable

    enable()


_profile_the_suite()


def _share_the_cores_between_workers() -> None:
    """In the parallel pass (scripts/test.sh: pytest-xdist workers on a 2-core machine) each worker's
    vLLM engines get a core of their own, and OpenMP threads spin briefly before they sleep. A vLLM CPU
    engine binds an OpenMP thread to every core, and libgomp's threads spin while they wait for a
    peer: two engines on the same two cores slowed each other 4-5x (docs/cpu-stack.md, "Two engines on
    two cores"); r1-llama-like's quick demo beside qwen3-like's: evaluation 788 s, ~190 s alone. Set in the
    environment, so the Ray workers, Serve replicas and CLI runs a test starts inherit it; a value the
    caller set wins (tests that need both cores, tensor parallelism for one, set their own)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    from specexit_core.vllm_env import THREADS_BIND_ENV

    os.environ.setdefault(THREADS_BIND_ENV, str(int(worker[2:]) % (os.cpu_count() or 1)))
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")


_share_the_cores_between_workers()


def _patient_serve_proxies() -> None:
    """Every Ray cluster a test starts (in process, `ray start`, a CLI run) gives Serve's HTTP proxy time to
    start beside busy engines: serve_app/proxy_readiness.py."""
    from serve_app.proxy_readiness import patient_proxy_readiness

    patient_proxy_readiness()


_patient_serve_proxies()

import pytest  # noqa: E402  (after HOME is private: nothing may read the user's home first)


def pytest_configure(config):
    from support.suite_profile import SuiteProfile, profile_dir

    d = profile_dir()
    if d is not None:
        config.pluginmanager.register(
            SuiteProfile(d, is_controller=not hasattr(config, "workerinput")), "suite_profile"
        )


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(TEST_HOME, ignore_errors=True)


def _has_vllm() -> bool:
    try:
        import vllm  # noqa: F401

        return True
    except Exception:
        return False


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    skip_vllm = pytest.mark.skip(reason="vLLM is not installed (run scripts/setup.sh)")
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    has_vllm, has_cuda = _has_vllm(), _has_cuda()
    for item in items:
        if "vllm" in item.keywords and not has_vllm:
            item.add_marker(skip_vllm)
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
    # The longest modules first (`slow`, longest `minutes` first), then the other integration tests, then
    # the unit tests: the parallel pass of scripts/test.sh hands out modules in this order, so a long
    # module never starts last. The sort is stable: tests keep their order inside a module.
    items.sort(key=_run_order)


def _run_order(item) -> tuple[int, float]:
    slow = item.get_closest_marker("slow")
    if slow:
        return 0, -slow.kwargs.get("minutes", 1)
    return (1 if "integration" in item.nodeid else 2), 0


@pytest.fixture(scope="session")
def teacher():
    """The shipped toy teacher, loaded once (transformers, float32)."""
    from specexit_core.toy.hf_generate import load_teacher
    from specexit_core.toy.paths import TEACHER_DIR

    return load_teacher(TEACHER_DIR)


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    """The shipped Qwen3 tokenizer (specexit_core/tokenizers/qwen3), loaded once."""
    from transformers import AutoTokenizer

    from specexit_core.tokenizers import QWEN3_TOKENIZER_DIR

    return AutoTokenizer.from_pretrained(QWEN3_TOKENIZER_DIR)
