"""The built-in toy reasoning teacher: task, traces, tokenizer, model, build and eval.

Everything here is deterministic given a seed, so the shipped model can be rebuilt bit-for-bit
in spirit (same data, same schedule) by `specexit toy build`.
"""
