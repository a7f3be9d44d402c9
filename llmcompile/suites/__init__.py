"""Research evals: a suite of problems -> one agent run per problem -> metrics, tables, plots.

suite.py    the suite file (TOML): problems and budgets
runner.py   runs the agent on each problem (two at once a GPU, in turn on it), resumable
ray_backend.py  the same on a Ray cluster: one task per problem, one GPU of the target's kind
metrics.py  compile@k, correct@k, fast_p, % SOL, cost to the target, from the run directories
report.py   results.json, report.md, plots; compare two evals
"""
