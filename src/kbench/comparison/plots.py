"""The comparison's figures (matplotlib, Agg backend) and the data series behind them.

Each figure is drawn from one data frame, and that frame is also written as CSV for
`dvc plots`, so the PNG and the DVC plot can never disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: the stage runs headless under DVC

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from kbench import io  # noqa: E402
from kbench.comparison.analysis import Comparison  # noqa: E402
from kbench.comparison.tables import leaderboard_order, shown_k_score  # noqa: E402
from kbench.names import BASELINE_METHOD, GOLD_METHOD  # noqa: E402
from kbench.observer.channels import ATTACKER_BUDGETS, CHANNELS  # noqa: E402

DPI = 110
#: Points of the selectivity scatter that carry their method's name: the baseline and the
#: retain-only reference, the two every other method is read against.
LABELLED_METHODS = (BASELINE_METHOD, GOLD_METHOD)


def _series(base_model: str, label: str, several_models: bool) -> str:
    return f"{base_model} · {label}" if several_models else label


def _several_models(comparison: Comparison) -> bool:
    return len({r.key.base_model for r in comparison.rows}) > 1


def cer_frame(comparison: Comparison) -> pd.DataFrame:
    """Baseline forget CER per channel and substrate, with the bootstrap interval."""
    several = _several_models(comparison)
    records = []
    for r in comparison.rows:
        if not r.key.is_baseline:
            continue
        for channel in CHANNELS:
            interval = r.forget.ci.cer[channel]
            records.append({
                "substrate": _series(r.key.base_model, r.key.substrate_label, several),
                "channel": channel,
                "cer": r.forget.cer[channel],
                "ci_low": None if interval is None else interval[0],
                "ci_high": None if interval is None else interval[1],
            })
    return pd.DataFrame(records, columns=["substrate", "channel", "cer", "ci_low", "ci_high"])


def selectivity_frame(comparison: Comparison) -> pd.DataFrame:
    """One point per (substrate, method) row, baselines included: forget OR(all) against
    retain OR(all) (docs/comparison.md, "Selectivity"); `label` names the `none` and `gold` points."""
    several = _several_models(comparison)
    records = [
        {
            "substrate": _series(r.key.base_model, r.key.substrate_label, several),
            "method": r.key.method,
            "or_forget": r.forget.or_all,
            "or_retain": r.retain.or_all,
            "verdict": r.verdict.verdict,
            "label": r.key.method if r.key.method in LABELLED_METHODS else "",
        }
        for r in sorted(comparison.rows, key=lambda r: r.key)
    ]
    return pd.DataFrame(records, columns=["substrate", "method", "or_forget", "or_retain", "verdict", "label"])


def budget_frame(comparison: Comparison) -> pd.DataFrame:
    """Baseline forget OR under each attacker budget, per substrate."""
    several = _several_models(comparison)
    records = [
        {"substrate": _series(r.key.base_model, r.key.substrate_label, several), "budget": b, "baseline_or": v}
        for r in comparison.rows
        if r.key.is_baseline
        for b, v in r.forget.attacker_budget.items()
    ]
    return pd.DataFrame(records, columns=["substrate", "budget", "baseline_or"])


def k_score_frame(comparison: Comparison) -> pd.DataFrame:
    """Leaderboard order per (base model, substrate); `shown` is what the leaderboard prints."""
    several = _several_models(comparison)
    records = [
        {
            "substrate": _series(r.key.base_model, r.key.substrate, several),
            "method": r.key.method_label,
            "k_score": r.verdict.k_score,
            "shown": shown_k_score(r),
        }
        for r in leaderboard_order(comparison.rows)
    ]
    frame = pd.DataFrame(records, columns=["substrate", "method", "k_score", "shown"])
    return frame.sort_values("substrate", kind="stable")


def _empty(ax: plt.Axes, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def cer_figure(frame: pd.DataFrame) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(9, 4.2))
    substrates = list(dict.fromkeys(frame["substrate"]))
    if not substrates:
        _empty(ax, "no baseline runs yet")
        return fig
    width = 0.8 / len(substrates)
    x = np.arange(len(CHANNELS))
    for i, substrate in enumerate(substrates):
        part = frame[frame["substrate"] == substrate].set_index("channel").reindex(CHANNELS)
        cer = part["cer"].astype(float).to_numpy()
        low = np.nan_to_num(cer - part["ci_low"].astype(float).to_numpy())
        high = np.nan_to_num(part["ci_high"].astype(float).to_numpy() - cer)
        ax.bar(x + (i - (len(substrates) - 1) / 2) * width, np.nan_to_num(cer), width,
               yerr=[low, high], capsize=2, label=substrate)
    ax.set_xticks(x, CHANNELS)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("baseline CER (forget)")
    ax.set_title("Per-channel leak rate of the baseline, by substrate (95% CI)")
    ax.legend(fontsize="small")
    return fig


#: Marker per method in the selectivity scatter, in method order (colours are substrates).
_MARKERS = ("o", "s", "^", "D", "v", "8", "X", "*", "<", ">", "h", "p")


def selectivity_figure(frame: pd.DataFrame) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    substrates = sorted(set(frame["substrate"]))
    methods = sorted(set(frame["method"]), key=lambda m: (m not in LABELLED_METHODS, m))
    colours = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(substrates)}
    markers = {m: _MARKERS[i % len(_MARKERS)] for i, m in enumerate(methods)}
    for row in frame.itertuples():
        ax.scatter(row.or_forget, row.or_retain, s=40, color=colours[row.substrate], marker=markers[row.method])
    # Labelled points at the same spot share one label instead of overprinting each other.
    for (x, y), same in frame[frame["label"] != ""].groupby(["or_forget", "or_retain"]):
        names = (f"{m} ({s})" for m, s in zip(same["label"], same["substrate"]))
        ax.annotate("\n".join(names), (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    if frame.empty:
        ax.text(0.5, 0.5, "no comparable rows yet", ha="center", transform=ax.transAxes, color="0.4")
    handles = [plt.Line2D([], [], color=colours[s], marker="o", linestyle="", label=s) for s in substrates]
    handles += [plt.Line2D([], [], color="0.3", marker=markers[m], linestyle="", label=m) for m in methods]
    if handles:
        ax.legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("OR(all) forget (lower: less leaked)")
    ax.set_ylabel("OR(all) retain (higher: retain knowledge kept)")
    ax.set_title("Selectivity: forget leak against retain leak, per (substrate, method)")
    fig.tight_layout()
    return fig


def budget_figure(frame: pd.DataFrame) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    budgets = list(ATTACKER_BUDGETS)
    for substrate, part in frame.groupby("substrate", sort=True):
        values = part.set_index("budget").reindex(budgets)["baseline_or"]
        ax.plot(budgets, values, marker="o", label=substrate)
    if frame.empty:
        _empty(ax, "no baseline runs yet")
        return fig
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("attacker budget (A1 answer only … A5 all six channels)")
    ax.set_ylabel("baseline OR (forget)")
    ax.set_title("What each attacker sees of the baseline's leak")
    ax.legend(fontsize="small")
    return fig


def k_score_figure(frame: pd.DataFrame) -> plt.Figure:
    groups = list(dict.fromkeys(frame["substrate"]))
    heights = [max(1, (frame["substrate"] == g).sum()) for g in groups] or [1]
    fig, axes = plt.subplots(
        len(heights), 1, figsize=(7, 1.2 + 0.35 * sum(heights) + 0.5 * len(heights)),
        gridspec_kw={"height_ratios": heights}, squeeze=False,
    )
    if not groups:
        _empty(axes[0, 0], "no comparable rows yet")
        return fig
    for ax, group in zip(axes[:, 0], groups):
        part = frame[frame["substrate"] == group].iloc[::-1]  # best at the top
        y = np.arange(len(part))
        scores = part["k_score"].astype(float).to_numpy()
        ax.barh(y, np.nan_to_num(scores), color="tab:blue")
        for yi, score, shown in zip(y, scores, part["shown"]):
            # An unscored row (TC, invalid baseline) gets its label, never a bar at 0.
            ax.text(0.01 if np.isnan(score) else score + 0.01, yi, shown, va="center", fontsize=8)
        ax.set_yticks(y, part["method"])
        ax.set_xlim(0, 1.1)
        ax.set_title(group, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("K-Score")
    fig.suptitle("K-Score leaderboards (per substrate, never averaged)")
    fig.tight_layout()
    return fig


def plot_specs(comparison: Comparison) -> dict[str, tuple[pd.DataFrame, Callable[[], plt.Figure]]]:
    """name -> (data, figure drawn from that data); written as plots/<name>.csv and .png."""
    cer, selectivity = cer_frame(comparison), selectivity_frame(comparison)
    budget, k_score = budget_frame(comparison), k_score_frame(comparison)
    return {
        "cer_by_substrate": (cer, lambda: cer_figure(cer)),
        "selectivity": (selectivity, lambda: selectivity_figure(selectivity)),
        "attacker_budget": (budget, lambda: budget_figure(budget)),
        "k_score": (k_score, lambda: k_score_figure(k_score)),
    }


def fe_pr_frame(memory: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """The memory lane's systems: forget efficacy and preservation (None: not scored, or FE of a system
    that stores nothing, which measures no forgetting: docs/memory.md, "Stores nothing")."""
    return pd.DataFrame([(system, None if row.get("stores_nothing") else row["FE"], row["PR"])
                         for system, row in memory.items()], columns=["system", "FE", "PR"])


def fe_pr_figure(frame: pd.DataFrame) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(6, 5))
    scored = frame.dropna(subset=["FE", "PR"])
    ax.scatter(scored["FE"].astype(float), scored["PR"].astype(float), color="tab:blue")
    for system, fe, pr in scored.itertuples(index=False):
        ax.annotate(system, (fe, pr), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("forget efficacy FE")
    ax.set_ylabel("preservation PR")
    ax.set_title("Memory systems: forgetting against keeping")
    fig.tight_layout()
    return fig


def tau_frame(sweeps: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """The τ sweeps of the execution-state lane: B7's and B5's mean recomputed tokens per τ."""
    return pd.DataFrame([(suite, p["tau"], p["b7_tokens"], p["b5_tokens"]) for suite, summary in sweeps.items()
                         for p in summary.get("tau", {}).get("points", [])],
                        columns=["suite", "tau", "B7", "B5"])


def tau_figure(frame: pd.DataFrame) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for suite, part in frame.groupby("suite", sort=True):
        ax.plot(part["tau"], part["B7"], marker="o", label=f"{suite}: B7 (selective replay)")
        ax.plot(part["tau"], part["B5"], marker="s", linestyle="--", label=f"{suite}: B5 (full reset)")
    ax.set_xlabel("τ (the turn z entered)")
    ax.set_ylabel("mean recomputed tokens")
    ax.set_title("Cost of forgetting against τ")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def lane_plot_specs(memory: Mapping[str, Mapping[str, Any]],
                    sweeps: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[pd.DataFrame, Callable[[], plt.Figure]]]:
    """The other lanes' figures, each where its lane has data: the FE-vs-PR scatter of the memory
    systems and the τ sweep of the execution-state lane."""
    specs: dict[str, tuple[pd.DataFrame, Callable[[], plt.Figure]]] = {}
    fe_pr, tau = fe_pr_frame(memory), tau_frame(sweeps)
    if not fe_pr.empty:
        specs["memory_fe_pr"] = (fe_pr, lambda: fe_pr_figure(fe_pr))
    if not tau.empty:
        specs["replay_tau_sweep"] = (tau, lambda: tau_figure(tau))
    return specs


def write_plots(comparison: Comparison, folder: Path,
                extra: Mapping[str, tuple[pd.DataFrame, Callable[[], plt.Figure]]] | None = None) -> dict[str, Path]:
    """Write plots/<name>.png and plots/<name>.csv for the comparison's figures and `extra`
    (`lane_plot_specs`); return the PNG paths by name."""
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, (frame, draw) in {**plot_specs(comparison), **(extra or {})}.items():
        io.write_text(folder / f"{name}.csv", frame.to_csv(index=False))
        fig = draw()
        try:
            # No timestamp in the PNG, so an unchanged comparison gives unchanged files.
            with io.atomic_open(folder / f"{name}.png", "wb") as handle:
                fig.savefig(handle, format="png", dpi=DPI, metadata={"Software": None})
        finally:
            plt.close(fig)
        written[name] = folder / f"{name}.png"
    return written
