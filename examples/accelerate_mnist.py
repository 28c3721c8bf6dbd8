"""STL-SGD in a Hugging Face Accelerate loop: Accelerate's LocalSGD context, with any stlsgd plan (# STL lines).

Each process is one client: it takes local steps on its shard of MNIST; at the end of each round of STL-SGD^sc
(the period doubles and the lr halves each stage) every process's parameters and BatchNorm statistics become
their average (momentum stays each process's own: the drop-in's optimizer_state default).

    torchrun --nproc_per_node=2 examples/accelerate_mnist.py                  # 2 CPU processes (MULTI_CPU)
    torchrun --nproc_per_node=2 examples/accelerate_mnist.py --tensorboard runs/tb-accelerate
    python examples/accelerate_mnist.py                                       # one process (NO)

(``accelerate launch`` works as well with an ``accelerate config`` of distributed type MULTI_CPU or MULTI_GPU.)

Needs ``pip install 'stlsgd[accelerate]'`` (and ``[tensorboard]`` for ``--tensorboard``).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from mnist_common import DEFAULT_DATA, SmallCNN, accuracy, load_images
from torch.utils.data import DataLoader, TensorDataset

from stlsgd.algorithms import STLSGD
from stlsgd.integrations.accelerate import StlsgdLocalSGD  # STL (1 of 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=DEFAULT_DATA, help="folder holding mnist/ (else synthetic data)")
    parser.add_argument("--train-size", type=int, default=12000)
    parser.add_argument("--T1", type=int, default=100, help="first stage length in optimizer steps")
    parser.add_argument("--k1", type=float, default=4, help="first stage period")
    parser.add_argument("--lr", type=float, default=0.05, help="eta_1 (halved each stage)")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (T1 + 2 T1 = two stages)")
    parser.add_argument("--tensorboard", default=None, help="write per-round scalars to this directory")
    args = parser.parse_args()

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    X, y, source = load_images(args.data_dir, args.train_size)
    n_eval = min(2000, len(y) // 5)
    loader = DataLoader(
        TensorDataset(X[n_eval:], y[n_eval:]), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # a shard of the data per process

    on_round = None
    if args.tensorboard:
        from stlsgd.integrations.tensorboard import RoundWriter

        on_round = RoundWriter(args.tensorboard)
    plan = STLSGD(lr=args.lr, T1=args.T1, k1=args.k1)
    started = time.perf_counter()
    step = 0
    # STL (2 of 3): the plan's rounds and learning rates; one log line per 10 rounds.
    with StlsgdLocalSGD(
        accelerator, model, optimizer, plan, plan_lr=True, log_every=10, on_round=on_round
    ) as local_sgd:
        while step < args.steps:
            model.train()
            for xb, yb in loader:
                loss = F.cross_entropy(model(xb), yb)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                local_sgd.step()  # STL (3 of 3): averages at the end of each round
                step += 1
                if on_round is not None:
                    on_round.report(loss=loss.item())
                if step >= args.steps:
                    break
    # leaving the context averaged once more if the last round was cut short: every process holds one model
    averager = local_sgd.averager
    in_sync = averager.models_in_sync()
    acc = accuracy(accelerator.unwrap_model(model), X[:n_eval], y[:n_eval])
    if on_round is not None:
        on_round.close()
    if accelerator.is_main_process:
        stats = averager.stats
        print(
            f"{source}: {accelerator.num_processes} processes ({accelerator.distributed_type.value}), "
            f"{averager.iteration} steps in {time.perf_counter() - started:.1f} s, stage {averager.stage}, "
            f"period {averager.period}, {stats.averages} averages ({100 * stats.saved:.0f}% of per-step DDP's "
            f"traffic saved), held-out accuracy {acc:.3f}, models identical on all processes: {in_sync}"
        )


if __name__ == "__main__":
    main()
