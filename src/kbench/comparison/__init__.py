"""The comparison stage: leaderboards, verdict matrix, attacker budgets, leak patterns,
η² sensitivity, plots and the HTML report, built from the experiment's cell runs.

analysis (numbers) and tables (display) are pure; collect reads MLflow; plots and report
write files; stage ties them together as `run_compare`.
"""
