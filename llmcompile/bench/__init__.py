"""Measuring kernels: what the judge's profile stage and `llmcompile bench` share.

timing.py     CUDA events and graphs, cold-L2 input rotation, replays, settling the clocks
baselines.py  what a kernel is compared with: eager, torch.compile, QuACK, Liger, SDPA, flash-attn-4
grid.py       the benchmark grid: every op, shape and baseline in one process, beside the copy bandwidth
plots.py      PNG plots of a grid or an eval (matplotlib)
"""
