"""Never an empty answer: thinking ends early enough to leave `answer_reserve_tokens` of a request's
`max_tokens` to the answer.

Without it a request whose thinking runs into `max_tokens` comes back with `finish_reason: "length"`
and no content at all: every token went to thinking (vLLM issue #55382). With it, a request that
SpecExit follows gets a think budget of

    max_tokens - answer_reserve_tokens - MARKERS   (at least 1)

on top of any budget it already has (`max_think_tokens`, `thinking_token_budget`): the tighter one
holds, and when it is the reserve's the exit is reported as `answer_reserve`. MARKERS counts a
`<think>` the model may write itself and the `</think>` the exit places; neither is a think token,
both are output tokens. The reserve holds at every effort level, `max` (no early exit by the
signals) included; a request with SpecExit turned off (`enabled: false`) is plain decoding and
gets none. The vLLM hook and the reference engine both apply it through `with_answer_reserve`, so
they agree token for token.
"""

from __future__ import annotations

from dataclasses import replace

from specexit_core.exit.batch_tracker import BUDGET
from specexit_core.exit.policy import ExitDecision
from specexit_core.exit.settings import ExitConfig

ANSWER_RESERVE = "answer_reserve"  # the exit reason when the reserve's budget ended thinking
MARKERS = 2  # `<think>` (when the model writes it) and `</think>`: output tokens, not think tokens


def reserve_budget(max_tokens: int | None, reserve: int) -> int | None:
    """The think budget that leaves `reserve` of `max_tokens` to the answer (None: no limit)."""
    if max_tokens is None or reserve <= 0:
        return None
    return max(1, int(max_tokens) - reserve - MARKERS)


def with_answer_reserve(cfg: ExitConfig, max_tokens: int | None) -> tuple[ExitConfig, bool]:
    """(the setting a request runs with, whether its budget is now the reserve's). The reserve wins
    over `min_think_tokens` too: an answer is worth more than the minimum thinking."""
    budget = reserve_budget(max_tokens, cfg.answer_reserve_tokens) if cfg.enabled else None
    if budget is None or (cfg.max_think_tokens is not None and cfg.max_think_tokens <= budget):
        return cfg, False
    return cfg.with_overrides({"max_think_tokens": budget, "min_think_tokens": min(cfg.min_think_tokens, budget)}), True


def reported(decision: ExitDecision, reserve_binds: bool) -> ExitDecision:
    """The decision as telemetry reports it: a budget exit under the reserve's budget is `answer_reserve`."""
    if reserve_binds and decision.reason == BUDGET:
        return replace(decision, reason=ANSWER_RESERVE)
    return decision
