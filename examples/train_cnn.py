"""A plain PyTorch loop training a small CNN on MNIST, turned into local SGD by two added lines (# STL).

Each process is one client (Algorithm 1 of the paper): it takes local SGD steps on its own mini-batches; at the
end of each round every process's parameters, BatchNorm statistics and momentum become their average over all
processes. The period follows the learning rate the loop's own StepLR sets (LR-coupled STL: k = k1 eta_1 / eta,
the paper's eta k = constant), so it doubles each time the scheduler halves the lr.

    torchrun --nproc_per_node=2 examples/train_cnn.py --data-dir ../shared/data
    python examples/train_cnn.py              # one process, synthetic data if MNIST is not found

No torchvision: the images come from stlsgd's MNIST reader (or are synthetic when --data-dir is missing).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from mnist_common import SmallCNN, load_images  # this folder's shared CNN and MNIST loader

from stlsgd.algorithms import LRCoupled
from stlsgd.dropin import PlanAverager  # STL (1 of 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="folder holding mnist/ (default: synthetic data)")
    parser.add_argument("--train-size", type=int, default=12000)
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps")
    parser.add_argument("--decay-every", type=int, default=100, help="StepLR's step size (the lr halves)")
    parser.add_argument("--k1", type=float, default=2, help="the period at the first lr")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    torch.set_num_threads(1)
    X, y, source = load_images(args.data_dir, args.train_size)
    n_eval = min(2000, len(y) // 5)
    X_train, y_train, X_eval, y_eval = X[n_eval:], y[n_eval:], X[:n_eval], y[:n_eval]
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, args.decay_every, 0.5)
    # STL (2 of 2): joins the torchrun job and hooks optimizer.step(); one line per 10 rounds on stderr.
    stl = PlanAverager(model, optimizer, LRCoupled(k1=args.k1), log_every=10)
    rng = np.random.default_rng(1000 + stl.rank)  # every process (client) draws its own mini-batches

    started = time.perf_counter()
    model.train()
    for step in range(args.steps):
        idx = torch.from_numpy(rng.integers(0, len(y_train), size=32))
        loss = F.cross_entropy(model(X_train[idx]), y_train[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if stl.rank == 0 and (step + 1) % 50 == 0:
            print(f"step {step + 1:4d}  period {stl.period}  lr {stl.lr:.4f}  loss {loss.item():.4f}", flush=True)

    if not stl.at_boundary:  # end in the middle of a round: one last average, so all processes hold one model
        stl.average()
    in_sync = stl.models_in_sync()  # every process must call it (a collective)
    model.eval()
    with torch.no_grad():
        accuracy = (model(X_eval).argmax(1) == y_eval).float().mean().item()
    if stl.rank == 0:
        print(
            f"{source}: {stl.world_size} processes, {args.steps} steps in {time.perf_counter() - started:.1f} s, "
            f"{stl.stats.averages} averages ({100 * stl.stats.saved:.0f}% of per-step DDP's traffic saved), "
            f"held-out accuracy {accuracy:.3f}, models identical on all processes: {in_sync}"
        )


if __name__ == "__main__":
    main()
