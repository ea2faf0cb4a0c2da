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
        "from specexit_app.bench.hook_bench import SyntheticDrafter, SyntheticRunner\n"
        "from specexit_core.vllm_plugin.runner_hook import SpecExitRunnerState\n"
        "before = 'numba' in sys.modules\n"
        "SpecExitRunnerState(SyntheticRunner(), SyntheticDrafter())\n"
        "print(before, 'specexit_core.vllm_plugin.step_kernels' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"], out


def test_an_edit_of_an_inlined_function_drops_the_loops_cache(tmp_path):
    """numba keys a file's cache on that file alone; step_kernels inlines batch_scan, smoothing and
    signals, so a change there must drop step_kernels' cached loops (a stale one would run the old
    rule)."""
    from specexit_core.compiled_cache import drop_stale_cache

    dep = tmp_path / "inlined.py"
    dep.write_text("x = 1\n")
    kernels = str(tmp_path / "step_kernels.py")
    cached = tmp_path / "step_kernels.step_rows-1.py311.nbi"
    other = tmp_path / "committed_rows.x-1.py311.nbi"
    drop_stale_cache(kernels, [str(dep)], tmp_path)  # first run: the stamp is written
    cached.write_bytes(b""), other.write_bytes(b"")
    drop_stale_cache(kernels, [str(dep)], tmp_path)  # nothing changed: the cache stays
    assert cached.exists()
    dep.write_text("x = 2\n")  # an edit of a file the loops inline
    drop_stale_cache(kernels, [str(dep)], tmp_path)
    assert not cached.exists() and other.exists()
