"""Flower with Non-IID clients: FedAvg (fixed period), STL-SGD and STL-SGD with drift correction, rounds to a target.

    .venv/bin/python benchmarks/bench_flower.py --data-dir ../shared/data [--target 0.85] [--seeds 0 1]

Four in-process Flower clients (:func:`stlsgd.integrations.flower.run_in_process`: Flower's own server loop, no
ray, no network) share ``--train-size`` MNIST training images with label skew: each client holds
``--classes`` digits only (``make_partition(..., "noniid", s=0)``). The model is softmax regression on the
784 pixels (``--hidden H``: a one-hidden-layer MLP), plain SGD, batch ``--batch``; the server evaluates the global
model on the 10,000 test images after every round (Flower's ``evaluate_fn``). Per method and seed it prints the
rounds and local steps to reach ``--target`` test accuracy (``-`` when not within ``--max-steps`` local steps) and
the best accuracy seen, and how many honest updates the server's checks rejected (0 expected):

- ``fedavg``: Local SGD at a fixed period ``--k`` and lr ``--lr`` (FedAvg with E local steps);
- ``stl``: STL-SGD^sc for Non-IID data (Algorithm 2): stage s runs ``2^(s-1) T1`` steps at lr ``lr / 2^(s-1)``
  with period ``k sqrt(2)^(s-1)``;
- ``stl+drift``: the same with SCAFFOLD's control variates (``StlsgdFedAvg(drift=True)``), on the IID schedule
  (period ``k 2^(s-1)``) that drift correction makes safe, as the simulator's ``drift = true`` does.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from flwr.common import ndarrays_to_parameters
from torch import nn

from stlsgd.algorithms import STLSGD, LocalSGD
from stlsgd.algorithms.plan import Plan
from stlsgd.data import load_dataset, make_partition
from stlsgd.integrations.flower import StlsgdClient, StlsgdFedAvg, get_weights, run_in_process, set_weights

METHODS = ("fedavg", "stl", "stl+drift")
DEFAULT_DATA = str(Path(__file__).resolve().parents[2] / "shared" / "data")


def model_for(hidden: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    if hidden:
        return nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))


def plan_for(method: str, args: argparse.Namespace) -> Plan:
    if method == "fedavg":
        return LocalSGD(lr=args.lr, k=args.k)
    return STLSGD(lr=args.lr, T1=args.T1, k1=float(args.k), iid=method == "stl+drift")


def run_one(method: str, seed: int, data: dict, args: argparse.Namespace) -> dict:
    X, y, Xt, yt = data["X"], data["y"], data["Xt"], data["yt"]
    partition = make_partition(y.numpy(), args.clients, "noniid", seed=seed, s=0.0)
    clients = []
    for c in range(args.clients):
        rows = torch.as_tensor(partition.client_rows(c))
        g = torch.Generator().manual_seed(1000 * seed + c)

        def batch(size: int, rows: torch.Tensor = rows, g: torch.Generator = g) -> tuple[torch.Tensor, torch.Tensor]:
            pick = rows[torch.randint(len(rows), (args.batch,), generator=g)]
            return X[pick], y[pick]

        clients.append(StlsgdClient(model_for(args.hidden, seed), batch))
    evaluator = model_for(args.hidden, seed)
    curve: list[tuple[int, float]] = []
    reached: dict[str, int] = {}

    def evaluate(server_round: int, arrays: list[np.ndarray], config: dict) -> tuple[float, dict]:
        set_weights(evaluator, arrays)
        with torch.no_grad():
            out = evaluator(Xt)
            loss, acc = float(F.cross_entropy(out, yt)), float((out.argmax(1) == yt).float().mean())
        steps = strategy.cursor.iteration
        curve.append((steps, acc))
        if acc >= args.target and not reached:
            reached.update(rounds=strategy.averages, steps=steps)
            strategy.max_iterations = steps  # the target is reached: the remaining rounds train nothing
        return loss, {"accuracy": acc}

    strategy = StlsgdFedAvg(
        plan_for(method, args),
        max_iterations=args.max_steps,
        drift=method == "stl+drift",
        fraction_evaluate=0.0,
        min_fit_clients=args.clients,
        min_available_clients=args.clients,
        initial_parameters=ndarrays_to_parameters(get_weights(evaluator)),
        evaluate_fn=evaluate,
    )
    started = time.perf_counter()
    run_in_process(strategy, clients, num_rounds=strategy.planned_rounds())
    return {
        "rounds": reached.get("rounds"),
        "steps": reached.get("steps"),
        "best": max(a for _, a in curve),
        "final": curve[-1][1],
        "averages": strategy.averages,
        "rejected": len(strategy.rejected),
        "wall_s": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=DEFAULT_DATA)
    parser.add_argument("--train-size", type=int, default=12000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=0, help="hidden units (0: softmax regression)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--k", type=int, default=8, help="FedAvg's period; STL's first-stage period k1")
    parser.add_argument("--T1", type=int, default=400, help="STL's first stage, in local steps")
    parser.add_argument("--target", type=float, default=0.85, help="test accuracy")
    parser.add_argument("--max-steps", type=int, default=4000, help="local steps per client at most")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    torch.set_num_threads(1)

    train = load_dataset("mnist10", args.data_dir)
    test = load_dataset("mnist10-test", args.data_dir)
    data = {
        "X": torch.as_tensor(train.X[: args.train_size]),
        "y": torch.as_tensor(train.y[: args.train_size]).long(),
        "Xt": torch.as_tensor(test.X),
        "yt": torch.as_tensor(test.y).long(),
    }
    print(
        f"MNIST, {args.train_size} images over {args.clients} clients with label skew (noniid, s = 0), "
        f"{'softmax regression' if not args.hidden else f'MLP {args.hidden}'}, batch {args.batch}, lr {args.lr}, "
        f"k {args.k}, T1 {args.T1}; target {args.target:.0%} test accuracy within {args.max_steps} local steps"
    )
    print(
        f"{'method':<10} {'seed':>4} {'rounds':>6} {'steps':>6} {'best acc':>8} {'final':>6} {'rejected':>8} {'wall s':>6}"
    )
    table: dict[str, list[dict]] = {}
    for method in args.methods:
        for seed in args.seeds:
            r = run_one(method, seed, data, args)
            table.setdefault(method, []).append(r)
            print(
                f"{method:<10} {seed:>4} {r['rounds'] if r['rounds'] else '-':>6} {r['steps'] or '-':>6} "
                f"{r['best']:>8.4f} {r['final']:>6.4f} {r['rejected']:>8} {r['wall_s']:>6.1f}",
                flush=True,
            )
    if len(args.seeds) > 1:
        print("median over the seeds (rounds to target; '-' when a seed missed it):")
        for method, rows in table.items():
            rounds = [r["rounds"] for r in rows]
            text = "-" if None in rounds else f"{statistics.median(rounds):g}"
            print(f"  {method:<10} {text}")


if __name__ == "__main__":
    main()
