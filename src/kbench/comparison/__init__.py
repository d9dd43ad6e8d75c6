"""The comparison stage: leaderboards, verdict matrix, attacker budgets, leak patterns,
η² sensitivity, plots and the HTML report, built from the experiment's cell runs.

analysis (numbers) and tables (display) are pure; collect reads MLflow; plots and report
write files; `kbench.stages.compare` ties them together as the `compare` stage.
"""

from kbench.comparison.analysis import CellRun, Comparison, RowKey, RowResult, compare
from kbench.comparison.collect import collect_cells
from kbench.comparison.tables import Table, leaderboards

__all__ = ["CellRun", "Comparison", "RowKey", "RowResult", "Table", "collect_cells", "compare", "leaderboards"]
