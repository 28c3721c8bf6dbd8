"""STL-SGD^nc as a Flower federated run: the server's strategy sends each round's local steps, learning rate and
proximal anchor from the plan; each client runs exactly those steps; FedAvg averages weights and BatchNorm
statistics. Flower's own server loop, with the clients in this process (no ray, no network).

    python examples/flower_mnist.py --clients 4
    python examples/flower_mnist.py --noniid            # each client holds mostly two digits

Needs ``pip install 'stlsgd[flower]'``. With ``flwr run``, return
``ServerAppComponents(strategy=StlsgdFedAvg(...), config=ServerConfig(num_rounds=strategy.planned_rounds()))`` from
your ServerApp's ``server_fn`` and an ``StlsgdClient`` from your ClientApp's ``client_fn`` (docs/adapters.md).
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np
import torch
from flwr.common import ndarrays_to_parameters
from mnist_common import DEFAULT_DATA, SmallCNN, accuracy, load_images
from torch.utils.data import DataLoader, TensorDataset

from stlsgd.algorithms import STLSGD
from stlsgd.integrations.flower import StlsgdClient, StlsgdFedAvg, get_weights, run_in_process, set_weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=DEFAULT_DATA, help="folder holding mnist/ (else synthetic data)")
    parser.add_argument("--train-size", type=int, default=8000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--noniid", action="store_true", help="sort by label before dealing the shards")
    parser.add_argument("--T1", type=int, default=40, help="first stage length in local steps")
    parser.add_argument("--k1", type=float, default=4, help="first stage period (local steps per round)")
    parser.add_argument("--lr", type=float, default=0.05, help="eta_1 (halved each stage)")
    parser.add_argument("--gamma", type=float, default=10.0, help="STL-SGD^nc's proximal gamma")
    parser.add_argument("--steps", type=int, default=280, help="local steps in all (T1 + 2 T1 + 4 T1 = 3 stages)")
    args = parser.parse_args()

    logging.getLogger("flwr").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    X, y, source = load_images(args.data_dir, args.train_size)
    n_eval = min(2000, len(y) // 5)
    X_eval, y_eval, X, y = X[:n_eval], y[:n_eval], X[n_eval:], y[n_eval:]
    order = torch.argsort(y, stable=True) if args.noniid else torch.arange(len(y))
    shards = np.array_split(order.numpy(), args.clients)
    clients = []
    for i, shard in enumerate(shards):
        torch.manual_seed(i)
        loader = DataLoader(
            TensorDataset(X[shard], y[shard]), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(i)
        )
        clients.append(StlsgdClient(SmallCNN(), loader))

    torch.manual_seed(0)
    global_model = SmallCNN()

    def evaluate(server_round: int, arrays: list[np.ndarray], config: dict) -> tuple[float, dict]:
        set_weights(global_model, arrays)
        acc = accuracy(global_model, X_eval, y_eval)
        return 1.0 - acc, {"accuracy": acc}

    plan = STLSGD(lr=args.lr, T1=args.T1, k1=args.k1, gamma=args.gamma, iid=not args.noniid)
    strategy = StlsgdFedAvg(
        plan,
        max_iterations=args.steps,
        fraction_evaluate=0.0,
        min_fit_clients=args.clients,
        min_available_clients=args.clients,
        initial_parameters=ndarrays_to_parameters(get_weights(global_model)),
        evaluate_fn=evaluate,
    )
    started = time.perf_counter()
    history = run_in_process(strategy, clients)  # strategy.planned_rounds() rounds
    for server_round, acc in history.metrics_centralized["accuracy"][1:]:
        rnd = strategy.completed[server_round - 1]
        print(
            f"round {server_round:3d}  stage {rnd.stage}  {rnd.steps:2d} local steps  lr {rnd.lr:.4f}  "
            f"held-out accuracy {acc:.3f}"
        )
    print(
        f"{source}: {args.clients} clients ({'non-IID' if args.noniid else 'IID'}), {strategy.cursor.iteration} "
        f"local steps in {strategy.averages} rounds, {time.perf_counter() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
