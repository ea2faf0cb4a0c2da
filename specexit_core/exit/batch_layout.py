"""The codes `BatchTrackers` (batch_tracker.py) writes and its compiled scan (batch_scan.py) reads.

Both sides must agree on them bit for bit, so they live in one module of their own that both
import: batch_scan pulls in numba and is imported only at the hook's first step (see its
docstring), while batch_tracker is imported at plugin load, so neither can hold them for the other.
No numba here. The scan's compiled loops bake these values in: batch_scan (and the vLLM hook's
step_kernels, which inlines it) drop their numba cache when this file changes (compiled_cache.py).
"""

from __future__ import annotations

import numpy as np

from specexit_core.exit.signal_names import SIGNALS
from specexit_core.exit.thresholds import PASS_SIDE

# token class bits, one byte per token id (`BatchTrackers.code_of`): split token, `<think>`, `</think>`
SPLIT_BIT, START_BIT, END_BIT = 1, 2, 4

# per signal, in SIGNALS order: +1 passes above its threshold, -1 below (thresholds.PASS_SIDE)
SIDE = np.array([PASS_SIDE[s] for s in SIGNALS])

# a row's first event, as the scan records it (`new_events`' kind array); batch_tracker names them
KIND_DECISION, KIND_BUDGET, KIND_ERROR = 0, 1, 2
