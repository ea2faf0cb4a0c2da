"""TokenSwift-style long generation (arXiv 2502.18890) in PyTorch: multi-token draft heads, n-gram reuse,
tree verification, a dynamic partial KV cache for drafting, and the contextual penalty.

One module per part; `engine.LongGenEngine` runs the loop and `plain.plain_decode` is the baseline it must
reproduce (token for token when greedy, in distribution when sampling). See docs/longgen.md.
"""
