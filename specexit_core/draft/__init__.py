"""The SpecExit draft model: an EAGLE-3 drafter whose `fc` also emits the exit signals."""

from .config import DraftConfig
from .model import SpecExitDraft

__all__ = ["DraftConfig", "SpecExitDraft"]
