"""Throughput of the vectorised NN clients against a per-client loop, measured in the same run.

    .venv/bin/python benchmarks/bench_nn.py [--model cnn] [--clients 8] [--batch 64] [--steps 30] [--device auto]

Both sides run the same work: ``clients`` models, each taking ``steps`` SGD steps on its own mini-batches of
``batch`` images (MNIST-shaped 1x28x28 for ``cnn``, CIFAR-shaped 3x32x32 otherwise). The vectorised side is
:class:`stlsgd.problems.neural.NeuralNetProblem` (one vmap(grad) call per step for all clients); the baseline
is a Python loop over ``clients`` standard ``nn.Module`` + ``torch.optim.SGD`` pairs. Prints images/s of each
and the ratio.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from stlsgd.problems.nets import make_model
from stlsgd.problems.neural import NeuralNetProblem, resolve_device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cnn", choices=("cnn", "resnet18", "vgg16"))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    device = resolve_device(args.device)
    shape = (1, 28, 28) if args.model == "cnn" else (3, 32, 32)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.samples, *shape), dtype=np.float32)
    y = rng.integers(0, 10, args.samples)
    torch.manual_seed(0)
    problem = NeuralNetProblem(make_model(args.model, shape[0], 10, shape[1]), X, y, device=str(device))
    state = problem.init_state(args.clients, seed=0)
    lrs = np.full(args.steps, 0.01)
    images = args.clients * args.batch * args.steps

    # Baseline: one nn.Module + SGD optimizer per client, stepped one after the other.
    models = []
    for c in range(args.clients):
        m = make_model(args.model, shape[0], 10, shape[1]).to(device).train()
        m.load_state_dict({k: v[c] for k, v in state.items()})
        models.append((m, torch.optim.SGD(m.parameters(), lr=0.01)))
    Xd, yd = problem.X, problem.y

    def loop(rows: np.ndarray) -> None:
        rows_t = torch.from_numpy(rows).to(device)
        for c, (m, opt) in enumerate(models):
            for t in range(args.steps):
                idx = rows_t[t, c]
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(m(Xd[idx]), yd[idx]).backward()
                opt.step()

    def vectorised(rows: np.ndarray) -> None:
        problem.local_steps(state, rows, lrs, None)

    results: dict[str, float] = {}
    for name, fn in (("vectorised", vectorised), ("per-client loop", loop)):
        fn(rng.integers(0, args.samples, (args.steps, args.clients, args.batch)))  # warm-up
        best = float("inf")
        for _ in range(args.repeats):
            rows = rng.integers(0, args.samples, (args.steps, args.clients, args.batch))
            _sync(device)
            t0 = time.perf_counter()
            fn(rows)
            _sync(device)
            best = min(best, time.perf_counter() - t0)
        results[name] = images / best
        print(f"{name:>16}: {images / best:10.0f} images/s  ({best:.3f} s for {images} images, best of {args.repeats})")
    print(
        f"model={args.model} clients={args.clients} batch={args.batch} device={device} "
        f"threads={torch.get_num_threads()}"
    )
    print(f"speed-up vectorised / loop: {results['vectorised'] / results['per-client loop']:.2f}x")


if __name__ == "__main__":
    main()
