"""STL-SGD in a Lightning fit: Trainer(strategy="ddp") plus one callback (# STL lines); checkpoints resume the
stage and the period.

Each DDP process is one client: DDP's per-step gradient all-reduce is off, and at the end of each round of
STL-SGD^sc every process's parameters and BatchNorm statistics become their average.

    python examples/lightning_mnist.py --devices 2                       # Lightning starts the 2nd process
    python examples/lightning_mnist.py --devices 2 --steps 450 --resume runs/lightning-mnist/last.ckpt

Needs ``pip install 'stlsgd[lightning]'``.
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from mnist_common import DEFAULT_DATA, SmallCNN, accuracy, load_images
from torch.utils.data import DataLoader, TensorDataset

from stlsgd.algorithms import STLSGD
from stlsgd.integrations.lightning import StlsgdCallback  # STL (1 of 2)


class Classifier(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = SmallCNN()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=DEFAULT_DATA, help="folder holding mnist/ (else synthetic data)")
    parser.add_argument("--train-size", type=int, default=12000)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--T1", type=int, default=100, help="first stage length in optimizer steps")
    parser.add_argument("--k1", type=float, default=4, help="first stage period")
    parser.add_argument("--lr", type=float, default=0.05, help="eta_1 (halved each stage)")
    parser.add_argument("--steps", type=int, default=300, help="max_steps of the fit")
    parser.add_argument("--out", default="runs/lightning-mnist", help="checkpoints go here (last.ckpt)")
    parser.add_argument("--resume", default=None, help="a checkpoint to continue from")
    args = parser.parse_args()

    torch.set_num_threads(1)
    X, y, source = load_images(args.data_dir, args.train_size)
    n_eval = min(2000, len(y) // 5)
    torch.manual_seed(0)
    module = Classifier(args.lr)
    # STL (2 of 2): STL-SGD^sc's rounds and learning rates; one log line per 10 rounds.
    stl = StlsgdCallback(STLSGD(lr=args.lr, T1=args.T1, k1=args.k1), plan_lr=True, log_every=10)
    trainer = pl.Trainer(
        strategy="ddp" if args.devices > 1 else "auto",
        devices=args.devices,
        accelerator="cpu",
        max_steps=args.steps,
        logger=False,
        enable_model_summary=False,
        callbacks=[stl, ModelCheckpoint(dirpath=args.out, save_last=True, every_n_train_steps=100)],
    )
    loader = DataLoader(TensorDataset(X[n_eval:], y[n_eval:]), batch_size=32, shuffle=True)
    trainer.fit(module, loader, ckpt_path=args.resume)
    averager = stl.averager
    in_sync = averager.models_in_sync()
    acc = accuracy(module.net, X[:n_eval], y[:n_eval])
    if trainer.is_global_zero:
        stats = averager.stats
        print(
            f"{source}: {trainer.world_size} processes, {averager.iteration} steps, stage {averager.stage}, period "
            f"{averager.period}, {stats.averages} averages ({100 * stats.saved:.0f}% of per-step DDP's traffic "
            f"saved), held-out accuracy {acc:.3f}, models identical on all processes: {in_sync}"
        )


if __name__ == "__main__":
    main()
