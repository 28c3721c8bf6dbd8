"""Any stlsgd plan in a Hugging Face Accelerate loop: the shape of ``accelerate.local_sgd.LocalSGD``.

::

    from stlsgd.algorithms import STLSGD
    from stlsgd.integrations.accelerate import StlsgdLocalSGD

    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    with StlsgdLocalSGD(accelerator, model, optimizer, STLSGD(T1=200, k1=2)) as local_sgd:
        for x, y in loader:
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()            # averages at the end of each round of the plan

Accelerate's own ``LocalSGD(accelerator, model, local_sgd_steps)`` averages the parameters every K calls of
``step()``; this one runs the rounds of any plan (STL-SGD's stagewise periods, LR-coupled, QSR, ...) through
:class:`stlsgd.dropin.PlanAverager`, which also averages the BatchNorm buffers (and, with
``optimizer_state="average"``, the optimizer's momentum), and switches DDP's per-step gradient all-reduce off while
the context is open (Accelerate's enters ``no_sync()``).

``step()`` counts one local step when the optimizer really stepped since the previous call, so it is right under
``accelerator.accumulate(model)`` (the optimizer steps once per accumulation cycle) and when a mixed-precision
scaler skips a step. Leaving the context in the middle of a round averages once more, as Accelerate's does, so
every process ends with the same model.

Works where Accelerate's LocalSGD works with plain data parallelism -- ``DistributedType.NO`` (one process: rounds
are counted, the plan's lr and proximal term apply, averaging is the identity), ``MULTI_CPU`` and ``MULTI_GPU``;
DeepSpeed, FSDP, XLA, Megatron-LM and the other types are refused with one line.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from stlsgd.algorithms.plan import Plan
from stlsgd.dropin import PlanAverager
from stlsgd.errors import StlsgdError
from stlsgd.executors import distributed
from stlsgd.integrations import missing

try:
    from accelerate import Accelerator, DistributedType
    from accelerate.optimizer import AcceleratedOptimizer
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise missing("accelerate", "accelerate", exc) from exc

SUPPORTED = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)


def check_distributed_type(kind: Any) -> None:
    """Refuse (one line) a distributed type other than NO, MULTI_CPU and MULTI_GPU, and NO inside a torchrun
    world of several processes (Accelerate then neither shards the loaders nor knows the other processes)."""
    if kind not in SUPPORTED:
        name = getattr(kind, "value", str(kind))
        raise StlsgdError(
            f"StlsgdLocalSGD: Accelerate's distributed type {name} is not supported; stlsgd averages "
            "whole replicated models: use NO, MULTI_CPU or MULTI_GPU (plain data parallel)"
        )
    world = int(os.environ.get("WORLD_SIZE", "1") or 1) if distributed.launched() else 1
    if kind == DistributedType.NO and world > 1:
        raise StlsgdError(
            f"StlsgdLocalSGD: torchrun started {world} processes but Accelerate runs each alone "
            "(DistributedType.NO: no GPU to put them on), so the loaders are not sharded; on a CPU-only "
            "machine use Accelerator(cpu=True)"
        )


class StlsgdLocalSGD:
    """Local SGD with the rounds of ``plan`` in an Accelerate loop; a context manager (see the module docstring).

    ``model`` and ``optimizer`` as returned by ``accelerator.prepare`` (a DDP model, an ``AcceleratedOptimizer``;
    plain ones work too). ``enabled=False`` turns it into a no-op, as Accelerate's. Keyword arguments go to
    :class:`~stlsgd.dropin.PlanAverager` (``plan_lr``, ``optimizer_state``, ``outer``, ``drift``, ``drift_window``, ``on_round``,
    ``log_every``, ``csv``, ...); the averager is :attr:`averager` (None when disabled).
    """

    def __init__(
        self,
        accelerator: Accelerator,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        plan: Plan,
        enabled: bool = True,
        **averager_options: Any,
    ) -> None:
        check_distributed_type(accelerator.distributed_type)
        self.enabled = enabled
        self.model = model
        self.num_steps = 0  # calls of step(), as Accelerate's LocalSGD counts them
        self.averager: PlanAverager | None = None
        self._stepped = 0
        self._hook = None
        self._grad_sync = getattr(model, "require_backward_grad_sync", None)
        if enabled:
            inner = optimizer.optimizer if isinstance(optimizer, AcceleratedOptimizer) else optimizer
            self.averager = PlanAverager(model, inner, plan, hook=False, **averager_options)
            self._hook = inner.register_step_post_hook(self._optimizer_stepped)

    def _optimizer_stepped(self, *_: Any) -> None:
        self._stepped += 1

    def __enter__(self) -> StlsgdLocalSGD:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.averager is None:
            return
        try:
            if exc_type is None and not self.averager.at_boundary:
                self.averager.average()  # mid-round: one more average, so every process leaves with one model
        finally:
            self.close()

    def close(self) -> None:
        """Remove the hooks and give DDP its gradient all-reduce back (``__exit__`` does this)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.averager is not None:
            self.averager.close()
        if self._grad_sync is not None:
            self.model.require_backward_grad_sync = self._grad_sync

    def step(self) -> bool:
        """Call after ``optimizer.step()``: counts the step if the optimizer took one, and averages the model over
        the processes when it ends a round of the plan (returns True then)."""
        self.num_steps += 1
        if self.averager is None or self._stepped == 0:
            return False
        if self._stepped > 1:
            raise StlsgdError(
                f"StlsgdLocalSGD.step: the optimizer stepped {self._stepped} times since the last "
                "call; call local_sgd.step() after every optimizer.step()"
            )
        self._stepped = 0
        return self.averager.after_step()

    # the averager's position, for checkpoints (save per rank with the model's and optimizer's state)
    def state_dict(self) -> dict[str, Any]:
        return {} if self.averager is None else self.averager.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.averager is not None and state:
            self.averager.load_state_dict(state)


__all__ = ["SUPPORTED", "StlsgdLocalSGD", "check_distributed_type"]
