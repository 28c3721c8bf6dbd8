"""Simulator throughput on a9a: 32 clients, batch 1, Local SGD k = 100.

Measures, in one process, global iterations per second (one iteration = one local step of every client) of

* the vectorised simulator (stacked clients, compiled local steps, one mean over the client axis), and
* a naive reference: one torch ``nn.Linear`` and ``torch.optim.SGD`` per client, looped in Python, averaged
  with a loop over the clients' parameters every k steps,

on the same sampled rows, checks that both reach the same parameters, and prints both rates and the ratio.

    python benchmarks/bench_simulator.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from stlsgd.algorithms import LocalSGD
from stlsgd.data import load_dataset, make_partition, resolve_data_dir
from stlsgd.executors.sampling import Sampler
from stlsgd.executors.simulator import StopRule, init_run_state, run
from stlsgd.problems.logistic import LogisticRegression


def simulator_rate(problem, partition, k: int, iterations: int, lr: float) -> tuple[float, np.ndarray]:
    sampler = Sampler(partition, seed=0)
    state = init_run_state(problem, sampler, partition.num_clients, 0)
    plan = LocalSGD(lr=lr, k=k)
    stop = StopRule(max_iterations=iterations, eval_every=10**9)
    start = time.perf_counter()
    state = run(plan, problem, sampler, stop, state, progress=False)
    elapsed = time.perf_counter() - start
    return state.iteration / elapsed, state.clients["w"][0].copy()


def naive_rate(problem, partition, k: int, iterations: int, lr: float) -> tuple[float, np.ndarray]:
    torch.set_num_threads(1)
    X = torch.from_numpy(problem.X.toarray())
    y = torch.from_numpy(problem.y)
    n_clients = partition.num_clients
    models = [torch.nn.Linear(problem.dim, 1, bias=False, dtype=torch.float64) for _ in range(n_clients)]
    for m in models:
        torch.nn.init.zeros_(m.weight)
    opts = [torch.optim.SGD(m.parameters(), lr=lr, weight_decay=problem.lam) for m in models]
    sampler = Sampler(partition, seed=0)
    start = time.perf_counter()
    for _ in range(iterations // k):
        rows = torch.from_numpy(sampler.draw(k, 1))
        for t in range(k):
            for c, (model, opt) in enumerate(zip(models, opts)):
                r = rows[t, c]
                opt.zero_grad()
                margin = y[r] * model(X[r]).squeeze(-1)
                torch.nn.functional.softplus(-margin).mean().backward()
                opt.step()
        with torch.no_grad():
            mean = torch.stack([m.weight for m in models]).mean(0)
            for m in models:
                m.weight.copy_(mean)
    elapsed = time.perf_counter() - start
    return iterations / elapsed, models[0].weight.detach().numpy()[0].copy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir")
    parser.add_argument("--iterations", type=int, default=1_000_000, help="simulator iterations to time")
    parser.add_argument("--naive-iterations", type=int, default=2_000, help="naive-loop iterations to time")
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.32)
    args = parser.parse_args()
    dataset = load_dataset("a9a", resolve_data_dir(args.data_dir))
    problem = LogisticRegression(dataset.X, dataset.y)
    partition = make_partition(dataset.y, 32, "shared", seed=0)
    simulator_rate(problem, partition, args.k, 10 * args.k, args.lr)  # compile the kernel before timing

    # Same rows, same lr: the two executors must agree before their speeds are worth comparing.
    _, ours = simulator_rate(problem, partition, args.k, args.naive_iterations, args.lr)
    naive, reference = naive_rate(problem, partition, args.k, args.naive_iterations, args.lr)
    err = float(np.max(np.abs(ours - reference)))
    fast, _ = simulator_rate(problem, partition, args.k, args.iterations, args.lr)

    print(f"a9a, 32 clients, batch 1, Local SGD k={args.k}; load average {os.getloadavg()[0]:.2f}")
    print(
        f"simulator: {fast:12,.0f} global iterations/s ({32 * fast:,.0f} client-steps/s) over {args.iterations:,} iterations"
    )
    print(f"naive loop: {naive:11,.0f} global iterations/s over {args.naive_iterations:,} iterations")
    print(
        f"ratio:      {fast / naive:11,.1f}x   (max |param difference| after {args.naive_iterations} iterations: {err:.2e})"
    )


if __name__ == "__main__":
    main()
