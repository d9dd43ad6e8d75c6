"""The one number formatter: how a rate, an interval or a p-value reads in every table.

`kbench score`, `kbench verdict` and the comparison report (HTML and Markdown) all format
their figures here, so the same number reads the same everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable

from kbench.observer.metrics import Interval

#: Shown where a number is undefined (a dropped channel, no leak to share, no baseline).
MISSING = "—"

def fmt_rate(value: float | None) -> str:
    return MISSING if value is None else f"{value:.3f}"


def fmt_signed(value: float | None) -> str:
    return MISSING if value is None else f"{value:+.3f}"


def fmt_interval(interval: Interval | None) -> str:
    return MISSING if interval is None else f"[{interval[0]:.2f}, {interval[1]:.2f}]"


def fmt_with_ci(value: float | None, interval: Interval | None) -> str:
    return fmt_rate(value) if interval is None else f"{fmt_rate(value)} {fmt_interval(interval)}"


def fmt_p(p: float) -> str:
    return f"{p:.2e}" if p < 1e-3 else f"{p:.3f}"


def fmt_number(value: object) -> str:
    """Any scalar of a JSON result: floats to 4 significant digits, the rest as is."""
    if value is None:
        return MISSING
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def fmt_runs(run_ids: Iterable[str]) -> str:
    return " ".join(run_ids) or MISSING


def fmt_flag(value: bool | None, yes: str = "yes", no: str = "no") -> str:
    return MISSING if value is None else (yes if value else no)
