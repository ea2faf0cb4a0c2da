"""The TokenSwift loop: draft (partial KV) -> candidate tree (heads + n-grams) -> verify (full KV) -> commit.

Per round, with `seq` the committed tokens and the full KV cache holding seq[:-1]:
1. draft forward: the last token seq[-1] through the target over the partial KV cache; the base LM head and
   the gamma heads on its pre-norm hidden state give gamma + 1 draft distributions (penalised like the target);
2. the candidate tree rooted at seq[-1]: top-k paths of those distributions + n-gram continuations (the n-gram
   table holds only tokens older than the penalty window);
3. verification forward: root + every node in one forward over the full KV with the tree attention mask; each
   row is penalised with its own window (seq + the node's path) -- the plain decoder's target exactly;
4. the walk (greedy or recursive rejection sampling) commits the accepted path plus one target token; the
   cache keeps the root's and the path's K, V; the partial cache appends them.
Greedy output equals `plain.plain_decode`'s token for token; sampled output follows its distribution.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specexit_core.longgen.heads import DraftHeads
from specexit_core.longgen.ngram import NgramTable
from specexit_core.longgen.partial_kv import PartialKV, PartialKVConfig
from specexit_core.longgen.penalty import PenaltyConfig, penalise, tree_presence, window_presence
from specexit_core.longgen.plain import NO_PENALTY, next_token_logits, pick
from specexit_core.longgen.target import Target
from specexit_core.longgen.tree import TreeConfig, build_tree
from specexit_core.longgen.verify import verify_tree_greedy, verify_tree_sampled
from specexit_core.typed_config import StrictModel


class LongGenConfig(StrictModel):
    tree: TreeConfig = TreeConfig()
    partial_kv: PartialKVConfig = PartialKVConfig()
    ngram: bool = True  # n-gram reuse on (the tree's ngram_top_k sets how many branches)


@dataclass
class LongGenStats:
    rounds: int = 0  # verification forwards (full KV), prefill excluded
    draft_forwards: int = 0  # draft forwards (partial KV)
    accepted: int = 0  # tree tokens accepted
    tree_nodes: int = 0  # candidate nodes verified (root excluded)
    max_depth: int = 0  # deepest path a round can accept (len(tree.widths))
    draft_kv_max: int = 0  # most positions per layer and KV head the drafter attended to
    selections: int = 0  # partial-KV (re)selections
    wall_s: float = 0.0
    cpu_s: float = 0.0  # this process's CPU time: steadier than wall time on shared CPUs

    @property
    def tokens_per_forward(self) -> float:
        """Committed tokens per verification forward (accepted + the target's own token)."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def acceptance(self) -> float:
        """Accepted tokens per drafted position (TokenSwift's: accepted / (gamma + 1) per round)."""
        return self.accepted / (self.rounds * self.max_depth) if self.rounds and self.max_depth else 0.0

    def to_json(self) -> dict:
        return {
            "rounds": self.rounds,
            "draft_forwards": self.draft_forwards,
            "accepted": self.accepted,
            "tree_nodes": self.tree_nodes,
            "tokens_per_forward": self.tokens_per_forward,
            "acceptance": self.acceptance,
            "draft_kv_max": self.draft_kv_max,
            "selections": self.selections,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
        }


@dataclass
class LongGenResult:
    token_ids: list[int]
    stats: LongGenStats = field(default_factory=LongGenStats)

    @property
    def wall_s(self) -> float:
        return self.stats.wall_s

    @property
    def cpu_s(self) -> float:
        return self.stats.cpu_s


class LongGenEngine:
    def __init__(self, model, heads: DraftHeads | None, cfg: LongGenConfig | None = None):
        self.target = Target(model)
        self.heads = heads
        self.cfg = cfg if cfg is not None else LongGenConfig()
        self.eos = model.config.eos_token_id

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        temperature: float = 0.0,
        seed: int = 0,
        penalty: PenaltyConfig = NO_PENALTY,
        stop_at_eos: bool = False,
    ) -> LongGenResult:
        tg, cfg = self.target, self.cfg
        gen = torch.Generator(device=tg.device).manual_seed(seed)  # sampling happens where the logits are
        stats = LongGenStats(max_depth=len(cfg.tree.widths))
        t0, c0 = time.perf_counter(), time.process_time()
        seq = list(prompt_ids)
        n_prompt = len(seq)
        cache = tg.new_cache(n_prompt + max_tokens + 64)
        h = tg.forward(seq, list(range(n_prompt)), cache)  # prefill
        cache.commit()
        seq.append(pick(next_token_logits(tg.logits(h[-1:])[0], seq, penalty), temperature, gen))
        partial = PartialKV(cfg.partial_kv, len(tg.layers))
        ngrams = NgramTable() if cfg.ngram else None
        lag = penalty.window if penalty.enabled else 0  # n-grams only from outside the penalty window
        while not self._finished(seq, n_prompt, max_tokens, stop_at_eos):
            draft = self._draft(seq, cache, partial, penalty, stats)
            if ngrams is not None:
                ngrams.feed_until(seq, len(seq) - lag)
            tree = build_tree(seq[-1], draft, cfg.tree, ngrams)
            root_pos = len(seq) - 1
            hv = tg.forward(tree.tokens, [root_pos + d for d in tree.depths], cache, tree_mask=tree.attention_mask())
            logits = tg.logits(hv)
            if penalty.enabled:
                paths = [tree.path_tokens(n) for n in range(len(tree))]
                logits = penalise(
                    logits, tree_presence(seq, paths, tg.vocab_size, penalty.window, tg.device), penalty.theta
                )
            if temperature > 0:
                path, nxt = verify_tree_sampled(tree, torch.softmax(logits / temperature, -1), gen)
            else:
                path, nxt = verify_tree_greedy(tree, logits)
            cache.commit(keep=[0, *path])
            partial.append_from(cache)
            seq.extend([tree.tokens[n] for n in path] + [nxt])
            stats.rounds += 1
            stats.accepted += len(path)
            stats.tree_nodes += len(tree) - 1
        out = seq[n_prompt:]
        if stop_at_eos and self.eos in out:
            out = out[: out.index(self.eos)]
        stats.selections = partial.selections
        stats.wall_s, stats.cpu_s = time.perf_counter() - t0, time.process_time() - c0
        return LongGenResult(out[:max_tokens], stats)

    def _finished(self, seq: list[int], n_prompt: int, max_tokens: int, stop_at_eos: bool) -> bool:
        return len(seq) - n_prompt >= max_tokens or (stop_at_eos and self.eos in seq[n_prompt:])

    def _draft(self, seq, cache, partial: PartialKV, penalty: PenaltyConfig, stats: LongGenStats) -> torch.Tensor:
        """[1 + gamma, V] draft logits for the gamma + 1 positions after seq (penalised with seq's window)."""
        tg = self.target
        hd = tg.forward([seq[-1]], [len(seq) - 1], cache, partial=partial)[-1:]
        rows = [tg.logits(hd)]
        if self.heads is not None:
            rows.append(self.heads(hd, tg.lm_head)[:, 0])
        draft = torch.cat(rows)
        stats.draft_forwards += 1
        stats.draft_kv_max = max(stats.draft_kv_max, partial.size)
        if penalty.enabled:
            draft = penalise(draft, window_presence(seq, tg.vocab_size, penalty.window, tg.device)[None], penalty.theta)
        return draft
