"""The report's figures, read from their matplotlib objects (not pixels): panel titles from the sweep file or the
dataset and partition, one legend outside the axes, a colour per method family and a dashed line for drift
correction the same in every panel, at most six curves a panel, and the rounds-against-computation figure's
point labels, Pareto front and lines of equal predicted time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from stlsgd.costmodel import Network
from stlsgd.errors import ConfigError
from stlsgd.experiments.plots import (
    FAMILY_COLOURS,
    MAX_CURVES,
    Curve,
    Panel,
    Point,
    PointPanel,
    draw_panels,
    draw_points,
    family,
    pareto_front,
)
from stlsgd.experiments.sweeps import load_sweep
from stlsgd.experiments.time_report import compute_panels, default_title, sweep_title

REPO = Path(__file__).resolve().parents[2]

# The rows of Table 2+ (docs/results/schedules.md) after the paper's own: 16 curves with both.
ROWS = [
    ("SyncSGD", "sync_sgd"),
    ("LB-SGD", "lb_sgd"),
    ("CR-PSGD", "cr_psgd"),
    ("Local SGD", "local_sgd"),
    ("STL-SGD^sc", "stl_sc"),
    ("Local SGD + drift", "local_sgd"),
    ("STL-SGD^sc + drift", "stl_sc"),
    ("post-local SGD", "post_local"),
    ("LR-coupled STL", "lr_coupled"),
    ("QSR", "qsr"),
    ("AdaComm", "adacomm"),
    ("post-local SGD + drift", "post_local"),
    ("LR-coupled STL + drift", "lr_coupled"),
    ("QSR + drift", "qsr"),
    ("AdaComm + drift", "adacomm"),
    ("STL-SGD^sc auto (no grid)", "stl_sc"),
]

SWEEP = """
name = "fig_probe"
{title}
[base.data]
dataset = "a9a"
partition = "noniid"
[[methods]]
method = "sync_sgd"
grid = {{ lr = [0.1] }}
"""


def _curves(rows: list[tuple[str, str]], shift: float) -> list[Curve]:
    # Row i reaches gap 1e-4 at round 10 * (i + 1) * shift: a known first curve to the target.
    return [
        Curve(label, [1, 10 * (i + 1) * shift, 1000], [1.0, 1e-4, 1e-6], method)
        for i, (label, method) in enumerate(rows)
    ]


def _data_lines(ax) -> list:
    """The curves of a panel: lines with a label (marker overlays, target and star lines have none)."""
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


def _legend_outside(fig: Figure) -> None:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert len(fig.legends) == 1, "one legend for the whole figure"
    assert all(ax.get_legend() is None for ax in fig.axes)
    box = fig.legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent(renderer)), ax.get_title()


def test_titles_come_from_the_sweep_file_else_from_dataset_and_partition(tmp_path: Path) -> None:
    titled = tmp_path / "titled.toml"
    titled.write_text(SWEEP.format(title='title = "a9a (Non-IID), s = 50"'))
    assert load_sweep(titled).title == "a9a (Non-IID), s = 50"
    best = {"sweep": "fig_probe", "config": str(titled), "dataset": "a9a", "partition": "noniid"}
    assert sweep_title(best) == "a9a (Non-IID), s = 50"
    # A file that no longer names the sweep, or none at all: the default, never a file name.
    assert sweep_title({**best, "sweep": "other"}) == "a9a (Non-IID)"
    plain = tmp_path / "plain.toml"
    plain.write_text(SWEEP.format(title=""))
    assert load_sweep(plain).title is None
    assert sweep_title({**best, "config": str(plain)}) == "a9a (Non-IID)"
    assert default_title("mnist49", "shared") == "MNIST 4 vs 9 (IID)"
    assert default_title("a9a", "split") == "a9a (IID, fixed split)"
    assert default_title("mnist10", "noniid") == "MNIST (Non-IID)"
    bad = tmp_path / "bad.toml"
    bad.write_text(SWEEP.format(title='title = "two\\nlines"'))
    with pytest.raises(ConfigError, match="title"):
        load_sweep(bad)


@pytest.mark.parametrize(
    ("stored", "title"),
    [
        ("table2_data/table2_a9a_iid", "a9a (IID)"),
        ("table2_data/table2_a9a_iid_split", "a9a (IID, fixed split)"),
        ("table2_data/table2_mnist_noniid", "MNIST 4 vs 9 (Non-IID)"),
        ("table3_data/table3_cnn_mnist_iid.best.json", "MNIST (IID)"),
    ],
)
def test_stored_sweeps_without_a_title_read_well(stored: str, title: str) -> None:
    """docs/results' sweeps predate the title field: their panels are titled from dataset and partition."""
    path = REPO / "docs/results" / stored
    best = json.loads((path if path.suffix == ".json" else path / "best.json").read_text())
    assert "title" not in best
    assert sweep_title({**best, "config": "nowhere.toml"}) == title


def test_curve_figure_splits_rows_keeps_family_colours_and_drift_dashes() -> None:
    # Two columns with the rows in different orders and one row missing: colours must not follow the order.
    panels = [
        Panel("a9a (IID)", "objective gap f(x) - f*", _curves(ROWS, 1.0), target=1e-4),
        Panel("a9a (Non-IID)", "objective gap f(x) - f*", _curves(ROWS[::-1][1:], 2.0), target=1e-4),
    ]
    fig = draw_panels(panels, "communication rounds", log_x=True)
    columns = {"a9a (IID)": set(), "a9a (Non-IID)": set()}
    colour_of: dict[str, set[str]] = {}
    for ax in fig.axes:
        title = ax.get_title().splitlines()[0]
        assert title in columns
        lines = _data_lines(ax)
        assert 0 < len(lines) <= MAX_CURVES
        for line in lines:
            label = line.get_label()
            columns[title].add(label)
            assert line.get_linestyle() == ("--" if "+ drift" in label else "-"), label
            fam = family(dict(ROWS)[label], label)
            colour_of.setdefault(fam, set()).add(line.get_color())
    # Every row drawn once per column, across its rows of panels.
    assert columns["a9a (IID)"] == {label for label, _ in ROWS}
    assert columns["a9a (Non-IID)"] == {label for label, _ in ROWS[::-1][1:]}
    # One colour per family, the fixed one, different families different colours.
    assert {fam: colours.pop() for fam, colours in colour_of.items() if len(colours) == 1} == {
        fam: FAMILY_COLOURS[fam] for fam in colour_of
    }
    assert len(set(FAMILY_COLOURS.values())) == len(FAMILY_COLOURS)
    # 16 rows: the paper's 8 split by drift (6 + 2), the 8 beyond the paper likewise (4 + 4).
    groups = [ax.get_title().splitlines()[1] for ax in fig.axes[::2]]
    assert groups[0].startswith("the paper's methods")
    assert any(g.startswith("schedules beyond the paper") for g in groups)
    _legend_outside(fig)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert set(legend) == {label for label, _ in ROWS} | {"target"}
    # The first row to the target in each panel is named on it: row i reaches it at 10 (i + 1) rounds.
    first = fig.axes[0].texts[-1].get_text()
    assert first == "first to the target:\nSyncSGD"


def test_a_run_with_one_evaluated_point_is_drawn_as_a_marker() -> None:
    # A sweep's two-round run may have evaluated once (at its end): a line through one point is invisible.
    curves = [Curve("LR-coupled STL", [2], [5e-5], "lr_coupled"), Curve("QSR + drift", [3], [8e-5], "qsr")]
    fig = draw_panels([Panel("a9a (IID)", "gap", curves, target=1e-4)], "rounds", log_x=True)
    lone = {line.get_label(): line for line in _data_lines(fig.axes[0])}
    assert lone["LR-coupled STL"].get_marker() == "o" and lone["QSR + drift"].get_marker() == "o"
    assert lone["QSR + drift"].get_markerfacecolor() == "white"  # hollow: + drift, as on the computation figure
    assert lone["LR-coupled STL"].get_markerfacecolor() == lone["LR-coupled STL"].get_color()


def test_few_rows_share_one_row_of_panels() -> None:
    rows = ROWS[:5]
    fig = draw_panels([Panel("MNIST 4 vs 9 (IID)", "gap", _curves(rows, 1.0), target=1e-4)], "rounds", log_x=True)
    assert len(fig.axes) == 1 and fig.axes[0].get_title() == "MNIST 4 vs 9 (IID)"
    assert len(_data_lines(fig.axes[0])) == 5
    _legend_outside(fig)


def test_latency_figure_names_the_fastest_row_at_the_network_latency() -> None:
    lat = [1e-6, 1e-3, 1.0]
    # time = rounds * latency + fixed: at 1 ms, A (1000 rounds, 0.5 s) takes 1.5 s, B (10 rounds, 2 s) 2.01 s.
    curves = [
        Curve("Local SGD", lat, [1000 * a + 0.5 for a in lat], "local_sgd"),
        Curve("STL-SGD^sc", lat, [10 * a + 2.0 for a in lat], "stl_sc"),
    ]
    fig = draw_panels([Panel("a9a (IID)", "time (s)", curves)], "latency", log_x=True, vline=(1e-3, "datacenter"))
    assert fig.axes[0].texts[-1].get_text() == "fastest here:\nLocal SGD"
    fig = draw_panels([Panel("a9a (IID)", "time (s)", curves)], "latency", log_x=True, vline=(0.5, "cross-region"))
    assert fig.axes[0].texts[-1].get_text() == "fastest here:\nSTL-SGD^sc"


def test_a_row_not_reached_in_one_panel_keeps_its_row_faded_and_is_never_starred() -> None:
    # Six rows in both panels; in the second, STL-SGD^sc's curve is its closest run, which never reached the
    # target although it would be the first below it on the plot: it stays one row (no seventh legend entry,
    # no split into more panels), drawn faded, named in the corner, and the star goes to the first that reached.
    rows = ROWS[:6]
    reached = _curves(rows, 1.0)
    closest = [Curve(c.label, c.x, c.y, c.method, reached=c.label != "STL-SGD^sc") for c in _curves(rows, 1.0)]
    closest[4] = Curve("STL-SGD^sc", [1, 2, 1000], [1.0, 1e-5, 1e-6], "stl_sc", reached=False)
    fig = draw_panels(
        [Panel("a9a (IID)", "gap", reached, target=1e-4), Panel("a9a (Non-IID)", "gap", closest, target=1e-4)],
        "rounds",
        log_x=True,
    )
    assert len(fig.axes) == 2 and len(fig.legends[0].get_texts()) == 6 + 1  # six rows and the target
    faded = [line.get_label() for line in _data_lines(fig.axes[1]) if line.get_alpha() == 0.4]
    assert faded == ["STL-SGD^sc"]
    texts = [t.get_text() for t in fig.axes[1].texts]
    assert any("target not reached" in t and "STL-SGD^sc" in t for t in texts)
    assert "first to the target:\nSyncSGD" in texts
    _legend_outside(fig)


def test_a_report_warns_of_runs_it_cannot_draw(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from stlsgd.experiments.report import _panels, load_sweep_dir, warn_missing_runs

    archive = tmp_path / "table2_a9a_iid"
    archive.mkdir()
    for name in ("best.json", "results.jsonl"):
        (archive / name).write_bytes((REPO / "docs/results/table2_data/table2_a9a_iid" / name).read_bytes())
    with caplog.at_level("WARNING", logger="stlsgd"):
        sweeps = [load_sweep_dir(archive)]
        warn_missing_runs(sweeps)
        panel = _panels(sweeps, "round")[0]
    assert panel.curves == []
    assert len(caplog.records) == 6 and all("stlsgd replay" in r.getMessage() for r in caplog.records)


def test_a_report_says_when_its_curves_come_from_sparsely_evaluated_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from stlsgd.experiments.report import load_sweep_dir, sparse_note, sparse_runs, warn_sparse_runs

    archive = tmp_path / "table2_a9a_iid"
    archive.mkdir()
    for name in ("best.json", "results.jsonl"):
        (archive / name).write_bytes((REPO / "docs/results/table2_data/table2_a9a_iid" / name).read_bytes())
    sweeps = [load_sweep_dir(archive)]
    drawn = {label: info["run_dir"] for label, info in sweeps[0]["methods"].items() if info.get("run_dir")}
    for i, run_dir in enumerate(drawn.values()):  # the first run skipped two evaluations, the rest none
        (archive / run_dir).mkdir(parents=True)
        (archive / run_dir / "metrics.jsonl").write_text('{"round": 3, "gap": 9e-5}\n')
        evaluation = {"sparse": True, "skipped": 2 if i == 0 else 0}
        (archive / run_dir / "summary.json").write_text(json.dumps({"evaluation": evaluation}))
    first = next(iter(drawn))
    sparse = sparse_runs(sweeps)
    assert sparse == {archive: [first]}
    assert sparse_note(sweeps, sparse) == (
        "a9a (IID): runs evaluated only where they could reach the target (stlsgd replay draws every evaluation)"
    )
    with caplog.at_level("WARNING", logger="stlsgd"):
        warn_sparse_runs(sparse)
    [record] = caplog.records
    assert f"1 drawn run(s) evaluated only where they could reach the target ({first})" in record.getMessage()
    (archive / drawn[first] / "summary.json").write_text(json.dumps({"evaluation": {"sparse": True, "skipped": 0}}))
    assert sparse_runs(sweeps) == {} and sparse_note(sweeps, {}) == ""  # every evaluation made: nothing to say


POINTS = [
    # label, client-steps, rounds: the front is SyncSGD (1e5, 1e5), Local SGD (2e5, 100), STL (1e6, 10).
    Point("SyncSGD", 1e5, 1e5, "sync_sgd"),
    Point("Local SGD", 2e5, 100, "local_sgd"),
    Point("LB-SGD", 1.5e6, 2000, "lb_sgd"),
    Point("CR-PSGD", 1.8e6, 3500, "cr_psgd"),
    Point("STL-SGD^sc", 1e6, 10, "stl_sc"),
    Point("STL-SGD^sc + drift", 3e6, 12, "stl_sc"),
]


def test_pareto_front_by_hand() -> None:
    assert [p.label for p in pareto_front(POINTS)] == ["SyncSGD", "Local SGD", "STL-SGD^sc"]


def test_compute_figure_labels_points_and_draws_the_front() -> None:
    fig = draw_points([PointPanel("a9a (IID)", list(POINTS))])
    ax = fig.axes[0]
    assert ax.get_title() == "a9a (IID)"
    labels = {t.get_text() for t in ax.texts}
    assert labels == {p.label for p in POINTS}
    front = next(line for line in ax.get_lines() if line.get_label() == "front")
    assert list(front.get_xdata()) == [1e5, 2e5, 1e6] and list(front.get_ydata()) == [1e5, 100, 10]
    assert not [line for line in ax.get_lines() if line.get_linestyle() == "--"], "no network, no iso-time lines"
    # Drift rows are hollow; families keep their colour.
    stl_drift = next(line for line in ax.get_lines() if list(line.get_xdata()) == [3e6])
    assert stl_drift.get_markerfacecolor() == "white" and stl_drift.get_markeredgecolor() == FAMILY_COLOURS["STL-SGD"]
    # The labels do not overlap one another.
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b)
    _legend_outside(fig)


def test_compute_figure_with_a_network_draws_lines_of_equal_predicted_time() -> None:
    # A round costs 1 ms, a client-step 1 us: SyncSGD 100.1 s, Local SGD 0.3 s, STL 1.01 s -> Local SGD fastest.
    round_s, step_s = 1e-3, 1e-6
    points = [
        Point(p.label, p.client_steps, p.rounds, p.method, p.rounds * round_s + p.client_steps * step_s) for p in POINTS
    ]
    panel = PointPanel("a9a (IID)", points, round_s=round_s, step_s=step_s, network="datacenter")
    fig = draw_points([panel])
    ax = fig.axes[0]
    iso = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(iso) >= 2
    fastest = 100 * round_s + 2e5 * step_s
    times = sorted({round(x * step_s + r * round_s, 9) for line in iso for x, r in zip(*line.get_data())})
    assert times[0] == pytest.approx(fastest)
    # The fastest row's label is bold; the legend names the network.
    bold = [t.get_text() for t in ax.texts if t.get_fontweight() == "bold"]
    assert bold == ["Local SGD"]
    assert any("datacenter" in t.get_text() for t in fig.legends[0].get_texts())
    _legend_outside(fig)


def test_compute_panels_price_each_row_and_the_lines_by_hand() -> None:
    """A sweep's rows become points at their median usage; the lines' round cost is alpha + model bytes / beta
    (the drift row sends twice the bytes a round, so the model's bytes are the smallest bytes per round)."""

    def row(method: str, rounds: int, steps: int, per_round: int) -> dict:
        seed = {"status": "reached", "rounds_to_target": rounds, "client_steps": steps}
        return {"method": method, "seeds": {"0": {**seed, "bytes_per_client": rounds * per_round}}}

    best = {
        "sweep": "probe",
        "config": "nowhere.toml",
        "dataset": "mnist49",
        "partition": "noniid",
        "methods": {
            "Local SGD": row("local_sgd", 100, 40_000, 1000),
            "Local SGD + drift": row("local_sgd", 20, 50_000, 2000),
            "SyncSGD": row("sync_sgd", 5000, 5000, 1000),
            "LB-SGD": {"method": "lb_sgd", "seeds": {"0": {"status": "budget"}}},
        },
    }
    # alpha 1 ms, beta 1e6 B/s, c 1 us: a round of the model's 1000 bytes costs 1 ms + 1 ms.
    net = Network(1e-3, 1e6, 1e-6, "probe-net")
    (panel,) = compute_panels([best], net)
    assert panel.title == "MNIST 4 vs 9 (Non-IID)"
    assert panel.round_s == pytest.approx(2e-3) and panel.step_s == 1e-6
    times = {p.label: p.time_s for p in panel.points}
    assert times == pytest.approx(
        {
            "Local SGD": 100 * 2e-3 + 40_000e-6,  # 0.24 s
            "Local SGD + drift": 20 * 1e-3 + 20 * 2000 / 1e6 + 50_000e-6,  # 0.11 s
            "SyncSGD": 5000 * 2e-3 + 5000e-6,  # 10.005 s
        }
    )
    assert [p.time_text for p in panel.points] == ["240 ms", "110 ms", "10 s"]
    # Without a network: points only, no times, no lines.
    (bare,) = compute_panels([best])
    assert bare.round_s is None and all(p.time_s is None for p in bare.points) and len(bare.points) == 3


def test_a_panel_whose_axis_does_not_show_the_target_stars_the_reached_run_that_ends_first() -> None:
    # Table 3 stops at a training accuracy and draws the loss: each reached run stops at its target, so the one
    # that ends first got there first (Local SGD at round 28, before STL-SGD^nc-1 at 32), whatever its loss; a
    # closest run that never reached is not starred although it ends sooner.
    curves = [
        Curve("STL-SGD^nc-1", [4, 16, 32], [1.0, 0.2, 0.01], "stl_nc1"),
        Curve("Local SGD", [4, 16, 28], [1.0, 0.3, 0.05], "local_sgd"),
        Curve("SyncSGD", [4, 8, 12], [2.0, 1.5, 1.2], "sync_sgd", reached=False),
    ]
    fig = draw_panels([Panel("small CNN, MNIST (IID)", "training loss", curves)], "rounds", log_x=True)
    assert fig.axes[0].texts[-1].get_text() == "first to the target:\nLocal SGD"
    star = [line for line in fig.axes[0].get_lines() if line.get_marker() == "*"]
    assert len(star) == 1 and list(star[0].get_xdata()) == [28] and list(star[0].get_ydata()) == [0.05]
