"""The adversarial findings rerun as a user would run them: one command each, its exit status and first line.

    .venv/bin/python tests/reliability/cases.py [--data-dir ../shared/data]

Not a test (the reliability tests -- test_refused_before_any_write.py, test_write_failures.py,
test_bad_input.py and their neighbours -- assert each case); this prints the table of the closing note. The full-disk cases use a real 96 KiB tmpfs when this process may mount one (root), and say so
otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from base_run import BASE  # this folder's base case: digits 4 vs 9, Local SGD, 50 rounds

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
    proc = subprocess.Popen([*STLSGD, "run", cfg2, "--out", out2, "--quiet", "--checkpoint-every", "5"], cwd=tmp)
    while not (out2 / "checkpoint").is_file():
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
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
    proc = subprocess.Popen([*STLSGD, "run", cfg2, "--out", tmp / "busy", "--quiet", "--overwrite"], cwd=tmp)
    while not (tmp / "busy" / "metrics.jsonl").is_file():
        time.sleep(0.05)
    case(
        "5 second run --overwrite into a running run's directory",
        [*STLSGD, "run", cfg2, "--out", tmp / "busy", "--quiet", "--overwrite"],
    )
    proc.kill()
    proc.wait()
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

    print("| case | command | exit | first line |")
    print("|---|---|---|---|")
    for name, cmd, code, first in rows:
        print(f"| {name} | `{cmd}` | {code} | {first.replace('|', '/')} |")
    ro.chmod(0o755)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("STLSGD_CACHE", tempfile.mkdtemp(prefix="stlsgd_cache_"))
    main()
