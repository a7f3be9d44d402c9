"""Tuned tables, one module per op family, apart from the kernels that read them. Kernels read them
at trace time (`T.NAME`), so a sweep may replace one for a variant
(`evals/scripts/sweep_knobs.py`, "table:tuning.MODULE.NAME")."""
