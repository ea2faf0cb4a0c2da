"""Benchmarks: every method in one run on the same engine build, reported as ratios."""
