"""Figures of the paper's kind: one column of panels per table column, one curve per method, log-scale y.

Figure 1 (and Figure 2 for the nets) plots the objective gap f(x) - f* (training loss when f* is unknown)
against communication rounds; the appendix figures plot it against epochs (samples processed by all clients
divided by the training-set size n). Matplotlib runs headless (Agg).

What a reader needs from a figure at a glance, and how it is kept the same in every figure:

- a colour per method *family* (:data:`FAMILY_COLOURS`, a fixed mapping on the Okabe-Ito colour-blind-safe
  palette, so Local SGD is the same blue in every figure whatever else is drawn), a line style for drift
  correction (solid without, dashed with) and a marker for a family's variants (STL-SGD^sc and its tuned or
  auto rows);
- at most :data:`MAX_CURVES` curves a panel: where a figure has more rows they are split into rows of panels
  (the paper's methods, the schedules beyond the paper, then without / with drift correction);
- one legend for the whole figure, outside the axes, so it covers no curve;
- rounds against computation (:func:`points_figure`): each point labelled where it stands, the Pareto front
  (the fewest rounds for a given computation) drawn, and with a network the lines of equal predicted time
  (``rounds * (alpha + model bytes / beta) + client_steps * c``, docs/cost_model.md) and each row's time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

MAX_CURVES = 6
PAPER_GROUP = "the paper's methods"
BEYOND_GROUP = "schedules beyond the paper"

# Registry name -> family; the families of the paper (Shen et al., Table 2/3) come first.
FAMILY_OF_METHOD = {
    "sync_sgd": "SyncSGD",
    "lb_sgd": "LB-SGD",
    "cr_psgd": "CR-PSGD",
    "local_sgd": "Local SGD",
    "stl_sc": "STL-SGD",
    "stl_nc": "STL-SGD",
    "post_local": "post-local SGD",
    "lr_coupled": "LR-coupled STL",
    "qsr": "QSR",
    "adacomm": "AdaComm",
}
PAPER_FAMILIES = frozenset({"SyncSGD", "LB-SGD", "CR-PSGD", "Local SGD", "STL-SGD"})
# Okabe & Ito (2008) colour-blind-safe palette, plus grey and Tol's indigo for the ninth and tenth family; one
# red only (vermillion, STL-SGD). A fixed mapping, not the order of appearance.
FAMILY_COLOURS = {
    "SyncSGD": "#000000",
    "LB-SGD": "#999999",
    "CR-PSGD": "#56B4E9",
    "Local SGD": "#0072B2",
    "STL-SGD": "#D55E00",
    "post-local SGD": "#009E73",
    "LR-coupled STL": "#E69F00",
    "QSR": "#CC79A7",
    "AdaComm": "#332288",
    "other": "#44AA99",
}
DRIFT_STYLE = (0, (5, 2))  # dashed: "+ drift"
VARIANT_MARKERS = ("", "o", "^", "s", "D", "v", "P", "X")


@dataclass
class Curve:
    label: str
    x: list[float]
    y: Sequence[float | None]  # None: that evaluation lacks the metric (no point drawn)
    method: str = ""  # registry name (``local_sgd``); decides the colour
    reached: bool = True  # False: the row's closest run, which never reached the target (drawn faded)


@dataclass
class Panel:
    title: str
    ylabel: str
    curves: list[Curve] = field(default_factory=list)
    target: float | None = None


@dataclass
class Point:
    """One row of a sweep in the rounds-against-computation plane."""

    label: str
    client_steps: float
    rounds: float
    method: str = ""
    time_s: float | None = None  # predicted time to target on the figure's network
    time_text: str = ""


@dataclass
class PointPanel:
    title: str
    points: list[Point] = field(default_factory=list)
    # Lines of equal predicted time: seconds a round costs without drift correction (alpha + model bytes / beta)
    # and seconds a client-step costs (c); None draws no lines.
    round_s: float | None = None
    step_s: float | None = None
    network: str = ""


def family(method: str, label: str = "") -> str:
    """The method family a row belongs to: by its registry name, else by its label's first word."""
    if method in FAMILY_OF_METHOD:
        return FAMILY_OF_METHOD[method]
    low = label.lower()
    for name in sorted(FAMILY_COLOURS, key=len, reverse=True):
        if low.startswith(name.lower()):
            return name
    return "other"


def has_drift(label: str) -> bool:
    """Rows with drift correction are labelled '... + drift' in every sweep file."""
    return "drift" in label.lower()


@dataclass(frozen=True)
class Style:
    color: str
    linestyle: Any
    marker: str


def styles(rows: list[tuple[str, str]]) -> dict[str, Style]:
    """Label -> colour (by family), line style (by drift) and marker (by variant within a family, in the order
    of the labels, so rows differing only in drift share a marker)."""
    variants: dict[str, list[str]] = {}
    out = {}
    for label, method in rows:
        fam = family(method, label)
        base = label.replace("+ drift", "").strip()
        seen = variants.setdefault(fam, [])
        if base not in seen:
            seen.append(base)
        marker = VARIANT_MARKERS[seen.index(base) % len(VARIANT_MARKERS)]
        out[label] = Style(FAMILY_COLOURS[fam], DRIFT_STYLE if has_drift(label) else "solid", marker)
    return out


def curve_groups(rows: list[tuple[str, str]], limit: int = MAX_CURVES) -> list[tuple[str, list[str]]]:
    """Split a figure's rows into groups of at most ``limit``: all together when they fit, else the paper's
    methods and the schedules beyond the paper, each then split into without / with drift correction, and in
    pieces if still too many."""
    labels = [label for label, _ in rows]
    if len(labels) <= limit:
        return [("", labels)]
    method = dict(rows)
    paper = [lab for lab in labels if family(method[lab], lab) in PAPER_FAMILIES]
    beyond = [lab for lab in labels if lab not in paper]
    out: list[tuple[str, list[str]]] = []
    for name, group in ((PAPER_GROUP, paper), (BEYOND_GROUP, beyond)):
        if len(group) <= limit:
            parts = [(name, group)]
        else:
            parts = [
                (f"{name}, no drift correction", [lab for lab in group if not has_drift(lab)]),
                (f"{name}, + drift correction", [lab for lab in group if has_drift(lab)]),
            ]
        for part, members in parts:
            pieces = [members[i : i + limit] for i in range(0, len(members), limit)]
            for i, piece in enumerate(pieces):
                out.append((part + (f" ({i + 1}/{len(pieces)})" if len(pieces) > 1 else ""), piece))
    return [(name, members) for name, members in out if members]


def _figure(nrows: int, ncols: int, width: float = 3.9, height: float = 3.1) -> tuple[Figure, list[list[Axes]]]:
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(width * ncols + 2.6, height * nrows + 0.3),
        squeeze=False,
        layout="constrained",
        sharex="col",
        sharey="col",
    )
    return fig, [list(row) for row in axes]


def draw_panels(
    panels: list[Panel],
    xlabel: str,
    *,
    log_x: bool = False,
    vline: tuple[float, str] | None = None,
    note: str = "",
) -> Figure:
    """One column per panel (sweep), one row per group of curves (:func:`curve_groups`), one legend.

    Curves with no positive value are left out of a log axis. ``vline``: an x value marked on every panel
    (the network's latency on the latency figure), with its legend text; ``note``: a line above the panels."""
    rows = list({c.label: c.method for p in panels for c in p.curves}.items())
    look = styles(rows)
    groups = curve_groups(rows) or [("", [])]
    fig, axes = _figure(len(groups), max(len(panels), 1))
    for col, panel in enumerate(panels):
        by_label = {c.label: c for c in panel.curves}
        for row, (group, labels) in enumerate(groups):
            ax = axes[row][col]
            drawn = 0
            unreached = []
            for label in labels:
                curve = by_label.get(label)
                points = [] if curve is None else _positive(curve.x, curve.y, log_x)
                if curve is None or not points:
                    continue
                xs, ys = zip(*points)
                s = look[label]
                # A row that never reached the target keeps its colour and style (one legend entry per row in
                # every panel), faded, and is named in the panel's corner.
                alpha = 1.0 if curve.reached else 0.4
                # A sweep run evaluates only where it could end (sparse evaluation): a two-round run may have one
                # point, which a line alone would not show.
                lone = len(xs) == 1
                ax.plot(
                    xs,
                    ys,
                    label=label,
                    linewidth=1.6,
                    color=s.color,
                    linestyle=s.linestyle,
                    alpha=alpha,
                    marker=(s.marker or "o") if lone else None,
                    markersize=6,
                    markerfacecolor="white" if lone and has_drift(label) else None,
                )
                if s.marker and not lone:
                    ax.plot(
                        xs,
                        ys,
                        linestyle="none",
                        marker=s.marker,
                        markevery=0.12,
                        markersize=4,
                        color=s.color,
                        alpha=alpha,
                    )
                if not curve.reached:
                    unreached.append(label)
                drawn += 1
            if unreached:
                ax.text(
                    0.02,
                    0.02,
                    "faded, target not reached\n(closest run): " + ", ".join(unreached),
                    transform=ax.transAxes,
                    fontsize=7,
                    color="dimgrey",
                    va="bottom",
                    wrap=True,
                )
            if panel.target is not None:
                ax.axhline(panel.target, color="grey", linestyle=":", linewidth=1)
            if vline is not None:
                ax.axvline(vline[0], color="grey", linestyle="-.", linewidth=1)
            ax.set_yscale("log")
            _sparse_minor_labels(ax.yaxis)
            if log_x:
                ax.set_xscale("log")
                _sparse_minor_labels(ax.xaxis)
            ax.set_title(panel.title + (f"\n{group}" if group else ""), fontsize=9)
            if row == len(groups) - 1:
                ax.set_xlabel(xlabel)
            ax.set_ylabel(panel.ylabel)
            ax.grid(True, which="major", alpha=0.3)
            if not drawn:
                text = "none of these rows has metrics" if panel.curves else "no run metrics in the sweep directory"
                ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", color="grey")
            else:
                reached = [by_label[lab] for lab in labels if lab in by_label and by_label[lab].reached]
                _mark_best(ax, reached, panel.target, vline, log_x)
    handles: list[Any] = []
    for _, labels in groups:
        for label in labels:
            s = look[label]
            handles.append(
                Line2D([], [], color=s.color, linestyle=s.linestyle, marker=s.marker or None, label=label, lw=1.6)
            )
    if any(p.target is not None for p in panels):
        handles.append(Line2D([], [], color="grey", linestyle=":", label="target"))
    if vline is not None:
        handles.append(Line2D([], [], color="grey", linestyle="-.", label=vline[1]))
    if handles:
        fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
    if note:
        fig.suptitle(note, fontsize=9)
    return fig


def panels_figure(
    panels: list[Panel],
    xlabel: str,
    path: Path,
    *,
    log_x: bool = False,
    vline: tuple[float, str] | None = None,
    note: str = "",
) -> Path:
    """Write :func:`draw_panels` as a PNG."""
    return save(draw_panels(panels, xlabel, log_x=log_x, vline=vline, note=note), path)


def save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _positive(xs: list[float], ys: Sequence[float | None], log_x: bool) -> list[tuple[float, float]]:
    points = [(x, y) for x, y in zip(xs, ys) if y is not None and math.isfinite(y) and y > 0]
    return [(x, y) for x, y in points if x > 0] if log_x else points


def _mark_best(
    ax: Axes, curves: list[Curve], target: float | None, vline: tuple[float, str] | None, log_x: bool
) -> None:
    """Name the panel's best curve where a reader looks for it: with ``vline`` the lowest curve at that x
    (the fastest row at the network's latency), else with a ``target`` the first curve to reach it, else (a
    target the y axis does not show, such as an accuracy under a loss axis) the reached curve that ends first:
    a run stops at its target."""
    best: tuple[float, float, str] | None = None  # (key, y, label) where key is what is minimised
    for c in curves:
        points = sorted(_positive(c.x, c.y, log_x))
        if vline is not None:
            y = _interpolate(points, vline[0], log_x)
            if y is not None and (best is None or y < best[0]):
                best = (y, y, c.label)
        else:
            if target is not None:
                hit = next(((x, y) for x, y in points if y <= target), None)
            else:
                hit = points[-1] if points else None
            if hit is not None and (best is None or hit[0] < best[0]):
                best = (hit[0], hit[1], c.label)
    if best is None:
        return
    x = vline[0] if vline is not None else best[0]
    what = "fastest here" if vline is not None else "first to the target"
    ax.plot([x], [best[1]], marker="*", markersize=13, color="gold", markeredgecolor="black", zorder=5)
    x0, x1 = ax.get_xlim()  # after autoscaling: the name goes on the side of the star with more room
    scale = math.log if log_x else float
    right = (scale(x) - scale(x0)) / ((scale(x1) - scale(x0)) or 1.0) < 0.55
    y0, y1 = ax.get_ylim()
    low = math.log(best[1] / y0) / (math.log(y1 / y0) or 1.0) < 0.3  # near the bottom: the name goes above
    ax.annotate(
        f"{what}:\n{best[2]}",
        (x, best[1]),
        xytext=(8 if right else -8, 6 if low else -6),
        textcoords="offset points",
        fontsize=7,
        fontweight="bold",
        ha="left" if right else "right",
        va="bottom" if low else "top",
        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.8},
        zorder=5,
    ).set_in_layout(False)


def _interpolate(points: list[tuple[float, float]], x: float, log_x: bool) -> float | None:
    """y at ``x`` on a curve given by sorted points (log-linear in y; log in x on a log axis), None outside."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            if x1 == x0:
                return y0
            u = (math.log(x / x0) / math.log(x1 / x0)) if log_x else (x - x0) / (x1 - x0)
            return math.exp(math.log(y0) + u * (math.log(y1) - math.log(y0)))
    return None


def pareto_front(points: list[Point]) -> list[Point]:
    """The points no other point beats in both client-steps and rounds (fewer or equal in both, fewer in one),
    by client-steps: the best trade-off between rounds and computation."""
    front: list[Point] = []
    for p in sorted(points, key=lambda p: (p.client_steps, p.rounds)):
        if not front or p.rounds < front[-1].rounds:
            front.append(p)
    return front


def draw_points(panels: list[PointPanel]) -> Figure:
    """Rounds to target against client-steps to target (log-log), one panel per sweep: points labelled in
    place, the Pareto front, and where the panel has a network the lines of equal predicted time."""
    look = styles(list({p.label: p.method for panel in panels for p in panel.points}.items()))
    fig, axes = _figure(1, max(len(panels), 1), width=4.8, height=4.2)
    for ax in axes[0]:
        ax.set_xscale("log")
        ax.set_yscale("log")
    any_iso = False
    for ax, panel in zip(axes[0], panels):
        points = [p for p in panel.points if p.client_steps > 0 and p.rounds > 0]
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("client-steps to target (samples per client)")
        ax.set_ylabel("rounds to target")
        ax.grid(True, which="major", alpha=0.3)
        _sparse_minor_labels(ax.xaxis)
        _sparse_minor_labels(ax.yaxis)
        if not points:
            ax.text(0.5, 0.5, "no row reached the target", transform=ax.transAxes, ha="center", color="grey")
            continue
        xs = [p.client_steps for p in points]
        ys = [p.rounds for p in points]
        ax.set_xlim(min(xs) / 3, max(xs) * 3)
        ax.set_ylim(min(ys) / 3, max(ys) * 3)
        front = pareto_front(points)
        fx = [p.client_steps for p in front]
        fy = [p.rounds for p in front]
        # The front as a staircase: below and left of it no row reached the target.
        ax.plot(fx, fy, drawstyle="steps-post", color="#BBBBBB", linewidth=5, alpha=0.6, zorder=1, label="front")
        timed = [p for p in points if p.time_s is not None]
        fastest = min(timed, key=lambda p: p.time_s or 0.0) if timed else None
        if panel.round_s and panel.step_s and fastest is not None and fastest.time_s:
            any_iso = True
            slowest = max(p.time_s or 0 for p in timed)
            _iso_time_lines(ax, panel.round_s, panel.step_s, fastest.time_s, slowest, points)
        for p in points:
            s = look[p.label]
            drift = has_drift(p.label)
            ax.plot(
                [p.client_steps],
                [p.rounds],
                linestyle="none",
                marker=s.marker or "o",
                markersize=11 if p is fastest else 7,
                markerfacecolor="white" if drift else s.color,
                markeredgecolor=s.color,
                markeredgewidth=1.8,
                zorder=3,
            )
        _label_points(fig, ax, points, fastest)
    handles: list[Any] = [
        Line2D(
            [], [], color="#BBBBBB", linewidth=5, alpha=0.6, label="Pareto front (fewest rounds\nfor the computation)"
        ),
        Line2D([], [], linestyle="none", marker="o", color="grey", label="filled: no drift correction"),
        Line2D([], [], linestyle="none", marker="o", color="grey", markerfacecolor="white", label="hollow: + drift"),
    ]
    if any_iso:
        network = next(p.network for p in panels if p.round_s)
        handles.append(
            Line2D([], [], color="grey", linestyle="--", lw=0.8, label=f"equal predicted time\non {network}")
        )
        handles.append(Line2D([], [], linestyle="none", marker="o", markersize=11, color="grey", label="fastest"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
    return fig


def points_figure(panels: list[PointPanel], path: Path) -> Path:
    """Write :func:`draw_points` as a PNG."""
    return save(draw_points(panels), path)


def _nice_times(low: float, high: float) -> list[float]:
    """1-2-5 steps strictly between ``low`` and ``high`` (seconds)."""
    out = []
    for e in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
        for m in (1, 2, 5):
            t = m * 10.0**e
            if low * 1.5 < t < high:  # not too near the fastest row's own line
                out.append(t)
    while len(out) > 5:  # keep the picture readable: every other line
        out = out[::2]
    return out


def _iso_time_lines(
    ax: Axes, round_s: float, step_s: float, fastest_s: float, slowest_s: float, points: list[Point]
) -> None:
    """Lines rounds * round_s + client_steps * step_s = T: the fastest row's T, and round times up to the
    slowest row's. A point below and left of a line is faster than the line's T."""
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    to_frac = ax.transData + ax.transAxes.inverted()  # axes fractions do not move when the layout does
    marks = [to_frac.transform((p.client_steps, p.rounds)) for p in points]
    xs = [x0 * (x1 / x0) ** (i / 200) for i in range(201)]
    rs = [y0 / 2 * (2 * y1 / (y0 / 2)) ** (i / 200) for i in range(201)]
    for t in [fastest_s, *_nice_times(fastest_s, slowest_s * 1.05)]:
        # Sampled along both axes: where computation dominates the line is near vertical on a log plot.
        line = [(x, (t - x * step_s) / round_s) for x in xs] + [((t - r * round_s) / step_s, r) for r in rs]
        line = sorted((x, r) for x, r in line if r > y0 / 2 and x > 0)
        if len(line) < 2:
            continue
        bold = t == fastest_s
        ax.plot(
            *zip(*line),
            color="#555555" if bold else "#999999",
            linestyle="--",
            linewidth=1.1 if bold else 0.8,
            zorder=2,
        )
        # The label on the line inside the axes, away from the points, towards the line's right end.
        inside = [(x, r, *to_frac.transform((x, r))) for x, r in line]
        visible = [(x, r, fx, fy) for x, r, fx, fy in inside if 0.08 < fx < 0.97 and 0.03 < fy < 0.93]
        if visible:
            room = [
                min(min((math.hypot(fx - mx, fy - my) for mx, my in marks), default=1.0), 0.08)
                + 0.01 * i / len(visible)
                for i, (_, _, fx, fy) in enumerate(visible)
            ]
            x, r, _, _ = visible[room.index(max(room))]
            ax.annotate(
                duration(t),
                (x, r),
                fontsize=7,
                color="#555555",
                ha="right",
                va="bottom",
                xytext=(0, 2),
                textcoords="offset points",
                annotation_clip=True,
            ).set_in_layout(False)


# Candidate places of a point's label around it: (dx, dy) in points, horizontal and vertical alignment.
_PLACES = [
    (8, 4, "left", "bottom"),
    (8, -4, "left", "top"),
    (-8, 4, "right", "bottom"),
    (-8, -4, "right", "top"),
    (0, 9, "center", "bottom"),
    (0, -9, "center", "top"),
    (12, 0, "left", "center"),
    (-12, 0, "right", "center"),
    (16, 16, "left", "bottom"),
    (16, -16, "left", "top"),
    (-16, 16, "right", "bottom"),
    (-16, -16, "right", "top"),
    (0, 24, "center", "bottom"),
    (0, -24, "center", "top"),
    (30, 8, "left", "bottom"),
    (-30, 8, "right", "bottom"),
    (30, -8, "left", "top"),
    (-30, -8, "right", "top"),
]


def _label_points(fig: Figure, ax: Axes, points: list[Point], fastest: Point | None) -> None:
    """Label every point beside it, in the first candidate place that overlaps no other label or point and
    stays inside the axes (the least overlapping place when none is free); far places get a leader line."""
    fig.canvas.draw()  # lay the figure out, so display positions are final enough to test overlaps
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    frame = ax.get_window_extent(renderer)
    marks = []
    for p in points:
        cx, cy = ax.transData.transform((p.client_steps, p.rounds))
        marks.append(Bbox.from_extents(cx - 6, cy - 6, cx + 6, cy + 6))
    placed = [t.get_window_extent(renderer) for t in ax.texts]  # e.g. the iso-time lines' labels
    for p in sorted(points, key=lambda p: (p.rounds, p.client_steps)):  # a stable order
        text = p.label + (f"\n{p.time_text}" if p.time_text else "")
        weight = "bold" if p is fastest else "normal"
        best: tuple[float, tuple[int, int, str, str], Bbox] | None = None
        for place in _PLACES:
            dx, dy, ha, va = place
            probe = ax.annotate(
                text,
                (p.client_steps, p.rounds),
                xytext=(dx, dy),
                textcoords="offset points",
                ha=ha,
                va=va,
                fontsize=7,
                fontweight=weight,
            )
            box = probe.get_window_extent(renderer).padded(2)  # a little air between labels
            probe.remove()
            cost = sum(_overlap(box, other) for other in placed + marks)
            cost += 4 * (box.width * box.height - _overlap(box, frame))  # outside the axes: worse
            if best is None or cost < best[0]:
                best = (cost, place, box)
            if cost == 0:
                break
        assert best is not None
        (dx, dy, ha, va), box = best[1], best[2]
        far = abs(dx) + abs(dy) > 20
        ax.annotate(
            text,
            (p.client_steps, p.rounds),
            xytext=(dx, dy),
            textcoords="offset points",
            ha=ha,
            va=va,
            fontsize=7,
            fontweight=weight,
            zorder=4,
            arrowprops={"arrowstyle": "-", "color": "grey", "lw": 0.6, "shrinkA": 0, "shrinkB": 4} if far else None,
        ).set_in_layout(False)
        placed.append(box)


def duration(s: float) -> str:
    """Seconds as '164 ms', '2.93 s', '446 ns' (three significant figures)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s:.3g} s"


def _overlap(a: Bbox, b: Bbox) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _sparse_minor_labels(axis: Any) -> None:
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
