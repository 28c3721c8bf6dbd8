"""Run by test_lightning.py as ``python lightning_worker.py OUT``: Lightning's ddp strategy starts the second rank
by running this script again. Three fits under StlsgdCallback(STLSGD(T1=4, k1=1)), gradient accumulation 2:

1. 10 optimizer steps from scratch, a checkpoint every 5 steps (step 5: mid-round; step 10: a round boundary);
2. resumed from step 10, up to step 22 (ends mid-round: one more average at the end);
3. resumed from step 5 (mid-round), up to step 8.

Each rank writes OUT/rank<r>.json: per fit the rounds (with the model's parameters and buffers right after each
average), the per-step states, the averager's counters and DDP's gradient all-reduce count.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stlsgd.algorithms import STLSGD
from stlsgd.integrations.lightning import StlsgdCallback

GRAD_ALLREDUCES = [0]


def counting_hook(state, bucket):  # no annotations: DDP checks them
    GRAD_ALLREDUCES[0] += 1
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(int(os.environ.get("LOCAL_RANK", "0")))
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def snapshot(module: nn.Module) -> dict[str, list[float]]:
    return {k: v.detach().double().flatten().tolist() for k, v in module.state_dict().items()}


class Steps(Callback):
    """Each optimizer step's model state and whether it ended on a round boundary."""

    def __init__(self, stl: StlsgdCallback) -> None:
        self.stl, self.seen = stl, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.seen or self.seen[-1]["step"] != trainer.global_step:
            self.seen.append(
                {"step": trainer.global_step, "boundary": self.stl.averager.at_boundary, "state": snapshot(pl_module)}
            )


def fit(out: Path, max_steps: int, ckpt_path: Path | None, checkpoints: bool) -> dict:
    data = TensorDataset(
        torch.randn(512, 4, generator=torch.Generator().manual_seed(0)),
        torch.randint(0, 2, (512,), generator=torch.Generator().manual_seed(1)),
    )
    model = Net()
    rounds: list[dict] = []
    stl = StlsgdCallback(
        STLSGD(T1=4, k1=1.0),
        optimizer_state="average",
        on_round=lambda s: rounds.append(
            {"round": s.round, "stage": s.stage, "period": s.period, "steps": s.steps, "state": snapshot(model)}
        ),
    )
    steps = Steps(stl)
    callbacks = [stl, steps]
    if checkpoints:
        callbacks.append(ModelCheckpoint(dirpath=out / "ckpt", filename="{step}", every_n_train_steps=5, save_top_k=-1))
    trainer = pl.Trainer(
        strategy=DDPStrategy(ddp_comm_hook=counting_hook),
        devices=2,
        accelerator="cpu",
        max_steps=max_steps,
        accumulate_grad_batches=2,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=checkpoints,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    before = GRAD_ALLREDUCES[0]
    trainer.fit(model, DataLoader(data, batch_size=16), ckpt_path=ckpt_path)
    averager = stl.averager
    return {
        "rounds": rounds,
        "steps": steps.seen,
        "global_step": trainer.global_step,
        "iteration": averager.iteration,
        "averages": averager.stats.averages,
        "round": averager.stats.round,
        "stage": averager.stage,
        "period": averager.period,
        "in_sync": averager.models_in_sync(),
        "final": snapshot(model),
        "grad_allreduces": GRAD_ALLREDUCES[0] - before,
        "rank": trainer.global_rank,
    }


def main(out: Path) -> None:
    first = fit(out, 10, None, checkpoints=True)
    second = fit(out, 22, out / "ckpt" / "step=10.ckpt", checkpoints=False)
    third = fit(out, 8, out / "ckpt" / "step=5.ckpt", checkpoints=False)
    (out / f"rank{first['rank']}.json").write_text(json.dumps({"first": first, "second": second, "third": third}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    # The results are written: leave without interpreter finalisation, during which torch's gloo thread can
    # still release a finished collective and abort the process (a known torch teardown race, docs/distributed.md).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
