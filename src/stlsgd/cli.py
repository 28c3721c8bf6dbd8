"""Command line: ``stlsgd run | demo | sweep | replay | report | suggest | calibrate | methods | data``.

User mistakes (bad config, bad data, missing files, a full or read-only disk) print one line
``stlsgd: error: ...`` and exit with status 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stlsgd.errors import StlsgdError


def _cmd_run(args: argparse.Namespace) -> int:
    from stlsgd.experiments.config import load_config
    from stlsgd.experiments.runner import run_experiment

    exp = load_config(args.config, args.set)
    out = Path(args.out) if args.out else Path("runs") / exp.name
    delay = 0.0
    if args.inject_latency:
        from stlsgd.costmodel import parse_seconds

        delay = parse_seconds(args.inject_latency, "--inject-latency")
    if args.tensorboard:
        _check_folder(Path(args.tensorboard), "--tensorboard")
    summary = run_experiment(
        exp,
        out,
        backend=args.backend,
        comm_backend=args.comm_backend,
        data_dir=args.data_dir,
        overwrite=args.overwrite,
        progress=not args.quiet,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        inject_latency_s=delay,
        tensorboard=Path(args.tensorboard) if args.tensorboard else None,
    )
    if summary is None:  # ranks other than 0 of a distributed run write and print nothing
        return 0
    status = summary["status"]
    if status == "reached":
        print(
            f"{summary['name']}: reached the target in {summary['rounds_to_target']} rounds "
            f"({summary['iterations_to_target']} iterations, {summary['wall_s']:.1f} s)"
        )
    else:
        print(
            f"{summary['name']}: {status} after {summary['rounds']} rounds "
            f"({summary['iterations']} iterations, {summary['wall_s']:.1f} s)"
        )
        note = auto_missed(summary)
        if note:
            print(note)
    print(f"results in {out}/ (config.yaml, metrics.jsonl, summary.json)")
    return 0


def auto_missed(summary: dict[str, Any]) -> str | None:
    """The line a run of ``algorithm.auto`` adds when it ended at its budget, after at least the rounds the clients'
    models gave its plan, without reaching (None otherwise): there the quadratic models at x* did not describe the data
    (200 CIFAR-10 images: 85 rounds in the model, the budget after 123 at every seed; docs/results/schedules.md, *Four
    more sets*). A run that ``run.max_rounds`` ended before those rounds says nothing of the model."""
    rounds = summary.get("auto_model_rounds")
    if summary["status"] != "budget" or rounds is None or summary["rounds"] < rounds:
        return None
    gap = (summary.get("final") or {}).get("gap")
    at = "" if gap is None else f" at a gap of {gap:.3g}"
    return (
        f"algorithm.auto: the clients' models at x* gave this plan {rounds} rounds, and the run ended at its budget"
        f"{at}: they do not describe this data; a grid (stlsgd sweep) is the way to tune it "
        "(docs/results/schedules.md, *Every held-out set, as `auto` runs now*)"
    )


def _check_folder(path: Path, arg: str) -> None:
    """A folder to be written (made if missing): refused, before any run writes, when it or the nearest
    existing folder above it is not a directory."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        where = "exists and is not a directory" if probe == path else f"cannot be made: {probe} is not a directory"
        raise StlsgdError(f"{arg}: {path}: {where}; give a folder")


def _cmd_demo(args: argparse.Namespace) -> int:
    from stlsgd.experiments.demo import demo

    demo(Path(args.out), progress=not args.quiet, overwrite=args.overwrite)
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from stlsgd.experiments.sweeps import run_sweep

    run_sweep(
        args.config,
        Path(args.out) if args.out else None,
        jobs=args.jobs,
        data_dir=args.data_dir,
        quiet=args.quiet,
        only=args.only,
        limit=args.limit,
        cluster=args.cluster,
    )
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    from stlsgd.experiments.sweeps.replay import replay

    replay(args.dirs, config=args.config, jobs=args.jobs, data_dir=args.data_dir, quiet=args.quiet)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from stlsgd.experiments.report import write_report

    network = None
    if args.network:
        from stlsgd.costmodel import parse_network

        network = parse_network(args.network)
    for path in write_report(
        [Path(d) for d in args.dirs], Path(args.out), args.prefix, network=network, select=args.select
    ):
        print(path)
    return 0


def _cmd_suggest(args: argparse.Namespace) -> int:
    from stlsgd.costmodel import parse_network, require_step
    from stlsgd.experiments.build import build
    from stlsgd.experiments.suggest import proposal_for, report
    from stlsgd.experiments.sweeps.spec import proposal_experiment

    exp, row = proposal_experiment(args.config, args.set)
    given = args.network or getattr(exp.algorithm, "network", None)
    network = parse_network(given, "--network" if args.network else "algorithm.network") if given else None
    if network is not None:
        require_step(network, f"--network: {given}", "suggest")
    if getattr(exp.algorithm, "auto", False):  # the estimates come from the data, whatever the method's fields
        exp = exp.model_copy(update={"algorithm": exp.algorithm.model_copy(update={"auto": False, "network": None})})
    if row is not None:
        print(f"for the row {row!r} of {args.config} (its base with the row's fields)")
    print(report(*proposal_for(exp, build(exp, args.data_dir), network), network))
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from stlsgd.experiments.calibrate import calibrate
    from stlsgd.experiments.config import load_config

    network = calibrate(load_config(args.config, args.set), Path(args.out), args.data_dir)
    if network is not None:
        print(
            f"latency {network.latency_s * 1e6:.1f} us a round, bandwidth {network.bandwidth_Bps * 8 / 1e9:.3g} "
            f"Gbit/s, step {(network.step_s or 0) * 1e9:.1f} ns a client-step ({network.source})"
        )
        print(f"profile: {args.out} (use it as --network {args.out})")
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    from stlsgd.algorithms.registry import methods_table

    print(methods_table())
    return 0


def _cmd_data_fetch(args: argparse.Namespace) -> int:
    from stlsgd.data import fetch, resolve_data_dir

    directory = resolve_data_dir(args.data_dir)
    for name in args.names:
        for path in fetch(name, directory):
            print(path)
    return 0


def _cmd_data_list(args: argparse.Namespace) -> int:
    from stlsgd.data import DATASETS

    for name, spec in DATASETS.items():
        print(f"{name:<16} {spec.description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stlsgd", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run one experiment config")
    p.add_argument("config", help="experiment config (.toml or .yaml)")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a field, e.g. algorithm.lr=3.2"
    )
    p.add_argument("--out", help="output directory (default runs/NAME)")
    p.add_argument("--data-dir", help="data directory (default $STLSGD_DATA or the user cache)")
    p.add_argument("--overwrite", action="store_true", help="replace a different run already in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--checkpoint-every", type=int, default=None, metavar="R", help="write an atomic checkpoint every R rounds"
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument(
        "--backend",
        choices=("sim", "dist"),
        default="sim",
        help="sim: vectorised simulator (default); dist: torch.distributed, launched by torchrun",
    )
    p.add_argument(
        "--comm-backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="torch.distributed backend for --backend dist (auto: nccl on GPU, else gloo)",
    )
    p.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="also write the metrics as TensorBoard scalars into DIR "
        "(needs the tensorboard extra: pip install 'stlsgd[tensorboard]')",
    )
    p.add_argument(
        "--inject-latency",
        metavar="TIME",
        help="--backend dist: wait TIME (e.g. 20ms) before every "
        "average, as a slower network would (to validate the cost model)",
    )
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("demo", help="SyncSGD vs Local SGD vs STL-SGD^sc on the embedded digits (4 vs 9)")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--overwrite", action="store_true", help="replace the demo's runs already in --out")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("sweep", help="run a hyper-parameter grid per method, pick the best, rerun seeds")
    p.add_argument("config", help="sweep file (.toml or .yaml): [base] experiment + [[methods]] grids")
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="worker processes of the local pool (default: all CPUs; not used with --cluster)",
    )
    p.add_argument(
        "--cluster",
        metavar="ADDR",
        help="run on Dask instead: tcp://HOST:PORT (a running `dask scheduler`) or local:N (N local workers)",
    )
    p.add_argument("--out", help="output directory (default runs/sweeps/NAME)")
    p.add_argument(
        "--data-dir", help="data directory (default $STLSGD_DATA or the user cache; with --cluster, as workers see it)"
    )
    p.add_argument("--quiet", action="store_true", help="no line per finished run")
    p.add_argument("--only", action="append", metavar="LABEL", help="run only this row (repeatable)")
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="run only the first N settings of each row, in the file's order (a quick probe)",
    )
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser(
        "replay",
        help="rerun the runs a sweep's figures draw (each row's chosen run) into DIR/runs/ from its "
        "results.jsonl and best.json, each checked against its record; then `stlsgd report DIR...` draws them",
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="sweep directories, each holding best.json and results.jsonl")
    p.add_argument(
        "--config", metavar="FILE", help="the sweep file, with one DIR (default: the one its best.json names)"
    )
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: all CPUs)")
    p.add_argument("--data-dir", help="data directory (default $STLSGD_DATA or the user cache)")
    p.add_argument("--quiet", action="store_true", help="no line per replayed run")
    p.set_defaults(func=_cmd_replay)

    p = sub.add_parser("report", help="tables (Markdown, CSV) and figures (PNG) from sweep directories")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="sweep output directories (with best.json), one per column")
    p.add_argument("--out", default="report", help="output directory (default ./report)")
    p.add_argument("--prefix", default="table", help="file name prefix (default: table)")
    p.add_argument(
        "--network",
        metavar="NET",
        help="price the runs on a network: a preset (datacenter, "
        "cross-region, federated-mobile, lan) with step=..., key=value figures "
        "(latency=50ms,bandwidth=1Gbit,step=20us) or a profile from stlsgd calibrate",
    )
    p.add_argument(
        "--select",
        choices=("rounds", "time"),
        default="rounds",
        help="choose each row's setting by rounds (the paper's rule, default) or by predicted time",
    )
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser(
        "suggest",
        help="estimate L, mu, sigma^2 and zeta^2 of a config's problem; propose STL-SGD "
        "settings (what algorithm.auto = true runs)",
    )
    p.add_argument(
        "config",
        help="experiment config, or a sweep file (its row with algorithm.auto, else its base) (.toml or .yaml)",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field")
    p.add_argument("--data-dir", help="data directory (default $STLSGD_DATA or the user cache)")
    p.add_argument(
        "--network",
        help="propose for this network (as report's --network, with a client-step's time: datacenter,step=446ns, "
        "or a profile from stlsgd calibrate); default: algorithm.network, else fewest rounds",
    )
    p.set_defaults(func=_cmd_suggest)

    p = sub.add_parser(
        "calibrate",
        help="measure a config's step cost and this network's latency and bandwidth; write a profile for --network",
    )
    p.add_argument("config", help="experiment config (.toml or .yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field")
    p.add_argument("--data-dir", help="data directory (default $STLSGD_DATA or the user cache)")
    p.add_argument("--out", default="network-profile.json", help="the profile to write (default network-profile.json)")
    p.set_defaults(func=_cmd_calibrate)

    p = sub.add_parser("methods", help="the registered methods and their [algorithm] fields")
    p.set_defaults(func=_cmd_methods)

    p = sub.add_parser("data", help="datasets")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    f = data_sub.add_parser("fetch", help="download datasets from their official sources and check sha256")
    f.add_argument("names", nargs="+")
    f.add_argument("--data-dir")
    f.set_defaults(func=_cmd_data_fetch)
    f = data_sub.add_parser("list", help="known dataset names")
    f.set_defaults(func=_cmd_data_list)
    return parser


class _Lines(logging.Handler):
    """The library's log records as the command's lines: warnings and errors as ``stlsgd: warning: ...`` on
    stderr, progress (INFO) as plain lines on stdout. Looks the streams up at each record, so that a redirect
    (or pytest's capture) made after the handler was installed is honoured."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            if record.levelno >= logging.WARNING:
                sys.stderr.write(f"stlsgd: {record.levelname.lower()}: {text}\n")
            else:
                sys.stdout.write(text + "\n")
                sys.stdout.flush()
        except Exception:  # noqa: BLE001 -- as logging.StreamHandler: a failed write is reported, never raised
            self.handleError(record)


@contextlib.contextmanager
def _log_lines() -> Iterator[None]:
    """Print the ``stlsgd`` logger's records (INFO and up) as the command's lines while a command runs; the
    library itself only logs, so an application that imports stlsgd decides what is shown."""
    logger = logging.getLogger("stlsgd")
    handler, level = _Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    with _log_lines():
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except StlsgdError as exc:
        if args.debug:
            raise
        from stlsgd.executors.distributed import CollectiveFailure, exit_now

        if isinstance(exc, CollectiveFailure):
            exit_now(str(exc))  # a peer is gone: exit before the launcher or the collective library does
        print(f"stlsgd: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full or read-only disk, a vanished directory: the file and the reason, one line
        if args.debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link (stlsgd.files): say what that means
            print(
                f"stlsgd: error: {where}is a symbolic link; stlsgd never writes through links in an output "
                "directory: remove the link or choose another --out",
                file=sys.stderr,
            )
            return 2
        print(f"stlsgd: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stlsgd: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
