"""The order in which the methods run on one problem (pure, seeded, unit-tested).

All methods share one prefix-cached engine and a shared machine, so a fixed order would give the
method that always runs second (e.g. SpecExit right after EAGLE-3) a warm prefix cache and the same
slice of background load every time. The order is shuffled per problem and temperature from a
stable seed (as `specexit bench vllm` rotates its order per prompt); the one constraint kept is that
the oracle follows EAGLE-3, whose trace it probes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def method_order(jobs: Sequence[tuple[str, str]], seed: int) -> list[tuple[str, str]]:
    """`jobs` ((method, setting) pairs) in a shuffled order for this `seed`; `oracle` after `eagle3`."""
    out = list(jobs)
    random.Random(seed).shuffle(out)
    names = [m for m, _ in out]
    if "oracle" in names and "eagle3" in names:
        i, j = names.index("oracle"), names.index("eagle3")
        if i < j:
            out[i], out[j] = out[j], out[i]
    return out
