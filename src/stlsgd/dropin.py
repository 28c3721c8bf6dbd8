"""STL-SGD (or any plan) in an existing PyTorch training loop: three added lines.

::

    from stlsgd.dropin import PlanAverager                                   # 1
    stl = PlanAverager(model, optimizer, STLSGD(lr=0.05, T1=100, k1=2, gamma=1.0, name="stl_nc"))  # 2
    for step in range(steps):
        x, y = sample(stl.batch_size)           # the plan's per-client mini-batch size
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(); loss.backward()
        optimizer.step()
        stl.step()                                                          # 3

Each process is one client of Algorithm 1: it takes local steps with its own data, and at the end of each
round of the plan (``Round.period`` steps, growing stage by stage in Algorithms 2 and 3) every process's
model becomes the average over the process group. What is averaged is every floating parameter AND buffer
(BatchNorm running statistics, which ``torch.distributed``'s ``PeriodicModelAverager`` leaves out), in ONE
all-reduce of one flat buffer: the model's tensors are re-pointed at slices of that buffer once, so an
average costs no copy at all. The plan sets the learning rate of every step (``Round.learning_rates``),
and STL-SGD^nc's proximal term 1/(2 gamma) ||x - x_s||^2 (Algorithm 3; x_s the averaged model at the start
of the stage) is added to the gradients by a hook that runs before each ``optimizer.step()``.

:meth:`PlanAverager.state_dict` holds the position in the plan (round, step within the round) and the anchor
x_s; with the model's and the optimizer's own state dicts it resumes the loop exactly.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from stlsgd.algorithms.plan import Cursor, Plan, Round

TIMEOUT_ENV = "STLSGD_DIST_TIMEOUT"


class PlanAverager:
    """Applies ``plan`` to a user's ``model`` and ``optimizer``; call :meth:`step` after each ``optimizer.step()``.

    ``group``: the process group to average over (default: the default group). Started by ``torchrun`` with
    no group initialised yet, it initialises the default group itself (nccl with CUDA, else gloo; timeout
    ``$STLSGD_DIST_TIMEOUT`` seconds, default 30). Without any process group it runs as a single client
    (averaging is then the identity) so that the same script runs un-launched.

    Rank 0's parameters and buffers are broadcast at construction (``sync=True``), so processes need not be
    seeded alike. The optimizer's lr is set by the plan at every step, for every param group.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, plan: Plan, *,
                 group: dist.ProcessGroup | None = None, sync: bool = True) -> None:
        self.model = model
        self.optimizer = optimizer
        self.plan = plan
        self.group = group
        if group is None and not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            _init_from_env()
        self._pg: dist.ProcessGroup | None = group if group is not None else (
            dist.group.WORLD if dist.is_initialized() else None)
        self.world_size = self._pg.size() if self._pg is not None else 1
        self.rank = self._pg.rank() if self._pg is not None else 0
        self._flatten()
        if sync and self.world_size > 1:
            for flat in self._flats:
                dist.broadcast(flat, group_src=0, group=self.group)
        self._anchor: list[torch.Tensor] | None = None
        self._seek(Cursor(), 0)
        self._hook = optimizer.register_step_pre_hook(self._before_step)

    # ------------------------------------------------------------------ where we are in the plan

    @property
    def current_round(self) -> Round:
        """The round the next optimizer step belongs to."""
        return self._round

    @property
    def round_index(self) -> int:
        return self._round.index

    @property
    def step_in_round(self) -> int:
        return self._step

    @property
    def iteration(self) -> int:
        """Local steps taken so far (the paper's t)."""
        return self._round.start_iteration + self._step

    @property
    def stage(self) -> int:
        return self._round.stage

    @property
    def period(self) -> int:
        """The current stage's communication period k_s."""
        return self._round.period

    @property
    def batch_size(self) -> int:
        """The per-client (per-process) mini-batch size of the next step (grows in CR-PSGD's plan)."""
        return self._round.batch

    @property
    def lr(self) -> float:
        """The learning rate of the next step."""
        return float(self._lrs[self._step])

    # ------------------------------------------------------------------ the loop

    def step(self) -> bool:
        """Call once after every ``optimizer.step()``: advances the plan; True when this step ended a round
        and the model was averaged over the group."""
        self._step += 1
        if self._step < self._round.steps:
            self._set_lr()
            return False
        self.average()
        self._seek(self.plan.advance(self._cursor, self._round), 0)
        return True

    def average(self) -> None:
        """Every process's floating parameters and buffers become their mean over the group (one all-reduce
        per dtype and device; one in all for the usual all-float32 model)."""
        if self.world_size == 1:
            return
        if not self._views_intact():  # something replaced a tensor (model.to(), load_state_dict(assign=True))
            self._flatten()
        for flat in self._flats:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
            flat.div_(self.world_size)

    def models_in_sync(self, atol: float = 0.0) -> bool:
        """Whether every process holds rank 0's parameters and buffers (to ``atol``): a check for debugging."""
        if self.world_size == 1:
            return True
        gap = torch.zeros((), dtype=torch.float64, device=self._flats[0].device)
        for flat in self._flats:
            ref = flat.clone()
            dist.broadcast(ref, group_src=0, group=self.group)
            gap = torch.maximum(gap, (flat - ref).abs().max().double())
        dist.all_reduce(gap, op=dist.ReduceOp.MAX, group=self.group)
        return bool(gap <= atol)

    def close(self) -> None:
        """Remove the optimizer hook (lr and proximal term); the model keeps its (flat-backed) tensors."""
        self._hook.remove()

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Position in the plan and the proximal anchor; save it next to the model's and optimizer's."""
        return {
            "cursor": self._cursor.to_dict(),
            "step": self._step,
            "plan": {"name": type(self.plan).__name__, **self.plan.describe()},
            "anchor": None if self._anchor is None else [a.detach().clone() for a in self._anchor],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; the plan must be the one it was taken with."""
        plan = {"name": type(self.plan).__name__, **self.plan.describe()}
        if state.get("plan") != plan:
            raise ValueError(f"PlanAverager state was taken with plan {state.get('plan')}, not {plan}")
        anchor = state.get("anchor")
        if anchor is None:
            self._anchor = None
        else:
            if len(anchor) != len(self._params):
                raise ValueError(f"PlanAverager anchor holds {len(anchor)} tensors, the model has {len(self._params)}")
            self._anchor = [a.detach().to(p.device, p.dtype).clone() for a, p in zip(anchor, self._params)]
        self._seek(Cursor.from_dict(state["cursor"]), int(state["step"]), take_anchor=False)

    # ------------------------------------------------------------------ internals

    def _seek(self, cursor: Cursor, step: int, *, take_anchor: bool = True) -> None:
        self._cursor = cursor
        self._round = self.plan.next_round(cursor)
        if not 0 <= step < self._round.steps:
            raise ValueError(f"step {step} is outside round {cursor.index}, which has {self._round.steps} steps")
        self._step = step
        self._lrs = self._round.learning_rates()
        need_anchor = self._round.prox_gamma is not None and (self._round.new_anchor or self._anchor is None)
        if take_anchor and step == 0 and need_anchor:
            # x_s of Algorithm 3: the averaged model at the start of the stage (the average just happened).
            self._anchor = [p.detach().clone() for p in self._params]
        self._set_lr()

    def _set_lr(self) -> None:
        lr = self.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # The lr is set again here: optimizer.load_state_dict() restores the lr that was saved with it.
        self._set_lr()
        gamma = self._round.prox_gamma
        if gamma is None or self._anchor is None:
            return
        # Gradient of 1/(2 gamma) ||x - x_s||^2 is (x - x_s)/gamma: only parameters, never buffers.
        pairs = [(p, a) for p, a in zip(self._params, self._anchor) if p.grad is not None]
        if pairs:
            grads = [p.grad for p, _ in pairs]
            diffs = torch._foreach_sub([p.detach() for p, _ in pairs], [a for _, a in pairs])
            torch._foreach_add_(grads, diffs, alpha=1.0 / gamma)

    def _flatten(self) -> None:
        """Move every floating parameter and buffer into one flat buffer per (dtype, device), as views.

        Parameters come first, in ``named_parameters`` order, then buffers; the model's own objects stay (a
        parameter keeps its identity, so the optimizer's state still refers to it).
        """
        self._params = [p for p in self.model.parameters() if torch.is_floating_point(p)]
        slots: list[tuple[nn.Module | None, str | None, torch.Tensor]] = [(None, None, p) for p in self._params]
        for module in self.model.modules():
            for name, buf in module._buffers.items():
                if buf is not None and torch.is_floating_point(buf):
                    slots.append((module, name, buf))
        groups: dict[tuple[torch.dtype, torch.device], list[tuple[nn.Module | None, str | None, torch.Tensor]]] = {}
        for slot in slots:
            groups.setdefault((slot[2].dtype, slot[2].device), []).append(slot)
        self._flats: list[torch.Tensor] = []
        self._expected: list[tuple[nn.Module | None, str | None, torch.Tensor, int]] = []
        for (dtype, device), members in groups.items():
            sizes = [t.numel() for _, _, t in members]
            flat = torch.empty(sum(sizes), dtype=dtype, device=device)
            with torch.no_grad():
                for (module, name, tensor), piece in zip(members, flat.split(sizes)):
                    view = piece.view_as(tensor)
                    view.copy_(tensor)
                    if module is None:
                        tensor.data = view  # the Parameter object stays; only its storage moves
                    else:
                        module._buffers[name] = view  # type: ignore[index]
                    self._expected.append((module, name, tensor, view.data_ptr()))
            self._flats.append(flat)

    def _views_intact(self) -> bool:
        for module, name, tensor, ptr in self._expected:
            current = tensor if module is None else module._buffers.get(name)  # type: ignore[arg-type]
            if current is None or current.data_ptr() != ptr:
                return False
        return True


def _init_from_env() -> None:
    """The default group of a torchrun job: nccl on GPUs, gloo otherwise, a timeout so a dead peer is noticed."""
    text = os.environ.get(TIMEOUT_ENV, "30")
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"${TIMEOUT_ENV}: expected seconds, got {text!r}") from None
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl", timeout=timedelta(seconds=seconds),
                                device_id=torch.device("cuda", torch.cuda.current_device()))
    else:
        dist.init_process_group("gloo", timeout=timedelta(seconds=seconds))


__all__ = ["PlanAverager"]
