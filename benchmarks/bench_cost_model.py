"""Validation of the cost model: predicted against measured wall time under torchrun, at injected latencies.

    .venv/bin/python benchmarks/bench_cost_model.py --data-dir ../shared/data [--latencies 2ms 10ms 40ms]

1. ``stlsgd calibrate`` measures, on this machine, the step cost c of the runs' problem (MNIST 4 vs 9, logistic,
   per-client batch 16) and the latency alpha and bandwidth beta of the executor's average over two gloo
   processes on loopback.
2. Local SGD (k = 100) and STL-SGD^sc (k_1 = 100, T_1 = 5000, k doubling) run 50,000 iterations under
   ``torchrun --nproc_per_node=2`` (one client per process, as the model assumes: clients compute in parallel)
   with ``--inject-latency L`` for each L: every average first waits L, as a slower network would.
3. For each run it prints the prediction, rounds (alpha + L) + bytes / beta + client-steps c, against the round
   loop's measured wall time (the run's ``wall_s``: process start-up and data loading excluded; one final
   evaluation included), and the relative error (goal: within 15%).

Other processes on the machine slow the runs and the calibration alike; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STLSGD = [sys.executable, "-m", "stlsgd"]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))

CONFIG = """\
name = "{name}"
[data]
dataset = "mnist49"
num_clients = 2
partition = "shared"
[algorithm]
method = "{method}"
lr = 0.32
k = 100
batch = 16
{extra}
[run]
target_gap = "none"
max_iterations = 50000
eval_every = 1000000000
"""
METHODS = {"Local SGD": ("local_sgd", ""), "STL-SGD^sc": ("stl_sc", "T1 = 5000")}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    return {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--latencies", nargs="+", default=["2ms", "10ms", "40ms"])
    args = parser.parse_args()
    data = ["--data-dir", args.data_dir] if args.data_dir else []
    from stlsgd.costmodel import parse_seconds, predict, read_profile

    with tempfile.TemporaryDirectory(prefix="bench_cost_model_") as tmp:
        tmp_path = Path(tmp)
        configs = {}
        for label, (method, extra) in METHODS.items():
            path = tmp_path / f"{method}.toml"
            path.write_text(CONFIG.format(name=method, method=method, extra=extra))
            configs[label] = path
        profile = tmp_path / "profile.json"
        subprocess.run(
            [*STLSGD, "calibrate", configs["Local SGD"], "--out", profile, *data], check=True, cwd=ROOT, env=_env()
        )
        network = read_profile(profile)
        print(
            f"calibrated: alpha {network.latency_s * 1e6:.0f} us, beta {network.bandwidth_Bps / 1e6:.1f} MB/s, "
            f"c {network.step_s * 1e9:.1f} ns per client-step\n"
        )
        print("| method | injected latency | rounds | client-steps | predicted s | measured s | error |")
        print("|---|---|---|---|---|---|---|")
        worst = 0.0
        for label, config in configs.items():
            for latency in args.latencies:
                out = tmp_path / f"{config.stem}-{latency}"
                subprocess.run(
                    [
                        TORCHRUN,
                        "--nproc_per_node=2",
                        "--rdzv-backend=c10d",
                        f"--rdzv-endpoint=127.0.0.1:{_port()}",
                        "-m",
                        "stlsgd",
                        "run",
                        config,
                        "--backend",
                        "dist",
                        "--quiet",
                        "--out",
                        out,
                        "--inject-latency",
                        latency,
                        *data,
                    ],
                    check=True,
                    cwd=ROOT,
                    env=_env(),
                    capture_output=True,
                )
                s = json.loads((out / "summary.json").read_text())
                alpha = network.latency_s + parse_seconds(latency, "--latencies")
                from stlsgd.costmodel import Network

                at = Network(alpha, network.bandwidth_Bps, network.step_s)
                predicted = predict(s["rounds"], s["bytes_per_client"], s["client_steps"], at).total_s
                error = predicted / s["wall_s"] - 1.0
                worst = max(worst, abs(error))
                print(
                    f"| {label} | {latency} | {s['rounds']} | {s['client_steps']} | {predicted:.2f} | "
                    f"{s['wall_s']:.2f} | {100 * error:+.1f}% |",
                    flush=True,
                )
        print(f"\nworst error {100 * worst:.1f}% (goal: within 15%)")


if __name__ == "__main__":
    main()
