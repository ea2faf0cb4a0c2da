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
