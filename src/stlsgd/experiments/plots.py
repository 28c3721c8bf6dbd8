"""Figures of the paper's kind: one panel per table column, one curve per method, log-scale y.

Figure 1 (and Figure 2 for the nets) plots the objective gap f(x) - f* (training loss when f* is unknown)
against communication rounds; the appendix figures plot it against epochs (samples processed by all clients
divided by the training-set size n). Matplotlib runs headless (Agg).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.ticker import FuncFormatter  # noqa: E402


@dataclass
class Curve:
    label: str
    x: list[float]
    y: list[float]


@dataclass
class Panel:
    title: str
    ylabel: str
    curves: list[Curve] = field(default_factory=list)
    target: float | None = None


def panels_figure(panels: list[Panel], xlabel: str, path: Path, *, log_x: bool = False, markers: bool = False) -> Path:
    """Write one PNG with a row of panels; curves with no positive value are left out of a log axis.
    ``markers``: each curve drawn as points (one point per row of a table), not lines."""
    n = max(len(panels), 1)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False)
    # One colour per row label across the panels, so a method reads the same in every column.
    labels = list(dict.fromkeys(c.label for p in panels for c in p.curves))
    palette = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    colour = {label: palette(i % palette.N) for i, label in enumerate(labels)}
    for ax, panel in zip(axes[0], panels):
        for curve in panel.curves:
            points = [(x, y) for x, y in zip(curve.x, curve.y) if y is not None and math.isfinite(y) and y > 0]
            if log_x:
                points = [(x, y) for x, y in points if x > 0]
            if points:
                xs, ys = zip(*points)
                if markers:
                    ax.plot(xs, ys, label=curve.label, marker="o", linestyle="none", color=colour[curve.label])
                else:
                    ax.plot(xs, ys, label=curve.label, linewidth=1.3, color=colour[curve.label])
        if panel.target is not None:
            ax.axhline(panel.target, color="grey", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        _sparse_minor_labels(ax.yaxis)
        if log_x:
            ax.set_xscale("log")
            _sparse_minor_labels(ax.xaxis)
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, which="major", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no row reached the target", transform=ax.transAxes, ha="center", color="grey")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _sparse_minor_labels(axis) -> None:
    """On a log axis that spans less than a decade matplotlib labels every minor tick (2, 3, ... 9 x 10^k),
    and the labels overlap; keep those of 2 and 5 only, and none where the axis spans two decades or more (its
    major ticks are labelled enough)."""

    def label(value: float, _pos: int) -> str:
        low, high = sorted(axis.get_view_interval())
        if value <= 0 or low <= 0 or high / low >= 100:
            return ""
        exponent = math.floor(math.log10(value) + 1e-9)
        mantissa = round(value / 10**exponent)
        return rf"$\mathdefault{{{mantissa}\times10^{{{exponent}}}}}$" if mantissa in (2, 5) else ""

    axis.set_minor_formatter(FuncFormatter(label))
