"""Everything about *when* SpecExit ends thinking, in pure Python (no torch): the exit settings,
the per-token policy the engines run, its offline replay, and the paragraph-break tokens.

  signal_names  SIGNALS (the three names, in fc-row order) and method strings
  settings      ExitConfig (the paper's defaults), NEVER_FIRES, calibrated files, resolve_exit_config
  profiles      exit settings per sampling profile: which one a request gets from how it samples
  smoothing     the EWMA step
  thresholds    passes(): the threshold check at a paragraph break
  policy        ExitTracker / ExitDecision / decide: the decision the engines take
  answer_reserve  the think budget that leaves an answer its tokens of max_tokens
  replay        the same decision for a grid of settings over a finished trace (calibration)
  split_tokens  which tokens are paragraph breaks, for any tokenizer
"""

from specexit_core.exit.policy import ExitCheck, ExitDecision, ExitTracker, decide
from specexit_core.exit.settings import (
    EXIT_CONFIG_ENV,
    NEVER_FIRES,
    ExitConfig,
    exit_overrides,
    load_exit_overrides,
    resolve_exit_config,
)
from specexit_core.exit.signal_names import SIGNALS, parse_method
from specexit_core.exit.smoothing import ewma, ewma_step
from specexit_core.exit.split_tokens import split_token_ids
from specexit_core.exit.thresholds import passes

__all__ = [
    "EXIT_CONFIG_ENV",
    "NEVER_FIRES",
    "SIGNALS",
    "ExitCheck",
    "ExitConfig",
    "ExitDecision",
    "ExitTracker",
    "decide",
    "ewma",
    "ewma_step",
    "exit_overrides",
    "load_exit_overrides",
    "parse_method",
    "passes",
    "resolve_exit_config",
    "split_token_ids",
]
