"""The report's PNG plots (matplotlib's Agg canvas: no display, no pyplot state, deterministic).

Each function takes plain data and an output path, writes one PNG and returns the path. The data
come from :mod:`fedpriv.report.tables`; units are stated per function.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

DPI = 100
PRIVATE_COLORS = ["#000000", "#555555", "#2b4c7e", "#1f7a4d", "#7a5c1f"]  # dark: DP runs
PUBLIC_COLORS = ["#d62728", "#ff7f0e", "#e377c2", "#bcbd22", "#8c564b"]  # warm: non-private runs
SERIES_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` as PNG with fixed metadata (no date), so the same data give the same bytes."""
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=DPI, metadata={"Software": None})
    return path


def _log_axis(axis: Any) -> None:
    """Log-scale ticks at 1, 2 and 5 times powers of ten, labelled as plain numbers (no minor labels)."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _color(i: int, private: bool) -> str:
    palette = PRIVATE_COLORS if private else PUBLIC_COLORS
    return palette[i % len(palette)]


def plot_memorized_by_configuration(configurations: Sequence[str], runs: Sequence[str], counts: Sequence[Sequence[int]], path: str | os.PathLike[str]) -> Path:
    """Grouped bars: for each configuration (x), one bar per run of the number of RS-memorized
    canaries (y, a count). ``counts[i][j]`` is run i's count in configuration j."""
    return _save(memorized_by_configuration_figure(configurations, runs, counts), path)


def tick_label(configuration: str) -> str:
    """A configuration label on lines that fit under a bar group: p_u, its scaling, p_e."""
    return configuration.replace(" (", "\n(").replace(" p_e", "\np_e")


def memorized_by_configuration_figure(configurations: Sequence[str], runs: Sequence[str], counts: Sequence[Sequence[int]]) -> Figure:
    """The figure of :func:`plot_memorized_by_configuration`; the legend sits right of the axes,
    never over a bar."""
    legend_width = 0.3 + 0.075 * max((len(r) for r in runs), default=0)
    fig = _figure(max(6.0, 1.1 * len(configurations) + 2) + legend_width, 4.5)
    ax = fig.add_subplot()
    n = max(1, len(runs))
    width = 0.8 / n
    for i, (run, row) in enumerate(zip(runs, counts)):
        xs = [j - 0.4 + width * (i + 0.5) for j in range(len(configurations))]
        ax.bar(xs, row, width, label=run, color=SERIES_COLORS[i % len(SERIES_COLORS)])
    ax.set_xticks(range(len(configurations)), [tick_label(c) for c in configurations], fontsize=8)
    ax.set_ylabel("RS-memorized canaries")
    ax.set_xlabel("canary configuration")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title("Canaries memorized (Random Sampling) by configuration")
    if runs:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return fig


def plot_exposure_vs_insertions(series: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Per-canary exposure (bits, y) against its number of insertions in the training data + 1
    (x, log scale), one marker series per run; private runs (``private`` true) in dark colours and
    circles with solid lines, non-private runs in warm colours and crosses with dashed lines, the
    lines joining the mean exposure per insertion count (Hoory et al. 2021, Figure 2). A canary
    whose exposure is the ceiling of a sampled estimate (``ceiling``: it beat every sampled suffix)
    is ringed in grey, with one legend entry saying so.
    Each series: {run, private, epsilon, insertions: [int], exposure: [bits], ceiling: [bool] (optional)}."""
    fig = _figure(7.0, 4.5)
    ax = fig.add_subplot()
    counters = {True: 0, False: 0}
    for s in series:
        private = bool(s["private"])
        color = _color(counters[private], private)
        counters[private] += 1
        xs = [i + 1 for i in s["insertions"]]
        label = f"{s['run']} (ε = {s['epsilon']:.3g})" if private else f"{s['run']} (not private)"
        ax.scatter(xs, s["exposure"], marker="o" if private else "x", color=color, label=label, s=28, zorder=3)
        by_x: dict[int, list[float]] = {}
        for x, e in zip(xs, s["exposure"]):
            by_x.setdefault(x, []).append(e)
        line_x = sorted(by_x)
        ax.plot(line_x, [sum(by_x[x]) / len(by_x[x]) for x in line_x], color=color, linestyle="-" if private else "--", linewidth=1)
    ceiling = [(i + 1, e) for s in series for i, e, c in zip(s["insertions"], s["exposure"], s.get("ceiling") or [False] * len(s["exposure"])) if c]
    if ceiling:  # the estimate's largest value, not a measurement: ringed, and said in the legend
        ax.scatter([x for x, _ in ceiling], [e for _, e in ceiling], marker="o", s=120, facecolors="none", edgecolors="#888888", linewidths=1.2,
                   label="ringed: at the ceiling log2|R| (beat every sampled suffix; not a measurement)", zorder=2)
    ax.set_xscale("log")
    _log_axis(ax.xaxis)
    ax.set_xlabel("insertions of the canary + 1 (log scale)")
    ax.set_ylabel("exposure (bits)")
    ax.set_title("Canary exposure against insertions: dark = DP, warm = not private")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_epsilon_vs_parameters(curves: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """One row of panels per DP run (Hoory et al. 2021, Figure 1): epsilon (y; log scale when it
    spans more than a decade) against
    the noise multiplier, the epochs (central) or rounds (federated), and the batch size or users
    per round, each with the other parameters held at the run's; the run's own point starred.
    Each curve: {run, delta, accountant, epsilon, panels: [{label, x, epsilon, own, log_x}]}
    as :func:`fedpriv.report.tables.epsilon_curves` returns."""
    cols = max(len(c["panels"]) for c in curves)
    fig = _figure(4.2 * cols, 3.4 * len(curves))
    for i, c in enumerate(curves):
        for j, p in enumerate(c["panels"]):
            ax = fig.add_subplot(len(curves), cols, i * cols + j + 1)
            pts = [(x, e) for x, e in zip(p["x"], p["epsilon"]) if math.isfinite(e) and e > 0]
            ax.plot([x for x, _ in pts], [e for _, e in pts], color="#d62728", marker=".")
            ax.plot([p["own"]], [c["epsilon"]], marker="*", markersize=14, color="#000000", linestyle="none", label=f"{c['run']}: ε = {c['epsilon']:.3g}")
            if p.get("log_x"):
                ax.set_xscale("log")
                _log_axis(ax.xaxis)
            ys = [e for _, e in pts] + [c["epsilon"]]
            if max(ys) > 10 * min(ys):  # log y only when epsilon spans more than a decade
                ax.set_yscale("log")
                _log_axis(ax.yaxis)
            ax.set_xlabel(p["label"])
            ax.set_ylabel(f"ε at δ = {c['delta']:.3g}")
            ax.grid(True, which="major", alpha=0.3)
            if j == 0:
                ax.set_title(f"{c['run']} ({c['accountant'].upper()})", fontsize=10, loc="left")
                ax.legend(fontsize=8)
    return _save(fig, path)


UNIT_MARKERS = {"example-level DP": "o", "user-level DP": "s", "record-level DP inside each client": "^",
                "example-level DP of the encoder only (own training not private)": "D"}


def promise(point: Mapping[str, Any]) -> tuple[Any, Any, Any] | None:
    """What a point's epsilon promises: (unit, neighbouring relation, δ); None when not private.
    Two epsilons are one scale only when these agree."""
    if point["epsilon"] is None or point["epsilon"] <= 0:
        return None
    return (point.get("unit"), point.get("relation"), point.get("delta"))


def promise_text(key: tuple[Any, Any, Any]) -> str:
    """'user-level DP, replace-one, δ = 1e-05' (the parts a point records)."""
    unit, relation, delta = key
    return ", ".join(x for x in (unit, relation, None if delta is None else f"δ = {delta:.3g}") if x)


def utility_point_styles(points: Sequence[Mapping[str, Any]]) -> list[tuple[int, str, str | None]]:
    """(colour index, marker, legend label or None) per point of :func:`plot_utility_vs_epsilon`:
    a run group's seeds share a colour and one legend entry, which names the group and what its
    epsilon promises (unit, neighbouring relation, δ); the marker is the unit's (x: not private)."""
    groups = list(dict.fromkeys(p.get("group", p["run"]) for p in points))
    out, labelled = [], set()
    for p in points:
        group = p.get("group", p["run"])
        key = promise(p)
        unit = key[0] if key else None
        said = promise_text(key) if key else ""
        label = None if group in labelled else (f"{group} ({said})" if said else group)
        labelled.add(group)
        out.append((groups.index(group), UNIT_MARKERS.get(unit, "o") if key else "x", label))
    return out


def plot_utility_vs_epsilon(points: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Utility (y, %: held-out accuracy, or the points' ``metric``) against epsilon (x, log scale),
    one point per run, one panel per promise: each (unit, neighbouring relation, δ) of the private
    points gets its own panel and its own ε axis, labelled with that promise, so an ε per user at
    δ = 1e-3 and an ε per example at δ = 1e-5 (or a replace-one and an add-or-remove-one ε) never
    share a scale. Runs without epsilon are drawn in every panel at the right edge, past a dashed
    line, at the tick 'not private'. The runs of one ``group`` (its seeds) share a colour and one
    legend entry naming its promise; the marker says what the epsilon protects (``unit``: circle one
    example, square one user, triangle one record inside its client, x not private).
    Each point: {run, epsilon (None when not private), accuracy (a fraction), group, unit, relation, delta}."""
    return _save(utility_vs_epsilon_figure(points), path)


def epsilon_axis(ax: Any, lo: float, hi: float, edge: float, any_private: bool) -> None:
    """A log epsilon axis from ``lo`` to ``hi`` with a "not private" column at ``edge`` (right of
    every epsilon), a dashed line between them, and ticks only where epsilons are."""
    ax.set_xscale("log")
    ax.set_xlim(lo / 10 ** 0.5, edge * 10 ** 0.3)
    ax.axvline(hi * 10 ** (0.5 * math.log10(edge / hi)), color="#888888", linestyle="--", linewidth=1)
    ticks = [t for t in ax.get_xticks() if lo / 10 ** 0.5 <= t <= hi * 10 ** 0.25] if any_private else []
    ax.set_xticks([*ticks, edge], [f"{t:g}" for t in ticks] + ["not private"])
    ax.minorticks_off()


def utility_vs_epsilon_figure(points: Sequence[Mapping[str, Any]]) -> Figure:
    """The figure of :func:`plot_utility_vs_epsilon`: one axes per promise, the legend right of the last."""
    styles = utility_point_styles(points)
    n_groups = 1 + max((c for c, _, _ in styles), default=0)
    columns = 1 + n_groups // 30  # legend columns beside the axes
    keys = list(dict.fromkeys(k for k in map(promise, points) if k is not None)) or [None]
    width = 7.0 if len(keys) == 1 else 4.6 * len(keys)
    fig = _figure(width + 2.6 * columns, 4.5 + 0.06 * max(0, n_groups // columns - 30))
    axes = [fig.add_subplot(1, len(keys), 1)]
    axes += [fig.add_subplot(1, len(keys), i + 1, sharey=axes[0]) for i in range(1, len(keys))]
    for ax, key in zip(axes, keys):
        mine = [(p, st) for p, st in zip(points, styles) if promise(p) is None or promise(p) == key]
        eps = [p["epsilon"] for p, _ in mine if promise(p) is not None]
        lo, hi = (min(eps), max(eps)) if eps else (1.0, 1.0)
        edge = hi * 10 ** max(0.5, 0.25 * math.log10(hi / lo))  # "not private" column, right of every epsilon
        for p, (color, marker, label) in mine:
            private = promise(p) is not None
            ax.scatter([p["epsilon"] if private else edge], [100 * p["accuracy"]], marker=marker, s=40,
                       color=SERIES_COLORS[color % len(SERIES_COLORS)], label=label, zorder=3)
        epsilon_axis(ax, lo, hi, edge, bool(eps))
        said = (promise_text(key) or "unit, relation and δ not recorded") if key else ""
        ax.set_xlabel(f"ε ({said}; log scale)" if key else "ε (no private run)", **({"fontsize": 9} if len(keys) > 1 else {}))
    axes[0].set_ylabel(f"{points[0].get('metric', 'held-out accuracy') if points else 'held-out accuracy'} (%)")
    title = "Utility against privacy" + (": one panel per promise (unit, relation, δ), each ε on its own axis" if len(keys) > 1 else "")
    if len(keys) > 1:
        fig.suptitle(title)
    else:
        axes[0].set_title(title)
    handles, labels = [], []
    for ax in axes:  # each group's one labelled point, in group order
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    axes[-1].legend(handles, labels, fontsize=6 if n_groups > 12 else 7, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=columns)
    return fig


def plot_memorization_vs_utility(series: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Two panels, one line per run, a point per audited step along training: mean exposure (bits,
    left) and RS-memorized canaries (a count, right) against the validation utility (%, x), so
    runs can be compared at equal utility by eye. Each series: {run, utility (fractions),
    exposure, rs_memorized, label}."""
    fig = _figure(11.0, 4.5)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for k, s in enumerate(series):
        color = SERIES_COLORS[k % len(SERIES_COLORS)]
        x = [100 * u for u in s["utility"]]
        left.plot(x, s["exposure"], marker="o", color=color, label=s["run"])
        if all(v is not None for v in s["rs_memorized"]):
            right.plot(x, s["rs_memorized"], marker="o", color=color, label=s["run"])
    label = series[0]["label"] if series else "utility"
    for ax, ylabel in ((left, "mean exposure (bits)"), (right, "RS-memorized canaries")):
        ax.set_xlabel(f"validation {label} (%)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("Memorization against utility along training")
    return _save(fig, path)


def plot_empirical_vs_theoretical(points: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """The empirical epsilon lower bound (y) against the accountant's epsilon (x), both on log
    scales, one point per run, with the diagonal y = x: a point above it is a privacy bug. Runs
    without an accountant's epsilon (not private) are drawn at the right edge, past a dashed line;
    a bound of 0 sits on the bottom edge. Each point: {run, epsilon (None when not private),
    empirical, unit}."""
    fig = _figure(7.5, 4.8)
    ax = fig.add_subplot()
    eps = [p["epsilon"] for p in points if p["epsilon"] is not None and p["epsilon"] > 0]
    lo, hi = (min(eps), max(eps)) if eps else (1.0, 1.0)
    edge = hi * 10 ** max(0.5, 0.25 * math.log10(hi / lo))
    found = [p["empirical"] for p in points if p["empirical"] > 0]
    bottom = min([lo, *found]) / 10 ** 0.5
    top = max([hi, *found]) * 10 ** 0.5
    ax.plot([bottom, top], [bottom, top], color="#888888", linewidth=1, label="y = x (the guarantee)")
    for k, p in enumerate(points):
        private = p["epsilon"] is not None and p["epsilon"] > 0
        ax.scatter([p["epsilon"] if private else edge], [max(p["empirical"], bottom)], marker="o" if private else "x", s=40,
                   color=SERIES_COLORS[k % len(SERIES_COLORS)], label=f"{p['run']} (per {p['unit']})", zorder=3, clip_on=False)
    ax.set_yscale("log")
    epsilon_axis(ax, lo, hi, edge, bool(eps))
    ax.set_ylim(bottom, top)
    ax.set_xlabel("accountant's ε (upper bound; log scale)")
    ax.set_ylabel("empirical ε (95% lower bound; log scale)")
    ax.set_title("The attack against the guarantee")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)
