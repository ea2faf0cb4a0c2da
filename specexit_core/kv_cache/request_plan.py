"""Scheduler-side bookkeeping of the connector, free of vLLM types so it is unit-tested alone.

Per request: the keys of its full blocks, its block ids and a save cursor. `match` answers vLLM's
"how many more tokens can you load?"; `after_alloc` turns a match into (block id, key) loads; `step`
turns one scheduled step into (block id, key) saves: the blocks this step fills that no tier holds yet.

By default only prompt blocks are stored (a later turn's prompt carries the generated tokens anyway).
With `generated=True` the full blocks of generated tokens are stored too, once their tokens are
committed (below the request's computed tokens, so never a draft that verification may reject): a
request the scheduler preempts to free KV blocks (its blocks freed, its tokens kept) then reloads its
KV from the tiers when it resumes instead of recomputing prompt and output. Generated keys are read
from the request's live token list, which the scheduler extends as tokens are accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specexit_core.kv_cache.block_keys import extend_block_keys

# where a key is held now ("host", "directory") or None
Locate = Callable[[str], str | None]


@dataclass
class _Request:
    keys: list[str]  # keys of the full blocks known so far (the prompt's, then generated ones)
    prompt_blocks: int = 0  # how many of `keys` are the prompt's
    tokens: Sequence[int] | None = None  # the request's live token list (prompt + output), if generated
    salt: str | None = None
    block_ids: list[int] = field(default_factory=list)
    cursor: int = 0  # blocks below this need no saving (local hits, loaded, or already saved)
    match_start: int = 0  # first block of the last match
    match_tiers: list[str] = field(default_factory=list)  # tier of each matched block


@dataclass
class StepPlan:
    loads: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # req id -> [(block id, key)]
    saves: list[tuple[int, str]] = field(default_factory=list)


class RequestPlanner:
    def __init__(self, namespace: str, block_size: int, keep_last_block: bool = False, generated: bool = False):
        self.namespace = namespace
        self.block_size = block_size
        self.generated = generated  # store committed generated blocks too (module docstring)
        # EAGLE drafters read the token after each position: like vLLM's own prefix cache, leave the
        # last matched block to be recomputed so the draft's KV there matches this request
        self.keep_last_block = keep_last_block
        self._reqs: dict[str, _Request] = {}
        self._pending_loads: dict[str, list[tuple[int, str]]] = {}

    def track(
        self, req_id: str, prompt: Sequence[int], salt: str | None = None, tokens: Sequence[int] | None = None
    ) -> None:
        """Start keying a request: its prompt's full blocks now; with `generated`, later blocks of
        `tokens` (its live prompt + output list) as they fill."""
        if req_id not in self._reqs:
            keys = extend_block_keys([], self.namespace, prompt, self.block_size, salt)
            live = tokens if self.generated else None
            self._reqs[req_id] = _Request(keys, prompt_blocks=len(keys), tokens=live, salt=salt)

    def _key_upto(self, r: _Request, num_tokens: int) -> int:
        """Extend a generated-tracking request's keys over its first `num_tokens` tokens; the number
        of its blocks that may be keyed now."""
        if r.tokens is None:
            return len(r.keys)
        n = min(num_tokens, len(r.tokens))
        if n >= (len(r.keys) + 1) * self.block_size:
            extend_block_keys(r.keys, self.namespace, r.tokens[:n], self.block_size, r.salt)
        return len(r.keys)

    def num_tokens(self, req_id: str, prompt_len: int) -> int:
        """What `match` may load from: the prompt, or (generated) every token the request holds now."""
        r = self._reqs.get(req_id)
        return len(r.tokens) if r is not None and r.tokens is not None else prompt_len

    def untracked(self, req_id: str) -> None:
        """A request the connector must not cache (LoRA, multimodal, prompt embeddings)."""
        self._reqs[req_id] = _Request(keys=[])

    def match(self, req_id: str, num_tokens: int, num_computed_tokens: int, locate: Locate) -> int:
        """Tokens beyond `num_computed_tokens` (block-aligned) of the request's first `num_tokens`
        (`num_tokens()`) that the tiers can supply. The last token is always computed (its logits are
        needed)."""
        r = self._reqs[req_id]
        self._key_upto(r, num_tokens)
        loadable = min(len(r.keys), max(num_tokens - 1, 0) // self.block_size)
        start = num_computed_tokens // self.block_size
        tiers = []
        for key in r.keys[start:loadable]:
            tier = locate(key)
            if tier is None:
                break
            tiers.append(tier)
        if self.keep_last_block and tiers:
            tiers.pop()
        r.match_start, r.match_tiers = start, tiers
        return len(tiers) * self.block_size

    def matched_tiers(self, req_id: str, num_external_tokens: int) -> list[str]:
        r = self._reqs.get(req_id)
        return [] if r is None else r.match_tiers[: num_external_tokens // self.block_size]

    def after_alloc(self, req_id: str, block_ids: Sequence[int], num_external_tokens: int) -> None:
        if num_external_tokens <= 0 or req_id not in self._reqs:
            return
        r = self._reqs[req_id]
        n = num_external_tokens // self.block_size
        idx = range(r.match_start, r.match_start + n)
        self._pending_loads[req_id] = [(block_ids[i], r.keys[i]) for i in idx]

    def step(
        self,
        new: Sequence[tuple[str, Sequence[int], int]],
        cached: Sequence[tuple[str, Sequence[int] | None, bool, int]],
        num_scheduled: dict[str, int],
        locate: Locate,
    ) -> StepPlan:
        """One scheduler step. `new`: (req id, block ids, num computed) of newly scheduled requests;
        `cached`: (req id, new block ids or None, resumed, num computed) of running ones."""
        plan = StepPlan(loads=self._pending_loads)
        self._pending_loads = {}
        for req_id, block_ids, computed in new:
            r = self._reqs.get(req_id)
            if r is not None:
                r.block_ids, r.cursor = list(block_ids), computed // self.block_size
        for req_id, new_ids, resumed, computed in cached:
            r = self._reqs.get(req_id)
            if r is None:
                continue
            if resumed:
                r.block_ids, r.cursor = list(new_ids or []), computed // self.block_size
            elif new_ids:
                r.block_ids.extend(new_ids)
        computed_of = {rid: c for rid, _, c in new} | {rid: c for rid, _, _, c in cached}
        planned: set[str] = set()  # requests sharing a prefix in one step save it once
        for req_id, computed in computed_of.items():
            r = self._reqs.get(req_id)
            if r is None:
                continue
            # prompt blocks as this step fills them; generated ones once committed (below `computed`)
            prompt_full = min((computed + num_scheduled.get(req_id, 0)) // self.block_size, r.prompt_blocks)
            committed = min(self._key_upto(r, computed), computed // self.block_size) if r.tokens is not None else 0
            full = min(max(prompt_full, committed), len(r.block_ids))
            if r.cursor >= full:
                continue
            for i in range(r.cursor, full):
                if r.keys[i] not in planned and locate(r.keys[i]) is None:
                    planned.add(r.keys[i])
                    plan.saves.append((r.block_ids[i], r.keys[i]))
            r.cursor = max(r.cursor, full)
        return plan

    def finish(self, req_id: str) -> None:
        self._reqs.pop(req_id, None)
        self._pending_loads.pop(req_id, None)
