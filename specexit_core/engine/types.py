"""Requests and results shared by every engine (reference, vLLM), so layers above are engine-agnostic."""

from __future__ import annotations

from dataclasses import dataclass, field

from specexit_core.exit import ExitConfig, ExitDecision


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int = 512
    temperature: float = 0.0
    seed: int = 0
    exit: ExitConfig | None = None  # None -> the engine's default; ExitConfig(enabled=False) -> no exit


@dataclass
class AcceptanceStats:
    rounds: int = 0  # target forward passes after the prefill
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens accepted

    @property
    def mean_accept_len(self) -> float:
        """Tokens committed per target forward (accepted drafts + the bonus/correction token)."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    def to_json(self) -> dict:
        return {
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "mean_accept_len": self.mean_accept_len,
        }


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated ids (EOS excluded)
    text: str
    think_tokens: int  # tokens generated before </think> (all of them if it never closed)
    exit: ExitDecision | None  # set when the engine forced </think>
    stats: AcceptanceStats = field(default_factory=AcceptanceStats)
    signals: list[tuple[float, float, float]] = field(default_factory=list)  # per generated token (activated)
    finish_reason: str = "stop"  # "stop" (EOS) | "length"

    @property
    def exited(self) -> bool:
        return self.exit is not None
