"""Distinct-n, the diversity figure TokenSwift reports for long outputs (the demo and `specexit bench longgen`)."""

from __future__ import annotations


def distinct_n(tokens: list[int], n_max: int = 4) -> float:
    """Mean of Distinct-1..n_max (unique n-grams / n-grams), the diversity figure TokenSwift reports."""
    vals = []
    for n in range(1, n_max + 1):
        grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
        vals.append(len(set(grams)) / len(grams) if grams else 0.0)
    return sum(vals) / len(vals)
