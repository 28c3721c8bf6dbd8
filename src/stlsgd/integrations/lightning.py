"""Any stlsgd plan in a Lightning ``Trainer(strategy="ddp")`` run: one callback.

::

    from lightning.pytorch import Trainer
    from stlsgd.algorithms import STLSGD
    from stlsgd.integrations.lightning import StlsgdCallback

    trainer = Trainer(strategy="ddp", devices=2, accelerator="cpu", max_steps=1000,
                      callbacks=[StlsgdCallback(STLSGD(T1=200, k1=2))])
    trainer.fit(model, loader)                      # resume: trainer.fit(model, loader, ckpt_path=...)

Each DDP process is one client. At the start of the fit the callback puts a :class:`stlsgd.dropin.PlanAverager`
on the DDP-wrapped module and the optimizer, which

- switches DDP's per-step gradient all-reduce off (``require_backward_grad_sync = False``; with automatic
  optimization Lightning only touches it through ``no_sync()`` while accumulating gradients, which restores the
  value it found, so it stays off);
- counts the optimizer's steps (one per ``accumulate_grad_batches`` batches) and, at the end of each round of the
  plan, averages the parameters and the floating buffers (BatchNorm statistics), and the optimizer's momentum as
  ``optimizer_state`` says;
- averages once more when the fit ends in the middle of a round (``sync_at_end``), so every process, and the
  model rank 0 saves, is the average.

The plan's position (round, step in the round, stage, period, counters) is the callback's ``state_dict``, stored in
Lightning's checkpoints: ``trainer.fit(..., ckpt_path=...)`` continues the stage and the period. Lightning saves
rank 0's model and state; a checkpoint taken at a round boundary (``ModelCheckpoint(every_n_train_steps=...)`` at a
multiple of the rounds' steps, or the end of a fit, after its last average) resumes exactly when every process holds
the same optimizer state there (``optimizer_state="average"`` or ``"reset"``, or an optimizer without momentum).
Otherwise -- a checkpoint from the middle of a round, or per-process momentum (``"keep"``) -- every process continues
from rank 0's model and optimizer state, and rank 0 says so in one line.

Supported: ``strategy="ddp"`` and single-device runs (rounds counted, averaging is the identity), automatic
optimization with one optimizer (``ddp_spawn``/``ddp_fork`` wrap the module in the same DDP; untested here).
Refused with one line: FSDP, DeepSpeed, XLA, model parallel, manual optimization (Lightning switches DDP's
all-reduce back on after every ``training_step`` there). STL-SGD^nc's proximal term works as in a plain loop:
Lightning runs backward inside ``optimizer.step(closure)``, and the drop-in adds the proximal gradient after the
closure's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from stlsgd.algorithms.plan import Plan
from stlsgd.dropin import PlanAverager, RoundStats
from stlsgd.errors import StlsgdError
from stlsgd.integrations import missing

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise missing("lightning", "lightning", exc) from exc


class StlsgdCallback(Callback):
    """Runs ``plan`` in the fit (see the module docstring). Keyword arguments go to
    :class:`~stlsgd.dropin.PlanAverager` (``plan_lr``, ``optimizer_state``, ``outer``, ``drift``, ``drift_window``, ``log_every``,
    ``csv``);
    ``on_round`` is called on every process after each round's average with its :class:`~stlsgd.dropin.RoundStats`.
    The averager of the current fit is :attr:`averager`."""

    def __init__(
        self,
        plan: Plan,
        *,
        sync_at_end: bool = True,
        on_round: Callable[[RoundStats], None] | None = None,
        **averager_options: Any,
    ) -> None:
        self.plan = plan
        self.sync_at_end = sync_at_end
        self.on_round = on_round
        self.options = averager_options
        self.averager: PlanAverager | None = None
        self._saved: dict[str, Any] | None = None  # a checkpoint's state, until the averager exists

    @property
    def state_key(self) -> str:
        return self._generate_state_key(plan=type(self.plan).__name__)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        strategy = trainer.strategy
        name = type(strategy).__name__
        ddp = isinstance(strategy, DDPStrategy) and isinstance(strategy.model, DistributedDataParallel)
        single = isinstance(strategy, SingleDeviceStrategy) and "XLA" not in name
        if not (ddp or single):
            raise StlsgdError(
                f"StlsgdCallback: the {name} strategy is not supported; stlsgd averages whole "
                "replicated models: use strategy='ddp' (or a single device)"
            )
        if not pl_module.automatic_optimization:
            raise StlsgdError(
                "StlsgdCallback: manual optimization is not supported (Lightning's DDP switches the "
                "gradient all-reduce back on after every training_step); use automatic optimization"
            )
        if len(trainer.optimizers) != 1:
            raise StlsgdError(
                f"StlsgdCallback: needs exactly one optimizer, the module configures {len(trainer.optimizers)}"
            )
        if strategy.model is None:
            raise StlsgdError("StlsgdCallback: the strategy holds no model at the start of the fit")
        self.averager = PlanAverager(
            strategy.model, trainer.optimizers[0], self.plan, on_round=self.on_round, **self.options
        )
        if self._saved is not None:
            self.averager.load_state_dict(self._adopt(self._saved))
            self._saved = None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.sync_at_end and self.averager is not None and not self.averager.at_boundary:
            self.averager.average()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.averager is not None:
            self.averager.close()  # the position stays readable: state_dict() after the fit still works

    def state_dict(self) -> dict[str, Any]:
        if self.averager is not None:
            return self.averager.state_dict()
        return dict(self._saved) if self._saved is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Called before the strategy wraps the model and builds the optimizer: applied in on_fit_start.
        self._saved = dict(state_dict) if state_dict else None

    def _adopt(self, state: dict[str, Any]) -> dict[str, Any]:
        """Lightning saves rank 0's state and every rank loads it. At a round boundary every process held the same
        model, so it is every rank's; in the middle of a round the others' local models are not in the
        checkpoint: each rank continues the round from rank 0's (loaded by Lightning), said once on stderr."""
        assert self.averager is not None
        rank, world = self.averager.rank, self.averager.world_size
        step = int(state.get("step") or 0)
        reasons = (
            (["the middle of a round"] if step else [])
            + (
                ["optimizer_state='keep': the other ranks' momentum is not in the checkpoint"]
                if self.averager.optimizer_state == "keep"
                else []
            )
            + (
                ["drift=True: the other ranks' control variates are not in the checkpoint"]
                if self.averager.drift
                else []
            )
        )
        if rank == 0 and reasons and max(world, int(state.get("world_size", 1))) > 1:
            print(
                f"stlsgd: resuming from rank {state.get('rank')}'s checkpoint taken at step {step} of round "
                f"{state['cursor']['index'] + 1}: every process continues from that rank's model and optimizer "
                f"state ({'; '.join(reasons)}; not exact: checkpoint at round boundaries with "
                "optimizer_state='average' for an exact resume)",
                file=sys.stderr,
                flush=True,
            )
        if (state.get("rank"), state.get("world_size")) == (rank, world):
            return state
        return {**state, "rank": rank, "world_size": world}


__all__ = ["StlsgdCallback"]
