"""The SpecExit draft model: an EAGLE-3 drafter whose `fc` also emits the exit signals."""

from specexit_core.draft.config import DraftConfig
from specexit_core.draft.model import SpecExitDraft

__all__ = ["DraftConfig", "SpecExitDraft"]
