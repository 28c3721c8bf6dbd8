"""The adversarial findings rerun as a user would run them: one command each, its exit status and first line.

    .venv/bin/python tests/reliability/cases.py [--data-dir ../shared/data] [--only-round-three]

Not a test (the reliability tests -- test_refused_before_any_write.py, test_write_failures.py,
test_bad_input.py and their neighbours -- assert each case); this prints the table of the closing note. The full-disk cases use a real 96 KiB tmpfs when this process may mount one (root), and say so
otherwise.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from base_run import BASE  # this folder's base case: digits 4 vs 9, Local SGD, 50 rounds
from test_round_three import SWEEP  # a small sweep whose two rows reach gap 1e-2

from stlsgd.files import lock_directory

ROOT = Path(__file__).resolve().parents[2]
NEWLINE = b"\n"
STLSGD = [sys.executable, "-m", "stlsgd"]


def run(cmd: list, cwd: Path, **kw) -> tuple[int, str]:
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=600, **kw)
    first = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or [""])[0]
    return p.returncode, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument(
        "--only-round-three", action="store_true", help="only the cases of the third round (R3 ...), a few minutes"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stlsgd_cases_"))
    cfg = tmp / "c.toml"
    cfg.write_text(BASE.format(dataset="digits49"))
    rows: list[tuple[str, str, int, str]] = []

    def case(name: str, cmd: list, **kw) -> None:
        code, first = run(cmd, tmp, **kw)
        rows.append(
            (
                name,
                " ".join(str(c) for c in cmd).replace(str(tmp) + "/", "").replace(sys.executable, "python"),
                code,
                first,
            )
        )

    if args.only_round_three:
        round_three(tmp, cfg, case, rows)
        _print(rows)
        shutil.rmtree(tmp, ignore_errors=True)
        return
    out = tmp / "run"
    case("finished run", [*STLSGD, "run", cfg, "--out", out, "--quiet", "--checkpoint-every", "10"])
    # 1. a corrupted checkpoint
    ckpt = out / "checkpoint"
    data = bytearray(ckpt.read_bytes())
    data[len(data) // 2] ^= 0x01
    ckpt.write_bytes(bytes(data))
    case("1 flipped byte in the checkpoint", [*STLSGD, "run", cfg, "--out", out, "--resume", "--quiet"])
    # 2. the dataset changed between the kill and the resume
    svm = tmp / "digits.svm"
    from sklearn.datasets import dump_svmlight_file

    from stlsgd.data import load_dataset

    ds = load_dataset("digits49")
    dump_svmlight_file(ds.X, ds.y, str(svm))
    cfg2 = tmp / "c2.toml"
    cfg2.write_text(BASE.format(dataset=svm).replace("max_rounds = 50", "max_rounds = 100000"))
    out2 = tmp / "run2"
    # Killed after round 5's checkpoint ($STLSGD_FAULT, stlsgd/faults.py): a known instant, no polling.
    killed = subprocess.run(
        [*STLSGD, "run", cfg2, "--out", out2, "--quiet", "--checkpoint-every", "5"],
        cwd=tmp,
        env={**os.environ, "STLSGD_FAULT": "die-after-round=5"},
        timeout=600,
    )
    assert killed.returncode == -signal.SIGKILL and (out2 / "checkpoint").is_file()
    lines = svm.read_text().splitlines()
    svm.write_text("\n".join(lines[:200]) + "\n")
    case("2 dataset cut after the kill, --resume", [*STLSGD, "run", cfg2, "--out", out2, "--resume", "--quiet"])
    # 3. errors after output was touched
    for override in ("run.seed=-1", "data.partition_seed=-3"):
        case(
            f"3 --set {override} --overwrite on a finished run",
            [*STLSGD, "run", cfg, "--out", tmp / "fresh", "--quiet"],
        )
        case(f"3 --set {override}", [*STLSGD, "run", cfg, "--out", tmp / "fresh", "--overwrite", "--set", override])
    sweep = tmp / "s.toml"
    sweep.write_text(
        'name = "s"\nseeds = [0, -1]\n[base.data]\ndataset = "digits49"\nnum_clients = 4\n'
        '[[methods]]\nmethod = "sync_sgd"\ngrid = { lr = [0.5] }\n'
    )
    case("3 sweep seeds = [0, -1]", [*STLSGD, "sweep", sweep, "--out", tmp / "sw", "--jobs", "1"])
    # 4. full disk
    mnt = tmp / "tmpfs"
    mnt.mkdir()

    def mount(size: str, *options: str) -> bool:
        subprocess.run(["umount", str(mnt)], capture_output=True)
        opts = ",".join((f"size={size}", *options))
        return (
            subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mnt)], capture_output=True).returncode == 0
        )

    if mount("96k"):
        try:
            cfg3 = tmp / "c3.toml"
            cfg3.write_text(BASE.format(dataset="digits49").replace("max_rounds = 50", "max_rounds = 4000"))
            case(
                "4 run on a full disk (96 KiB tmpfs)",
                [*STLSGD, "run", cfg3, "--out", mnt / "run", "--quiet", "--checkpoint-every", "100"],
            )
            mount("48k")
            sweep.write_text(
                'name = "s"\nseeds = [0]\n[base.data]\ndataset = "digits49"\nnum_clients = 4\n'
                '[base.run]\nmax_rounds = 20\ntarget_gap = "none"\n'
                '[[methods]]\nmethod = "local_sgd"\ngrid = { lr = [0.5, 0.4, 0.3, 0.2, 0.1], '
                "k = [2, 3, 4, 5, 6, 7, 8] }\n"
            )
            case(
                "4 sweep on a full disk (48 KiB tmpfs)",
                [*STLSGD, "sweep", sweep, "--out", mnt / "sw", "--jobs", "1", "--quiet"],
            )
            text = (mnt / "sw" / "results.jsonl").read_bytes() if (mnt / "sw" / "results.jsonl").exists() else b""
            complete, torn = text.count(NEWLINE), bool(text) and not text.endswith(NEWLINE)
            rows.append(("4 its results.jsonl", "", 0, f"{complete} complete lines, torn last line: {torn}"))
            mount("96k", "ro")
            case("6 run --out <a read-only file system>", [*STLSGD, "run", cfg, "--out", mnt / "run", "--quiet"])
        finally:
            subprocess.run(["umount", str(mnt)])
    else:
        rows.append(("4 full disk", "", 0, "not run: no tmpfs could be mounted here (see test_write_failures.py)"))
    # 5. a second writer
    busy = tmp / "busy"
    case(
        "5 a run (its directory is then held, as a run that is going holds it)",
        [*STLSGD, "run", cfg, "--out", busy, "--quiet"],
    )
    held = lock_directory(busy)
    try:
        case(
            "5 second run --overwrite into a running run's directory",
            [*STLSGD, "run", cfg2, "--out", busy, "--quiet", "--overwrite"],
        )
    finally:
        os.close(held)
    sweep.write_text(
        'name = "s"\nseeds = [0, 1, 1]\n[base.data]\ndataset = "digits49"\nnum_clients = 4\n'
        '[[methods]]\nmethod = "sync_sgd"\ngrid = { lr = [0.5] }\n'
    )
    case("5 sweep seeds = [0, 1, 1]", [*STLSGD, "sweep", sweep, "--out", tmp / "sw5", "--jobs", "1"])
    # 6. tracebacks that are now one line
    for index in ("1000000000000", "2000000000"):
        f = tmp / f"big{index}.svm"
        f.write_text(f"+1 1:1\n-1 {index}:1\n")
        case(
            f"6 svmlight feature index {index}",
            [*STLSGD, "run", cfg, "--out", tmp / "o6", "--set", f"data.dataset={f}"],
        )
    for k in ("1e999", "99999999999999999999999"):
        case(f"6 --set algorithm.k={k}", [*STLSGD, "run", cfg, "--out", tmp / "o6", "--set", f"algorithm.k={k}"])
    case(
        "6 problem.kind=logistic on cifar10-png200",
        [*STLSGD, "run", cfg, "--out", tmp / "o6", "--data-dir", args.data_dir, "--set", "data.dataset=cifar10-png200"],
    )
    afile = tmp / "a-file"
    afile.write_text("x")
    case("6 data fetch --data-dir <a file>", [*STLSGD, "data", "fetch", "mushrooms", "--data-dir", afile])
    ro = tmp / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    case("6 run --out <a chmod 555 dir> (root ignores the mode)", [*STLSGD, "run", cfg, "--out", ro, "--quiet"])
    sweep.write_text(
        'name = "s"\nseeds = [0]\n[base.data]\ndataset = "digits49"\nnum_clients = 4\n'
        '[base.run]\nmax_rounds = 20\n[[methods]]\nmethod = "sync_sgd"\ngrid = { lr = [0.5] }\n'
    )
    case("6 sweep --out <a file>", [*STLSGD, "sweep", sweep, "--out", afile, "--jobs", "1"])
    run([*STLSGD, "sweep", sweep, "--out", tmp / "sw6", "--jobs", "1", "--quiet"], tmp)
    case("6 report --out <a file>", [*STLSGD, "report", tmp / "sw6", "--out", afile])
    # 7. a failed start leaves nothing; the corrected rerun goes
    case("7 failed start", [*STLSGD, "run", cfg, "--out", tmp / "o7", "--set", "data.dataset=missing.svm"])
    rows.append(("7 the directory after it", "", 0, f"exists: {(tmp / 'o7').exists()}"))
    case("7 corrected rerun", [*STLSGD, "run", cfg, "--out", tmp / "o7", "--quiet"])
    # 9. accepted silently before
    case("9 --set algorithm.lr=inf", [*STLSGD, "run", cfg, "--out", tmp / "o9", "--set", "algorithm.lr=inf"])
    dup = tmp / "dup.yaml"
    dup.write_text("algorithm:\n  method: local_sgd\n  lr: 1\n  lr: 2\n")
    case("9 duplicate YAML key", [*STLSGD, "run", dup, "--out", tmp / "o9"])
    labels = tmp / "labels.svm"
    labels.write_text("+1\n-1\n+1\n")
    case("9 svmlight with labels only", [*STLSGD, "run", cfg, "--out", tmp / "o9", "--set", f"data.dataset={labels}"])
    case("9 --set run.max_rounds=true", [*STLSGD, "run", cfg, "--out", tmp / "o9", "--set", "run.max_rounds=true"])
    case('9 --set name="../../x"', [*STLSGD, "run", cfg, "--set", 'name="../../x"'])
    # 10. confusing messages
    case("10 a directory as the dataset", [*STLSGD, "run", cfg, "--out", tmp / "o10", "--set", f"data.dataset={tmp}"])
    case(
        "10 --data-dir <a file>",
        [*STLSGD, "run", cfg, "--out", tmp / "o10", "--data-dir", afile, "--set", "data.dataset=a9a"],
    )
    bom = tmp / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + cfg.read_bytes())
    case("10 UTF-8 BOM in TOML", [*STLSGD, "run", bom, "--out", tmp / "o10b", "--quiet"])
    run([*STLSGD, "run", cfg, "--out", tmp / "o10c", "--quiet", "--checkpoint-every", "10"], tmp)
    (tmp / "o10c" / "checkpoint").write_bytes(b"PK\x03\x04 not a zip at all" * 20)
    case("10 unreadable checkpoint", [*STLSGD, "run", cfg, "--out", tmp / "o10c", "--resume"])
    round_three(tmp, cfg, case, rows)
    _print(rows)
    ro.chmod(0o755)
    shutil.rmtree(tmp, ignore_errors=True)


def _print(rows: list[tuple[str, str, int, str]]) -> None:
    print("| case | command | exit | first line |")
    print("|---|---|---|---|")
    for name, cmd, code, first in rows:
        print(f"| {name} | `{cmd}` | {code} | {first.replace('|', '/')} |")


def _around(root: Path, skip: Path) -> dict[str, bytes | str]:
    """Every file and link under ``root`` but those under ``skip`` (bytes, or a link's target)."""
    seen: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        if path == skip or skip in path.parents or "tmpfs" in path.parts:
            continue
        seen[str(path)] = (
            "-> " + os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else ""
        )
    return seen


def round_three(tmp: Path, cfg: Path, case, rows: list[tuple[str, str, int, str]]) -> None:  # type: ignore[no-untyped-def]
    """The findings of the third round (issue: nothing outside --out is touched, the newer commands keep the
    one-line promise), named R3 and the finding's number."""
    r3 = tmp / "r3"
    r3.mkdir()

    def links(out: Path, names: list[str]) -> None:
        out.mkdir(parents=True)
        for i, name in enumerate(names):
            victim = r3 / f"victim-{out.name}-{i}"
            if i % 2:
                (out / name).symlink_to(r3 / f"dangling-{out.name}-{i}")
            else:
                victim.write_bytes(b"a\nb")
                (out / name).symlink_to(victim)

    def unchanged(name: str, out: Path, before: dict[str, bytes | str]) -> None:
        rows.append(
            (name, "", 0, f"files outside {out.name}/ unchanged and none created: {_around(tmp, out) == before}")
        )

    sweep_file = r3 / "sw.toml"
    sweep_file.write_text(SWEEP)
    # 1. links inside --out
    for command, names, extra in (
        ("run", [".stlsgd.lock", "metrics.jsonl", "summary.json"], [cfg, "--quiet"]),
        ("sweep", ["results.jsonl", ".stlsgd.lock", "best.json"], [sweep_file, "--jobs", "1", "--quiet"]),
        ("demo", ["demo.png", "sync_sgd"], ["--quiet"]),
    ):
        out = r3 / f"links-{command}"
        links(out, names)
        before = _around(tmp, out)
        case(
            f"R3 1 {command} --out <links: {', '.join(names)}>",
            [*STLSGD, command, *extra[:1], "--out", out, *extra[1:]],
        )
        unchanged(f"R3 1 {command}: around it", out, before)
    sweep = r3 / "S"
    run([*STLSGD, "sweep", sweep_file, "--out", sweep, "--jobs", "1", "--quiet"], tmp)
    out = r3 / "links-report"
    links(out, ["table.md", "table.csv", "table_rounds.png"])
    before = _around(tmp, out)
    case("R3 1 report --out <links: table.md, table.csv, table_rounds.png>", [*STLSGD, "report", sweep, "--out", out])
    unchanged("R3 1 report: around it (its links replaced by files)", out, before)
    # 2. the demo asks first
    (r3 / "D" / "local_sgd").mkdir(parents=True)
    (r3 / "D" / "local_sgd" / "config.yaml").write_text("mine: 1\n")
    case("R3 2 demo --out <D holding a run>", [*STLSGD, "demo", "--out", r3 / "D", "--quiet"])
    # 3. an atomic report
    rep = r3 / "R"
    run([*STLSGD, "report", sweep, "--out", rep], tmp)
    before = _around(rep, r3 / "none")
    best = json.loads((sweep / "best.json").read_text())
    metrics = sweep / best["methods"]["local_sgd"]["run_dir"] / "metrics.jsonl"
    kept = metrics.read_bytes()
    lines = kept.decode().splitlines()
    lines[2] = json.dumps({k: v for k, v in json.loads(lines[2]).items() if k != "round"})
    metrics.write_text("\n".join(lines) + "\n")
    case(
        "R3 3 report failing half-way (a metrics line without round)",
        [*STLSGD, "report", sweep, "--out", rep, "--network", "datacenter,step=1us"],
    )
    rows.append(
        ("R3 3 the old report after it", "", 0, f"byte-for-byte unchanged: {_around(rep, r3 / 'none') == before}")
    )
    metrics.write_bytes(kept)
    profile = r3 / "p.json"
    profile.write_text(
        json.dumps(
            {
                "format": "stlsgd-network-profile",
                "version": 1,
                "problem": {"dataset": "a9a"},
                "latency_s": 1e-3,
                "bandwidth_Bps": 1e9,
                "step_s": 1e-6,
                "measured": {},
            }
        )
    )
    case(
        "R3 3 report --network <a9a profile> (refused)",
        [*STLSGD, "report", sweep, "--out", r3 / "new" / "R", "--network", profile],
    )
    rows.append(("R3 3 its --out after it", "", 0, f"exists: {(r3 / 'new').exists()}"))
    # 8, 9, 11. pricing
    case(
        "R3 8 report --network latency=1ms,bandwidth=1e-305B,step=1us",
        [*STLSGD, "report", sweep, "--out", r3 / "R8", "--network", "latency=1ms,bandwidth=1e-305B,step=1us"],
    )
    case(
        "R3 8 report --network latency=1e308s,...",
        [*STLSGD, "report", sweep, "--out", r3 / "R8", "--network", "latency=1e308s,bandwidth=1Gbit,step=1us"],
    )
    shutil.copytree(ROOT / "docs/results/table2_data/table2_a9a_noniid", r3 / "X")  # records without client-steps
    code, first = run([*STLSGD, "report", "X", "--out", "R9", "--network", "cross-region,step=1us"], r3)
    rows.append(
        (
            "R3 9 report <a copied stored sweep> --network cross-region,step=1us",
            "python -m stlsgd report X --out R9 --network cross-region,step=1us",
            code,
            first,
        )
    )
    none = r3 / "none-reached"
    shutil.copytree(sweep, none)
    best = json.loads((none / "best.json").read_text())
    for info in best["methods"].values():
        info["median"] = info["min"] = info["max"] = None
        info["seeds_reached"] = 0
        for rec in info["seeds"].values():
            rec["status"], rec["rounds_to_target"] = "budget", None
    (none / "best.json").write_text(json.dumps(best))
    case(
        "R3 11 report <no row reached the target> --network datacenter",
        [*STLSGD, "report", none, "--out", r3 / "R11", "--network", "datacenter"],
    )
    # 10, 12. configs
    case(
        "R3 10 max_iterations, max_rounds and target_gap all none",
        [*STLSGD, "run", cfg, "--out", r3 / "o", "--set", "run.max_rounds=none", "--set", "run.max_iterations=none"],
    )
    stl = r3 / "stl.toml"
    stl.write_text(cfg.read_text().replace('"local_sgd"', '"stl_sc"'))
    for override in ("algorithm.lr=1e-320", "problem.lam=1e-320"):
        case(f"R3 12 stl_sc --set {override}", [*STLSGD, "run", stl, "--out", r3 / "o", "--set", override])
    # 14. decompression bombs
    (r3 / "dd" / "a9a").mkdir(parents=True)
    (r3 / "dd" / "a9a" / "a9a.gz").write_bytes(gzip.compress(b"+1 1:1\n-1 2:1\n" * 20_000))
    case(
        "R3 14 a9a.gz inflating to 40,000 lines (a9a: 32,561)",
        [*STLSGD, "run", cfg, "--out", r3 / "o", "--data-dir", r3 / "dd", "--set", "data.dataset=a9a"],
    )
    bomb = r3 / "bomb.svm.gz"
    bomb.write_bytes(gzip.compress(b"+1 1:1\n-1 2:1\n" * 10_000_000, compresslevel=6))
    started = time.perf_counter()
    case(
        f"R3 14 {bomb.stat().st_size // 1024} KiB .gz inflating to 140 MB",
        [*STLSGD, "run", cfg, "--out", r3 / "o", "--set", f"data.dataset={bomb}"],
    )
    rows.append(("R3 14 its time", "", 0, f"{time.perf_counter() - started:.1f} s (including the start of python)"))
    # 15. the smaller ones
    case("R3 15 name with a newline", [*STLSGD, "run", cfg, "--out", r3 / "o", "--set", 'name="a\\nb"'])
    nul = r3 / "nul.toml"
    nul.write_text(SWEEP.replace('method = "sync_sgd"', 'method = "sync_sgd"\nlabel = "a\\u0000b"'))
    case("R3 15 sweep label with a NUL", [*STLSGD, "sweep", nul, "--out", r3 / "o"])
    afile = r3 / "a-file"
    afile.write_text("x")
    case("R3 15 --tensorboard <a file>", [*STLSGD, "run", cfg, "--out", r3 / "o15", "--tensorboard", afile])
    rows.append(("R3 15 its --out after it", "", 0, f"exists: {(r3 / 'o15').exists()}"))
    started = time.perf_counter()
    case(
        "R3 15 calibrate --out <missing folder>/p.json", [*STLSGD, "calibrate", cfg, "--out", r3 / "missing" / "p.json"]
    )
    rows.append(("R3 15 its time", "", 0, f"{time.perf_counter() - started:.1f} s (including the start of python)"))
    fifo = r3 / "fifo.toml"
    os.mkfifo(fifo)
    case("R3 15 a FIFO as the config", [*STLSGD, "run", fifo, "--out", r3 / "o"])
    big = r3 / "big.toml"
    values = ", ".join(str(round(0.001 * (i + 1), 3)) for i in range(100))
    big.write_text(
        SWEEP.split("[[methods]]")[0].replace("max_rounds = 300", "max_rounds = 5")
        + f'[[methods]]\nmethod = "local_sgd"\ngrid = {{ lr = [{values}], k = [{", ".join(str(i + 1) for i in range(100))}], lr_decay = [{", ".join(str((i + 1) / 100) for i in range(10))}] }}\n'
    )
    started = time.perf_counter()
    case(
        "R3 15 sweep --limit 1 on a 100,000-setting grid",
        [*STLSGD, "sweep", big, "--out", r3 / "big", "--jobs", "1", "--limit", "1", "--quiet"],
    )
    rows.append(
        (
            "R3 15 its time",
            "",
            0,
            f"{time.perf_counter() - started:.1f} s (one 5-round run, including the start of python)",
        )
    )


if __name__ == "__main__":
    os.environ.setdefault("STLSGD_CACHE", tempfile.mkdtemp(prefix="stlsgd_cache_"))
    main()
