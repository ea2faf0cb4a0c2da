"""The vLLM plugin loads without numba: vLLM's CPU worker, registering its kernel overrides at start,
reads `vars()` of every module attribute, and llvmlite's `ffi.lib` (loaded with numba) answers any
attribute, so a worker that has imported numba before then dies ("'_lib_fn_wrapper' object has no
attribute 'get'"). The hook's compiled loops are imported at its first step (exit/batch_scan.py)."""

import subprocess
import sys


def test_plugin_import_path_does_not_load_numba():
    code = (
        "import sys\n"
        "import specexit_core.vllm_plugin as p\n"
        "from specexit_core.vllm_plugin import runner_hook, committed_rows, controls, cpu_fixes, runner_choice\n"
        "from specexit_core.exit import batch_tracker\n"
        "import specexit_core.signals\n"
        "print(sorted(m for m in ('numba', 'llvmlite') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_the_hooks_first_step_loads_the_compiled_loops():
    code = (
        "import sys\n"
        "from specexit_core.bench.hook_bench import SyntheticDrafter, SyntheticRunner\n"
        "from specexit_core.vllm_plugin.runner_hook import SpecExitRunnerState\n"
        "before = 'numba' in sys.modules\n"
        "SpecExitRunnerState(SyntheticRunner(), SyntheticDrafter())\n"
        "print(before, 'specexit_core.vllm_plugin.step_kernels' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"], out


def test_an_edit_of_an_inlined_function_drops_the_loops_cache(tmp_path):
    """numba keys a file's cache on that file alone; step_kernels inlines batch_scan and signals, so
    a change there must drop step_kernels' cached loops (a stale one would run the old rule)."""
    from specexit_core.vllm_plugin.step_kernels import _drop_stale_cache

    stamp = tmp_path / "step_kernels.deps"
    cached = tmp_path / "step_kernels.step_rows-1.py311.nbi"
    other = tmp_path / "committed_rows.x-1.py311.nbi"
    cached.write_bytes(b""), other.write_bytes(b"")
    stamp.write_text("the sources before an edit of batch_scan.py or signals.py")
    _drop_stale_cache(tmp_path)
    assert not cached.exists() and other.exists() and stamp.read_text().isalnum()
    cached.write_bytes(b"")
    _drop_stale_cache(tmp_path)  # unchanged sources: the cache stays
    assert cached.exists()
