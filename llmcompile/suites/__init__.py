"""Research evals: a suite of problems -> one agent run per problem -> metrics, tables, plots.

suite.py    the suite file (TOML): problems and budgets
runner.py   runs the agent on each problem (one worker per GPU), resumable
metrics.py  compile@k, correct@k, fast_p, % SOL, cost to the target, from the run directories
report.py   results.json, report.md, plots; compare two evals
"""
