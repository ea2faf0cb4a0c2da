"""N-gram candidate reuse: continuations seen earlier in the sequence, as extra tree branches.

A table keyed on one token holds the 3-token continuations that followed it, with counts. The engine feeds it
only tokens older than the penalty window (`feed_until`): a continuation still inside the window would be
penalised by the contextual penalty and so is a poor candidate (TokenSwift's rule). `candidates(t)` returns
the most frequent continuations of t, most frequent (then most recent) first.
"""

from __future__ import annotations

from collections import defaultdict


class NgramTable:
    def __init__(self, n: int = 4):
        self.n = n  # key token + (n - 1) continuation tokens
        self.counts: dict[int, dict[tuple[int, ...], int]] = defaultdict(dict)
        self.fed = 0  # n-grams starting at seq[:fed - n + 1] are in the table

    def feed_until(self, seq: list[int], end: int) -> None:
        """Add every n-gram lying entirely inside seq[:end] not added yet."""
        start = max(self.fed - self.n + 1, 0)
        for i in range(start, end - self.n + 1):
            cont = tuple(seq[i + 1 : i + self.n])
            table = self.counts[seq[i]]
            table[cont] = table.pop(cont, 0) + 1  # re-insert: ties go to the most recent
        self.fed = max(self.fed, end)

    def candidates(self, token: int, k: int) -> list[tuple[int, ...]]:
        table = self.counts.get(token)
        if not table or k <= 0:
            return []
        order = list(table.items())
        order.reverse()  # most recent first, kept among equal counts by the stable sort
        order.sort(key=lambda kv: -kv[1])
        return [cont for cont, _ in order[:k]]
