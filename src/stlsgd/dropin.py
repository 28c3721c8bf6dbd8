"""Local SGD with any stlsgd plan in your own PyTorch training loop: two added lines.

::

    from stlsgd.dropin import PlanAverager                                # 1
    from stlsgd.algorithms import LRCoupled
    averager = PlanAverager(model, optimizer, LRCoupled(k1=4))            # 2: hooks optimizer.step()
    for x, y in loader:                                                   # your loop, unchanged: your
        loss = F.cross_entropy(model(x), y)                               # optimizer, LR scheduler, AMP,
        optimizer.zero_grad(); loss.backward(); optimizer.step()          # accumulation and checkpoints
        scheduler.step()

Each process is one client of Algorithm 1: it takes local steps on its own data, and at the end of each round
of the plan every process's model becomes the average over the process group. The averager counts the
optimizer's steps through a post-step hook (a step that AMP's GradScaler skips is not counted; with gradient
accumulation one optimizer step is one step), and at the end of a round averages every floating parameter AND
buffer (BatchNorm statistics) in one all-reduce of one flat buffer (the model's tensors are re-pointed at
slices of it once, so an average copies nothing).

What it leaves to you, and what it does:

- **The learning rate is yours.** The plan decides *when* to average; it never writes ``param_group["lr"]``
  unless ``plan_lr=True`` (the paper's Algorithms 2 and 3, where the plan owns eta: logged once when on).
  Plans that adapt the period to the learning rate (:class:`~stlsgd.algorithms.LRCoupled`,
  :class:`~stlsgd.algorithms.QSR`) read the lr your optimizer will use for the round's first step.
- **Optimizer state** shaped like a parameter (SGD's momentum, Adam's moments) is each process's own by
  default (``optimizer_state="keep"``, as torch's PeriodicModelAverager and Accelerate leave it); ``"average"``
  sends it with the model (twice the bytes), so that after an average every process holds the same model AND
  momentum and rank 0's checkpoint at a round boundary resumes exactly; ``"reset"`` zeroes it. Measured on the
  MNIST benchmark (docs/distributed.md): keep and average reach the same accuracy within seed noise, reset
  loses about 0.6 points.
- **DDP**: give it the DDP-wrapped model; its gradient all-reduce is switched off (``require_backward_grad_sync``,
  what ``no_sync()`` sets), so the only collectives are the averages.
- **How to average**: the mean, or with ``outer=OuterNesterov(lr=0.7, momentum=0.9)`` DiLoCo's outer Nesterov
  step on the averaged update (:class:`~stlsgd.executors.averaging.OuterNesterov`), with any plan.
- **STL-SGD^nc's proximal term** 1/(2 gamma) ||x - x_s||^2 (a plan with ``gamma``; x_s the model at the start
  of the stage) is added to the gradients by a pre-step hook.
- **Checkpoints**: :meth:`PlanAverager.state_dict` holds the plan's cursor, the step in the round, the anchor,
  the counters and who saved it. Save it per rank with your model and optimizer; restoring in any order
  (before or after constructing) is exact. A checkpoint that cannot resume exactly (rank 0's, loaded on another
  rank mid-round, or at a round boundary while per-rank momentum is kept) is refused with a one-line error.
- **Observability**: :attr:`PlanAverager.stats` (rounds, averages, bytes sent, bytes a per-step DDP would have
  sent, compute and communication time); ``on_round`` callbacks, ``log_every=N`` (one line per N rounds)
  and ``csv=PATH`` (one row per round).

Without a process group (one process, not launched by torchrun) it runs as a single client: rounds are counted
and logged, and averaging is the identity.
"""

from __future__ import annotations

import csv as csv_module
import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from stlsgd.algorithms.plan import Cursor, Feedback, Plan, Round
from stlsgd.errors import StlsgdError
from stlsgd.executors import distributed
from stlsgd.executors.averaging import OuterNesterov

OptimizerState = Literal["average", "keep", "reset"]
STATE_FORMAT = "stlsgd-dropin"
STATE_VERSION = 2


@dataclass
class RoundStats:
    """What the averager has done so far, as of the end of a round (all counts per process)."""

    round: int = 0
    stage: int = 1
    period: int = 1
    steps: int = 0
    lr: float | None = None
    averages: int = 0
    #: The last loss fed to :meth:`PlanAverager.report_loss` (None: none yet).
    objective: float | None = None
    bytes_sent: int = 0
    ddp_bytes: int = 0
    compute_s: float = 0.0
    comm_s: float = 0.0

    @property
    def saved(self) -> float:
        """Fraction of a per-step DDP's gradient traffic not sent (0 before any step)."""
        return 1.0 - self.bytes_sent / self.ddp_bytes if self.ddp_bytes else 0.0

    def line(self) -> str:
        lr = "-" if self.lr is None else f"{self.lr:.4g}"
        return (
            f"stlsgd round {self.round}: stage {self.stage}, period {self.period}, lr {lr}, {self.steps} steps, "
            f"{self.averages} averages, {self.bytes_sent / 2**20:.1f} MiB sent vs {self.ddp_bytes / 2**20:.1f} "
            f"MiB for per-step DDP ({100 * self.saved:.1f}% saved), compute {self.compute_s:.1f} s, "
            f"communication {self.comm_s:.1f} s"
        )


FIELDS = [f.name for f in dataclasses.fields(RoundStats)] + ["saved"]


class PlanAverager:
    """Runs ``plan`` in the loop of ``model`` and ``optimizer``; see the module docstring.

    ``group``: the process group to average over (default: the default group, which is initialised from
    torchrun's environment when it does not exist yet). ``hook=False`` leaves the counting to explicit
    :meth:`after_step` calls (the adapters use it).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        plan: Plan,
        *,
        group: dist.ProcessGroup | None = None,
        plan_lr: bool = False,
        optimizer_state: OptimizerState = "keep",
        lr_group: int = 0,
        outer: OuterNesterov | None = None,
        on_round: Callable[[RoundStats], None] | None = None,
        log_every: int | None = None,
        csv: str | Path | None = None,
        hook: bool = True,
    ) -> None:
        self.module = _unwrap(model)
        self.optimizer = optimizer
        self.plan = plan
        if optimizer_state not in ("average", "keep", "reset"):
            raise StlsgdError(f"optimizer_state: must be 'average', 'keep' or 'reset', got {optimizer_state!r}")
        if not 0 <= lr_group < len(optimizer.param_groups):
            raise StlsgdError(f"lr_group: the optimizer has {len(optimizer.param_groups)} param groups, got {lr_group}")
        if log_every is not None and log_every < 1:
            raise StlsgdError(f"log_every: must be >= 1 round, got {log_every}")
        self.plan_lr, self.optimizer_state, self.lr_group, self.outer = plan_lr, optimizer_state, lr_group, outer
        # Only the caller's own group is kept: holding the default group's object past the user's
        # destroy_process_group leaves its destructor to the interpreter's exit (an abort under torchrun);
        # None means "the default group", looked up at each collective.
        self.group = group
        self.world_size, self.rank = 1, 0
        if group is not None or dist.is_initialized() or distributed.launched():
            job = distributed.join(group=group, timed_group=False)
            self.world_size, self.rank = job.world, job.rank
        if model is not self.module:  # DDP: its gradient all-reduce would undo the point of local steps
            model.require_backward_grad_sync = False
            self._say(
                "DDP's per-step gradient all-reduce is switched off: the model is averaged at the end of "
                "each round of the plan instead"
            )
        self._flatten()
        if not self._params:
            raise StlsgdError("model: has no floating-point parameters to average")
        self._callbacks = [on_round] if on_round is not None else []
        if log_every is not None:
            self._callbacks.append(lambda s: s.round % log_every == 0 and self._say(s.line()))
        if csv is not None:
            self._callbacks.append(_CsvLog(Path(csv)).write if self.rank == 0 else (lambda s: None))
        self.stats = RoundStats()
        self._anchor: list[torch.Tensor] | None = None
        self._start_params: list[torch.Tensor] | None = None  # the model at the round's start (outer step)
        self._outer_momentum: list[torch.Tensor] | None = None
        self._objective: float | None = None
        self._restored = False
        self._started = False
        self._mark = time.perf_counter()
        self._cursor = Cursor()
        self._step = 0
        # The next round is settled at its first step (the pre-step hook), after the user's LR scheduler has
        # set that step's lr, which plans coupled to the lr read; None until then.
        self._round: Round | None = None
        self._feedback = Feedback()
        self._hooks = [optimizer.register_step_pre_hook(self._before_step)]
        if hook:
            self._hooks.append(optimizer.register_step_post_hook(lambda opt, args, kwargs: self.after_step()))
        if plan_lr:
            if plan.next_round(Cursor()).lrs is None:
                raise StlsgdError(
                    "plan_lr: the plan has no learning rate of its own; give it lr=... or leave plan_lr off"
                )
            self._say(
                "the plan sets the learning rate of every step (plan_lr=True): the optimizer's lr and any "
                "LR scheduler are overridden"
            )

    # ------------------------------------------------------------------ where the loop stands

    @property
    def current_round(self) -> Round:
        """The round the next optimizer step belongs to (as it would start now, before its first step)."""
        return self._round if self._round is not None else self.plan.next_round(self._cursor, self._feedback_now())

    @property
    def round_index(self) -> int:
        return self._cursor.index

    @property
    def step_in_round(self) -> int:
        return self._step

    @property
    def at_boundary(self) -> bool:
        """Right after an average (or before the first step): every process holds the same model."""
        return self._step == 0

    @property
    def iteration(self) -> int:
        """Optimizer steps taken so far (the paper's t)."""
        return self._cursor.iteration + self._step

    @property
    def stage(self) -> int:
        return self.current_round.stage

    @property
    def period(self) -> int:
        """The current round's communication period."""
        return self.current_round.period

    @property
    def batch_size(self) -> int:
        """The per-process mini-batch size of the plan's next step (grows in CR-PSGD's plan)."""
        return self.current_round.batch

    @property
    def lr(self) -> float:
        """The learning rate of the next step: the plan's with ``plan_lr``, else the optimizer's."""
        if self.plan_lr:
            return float(self.current_round.learning_rates()[self._step])
        return float(self.optimizer.param_groups[self.lr_group]["lr"])

    def report_loss(self, loss: float | torch.Tensor) -> None:
        """Feed the training loss to a plan that adapts to it (AdaComm); read at the next round's start."""
        self._objective = float(loss)

    # ------------------------------------------------------------------ the loop

    def after_step(self) -> bool:
        """Count one optimizer step (the post-step hook calls this); True when it ended a round and the model
        was averaged over the group."""
        if self._round is None:  # hook=False: the adapters count steps without the pre-step hook's call
            self._begin_round()
        self._step += 1
        if self._step < self._round.steps:
            return False
        self.average()
        self._record_round()
        self._cursor = self.plan.advance(self._cursor, self._round, self._feedback)
        self._step = 0
        self._round = None
        return True

    def average(self) -> None:
        """Every process's floating parameters and buffers become their mean over the group (one all-reduce
        per dtype and device), and the optimizer's momentum-like state follows ``optimizer_state``."""
        started = time.perf_counter()
        self.stats.compute_s += started - self._mark
        if self.world_size > 1:
            if not self._views_intact():  # something replaced a tensor (model.to(), load_state_dict(assign=True))
                self._flatten()
            moments = self._moments() if self.optimizer_state == "average" else []
            for tensors in self._payloads(moments):
                # Optimizer state rides in the same all-reduce as the model of its dtype and device (copied in
                # and out: optimizers may re-create their state tensors at any step); a model alone is reduced
                # in place.
                buffer = torch.cat([t.reshape(-1) for t in tensors]) if len(tensors) > 1 else tensors[0]
                dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=self.group)
                buffer.div_(self.world_size)
                if len(tensors) > 1:
                    for t, piece in zip(tensors, buffer.split([t.numel() for t in tensors])):
                        t.copy_(piece.view_as(t))
                self.stats.bytes_sent += buffer.numel() * buffer.element_size()
            self.stats.averages += 1
            if self._flats[0].is_cuda:
                torch.cuda.synchronize(self._flats[0].device)
        if self.outer is not None and self._start_params is not None:
            with torch.no_grad():
                if self._outer_momentum is None:
                    self._outer_momentum = [torch.zeros_like(p) for p in self._params]
                for start, p, m in zip(self._start_params, self._params, self._outer_momentum):
                    self.outer.step(start, p.data, m)
        if self.optimizer_state == "reset":
            for t in self._moments():
                t.zero_()
        self._mark = time.perf_counter()
        self.stats.comm_s += self._mark - started

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
        """Remove the optimizer hooks; the model keeps its (flat-backed) tensors."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __enter__(self) -> PlanAverager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything the plan and the averager need; save it per rank next to the model's and optimizer's."""
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "plan": self._plan_identity(),
            "cursor": self._cursor.to_dict(),
            "step": self._step,
            "feedback": dataclasses.asdict(self._feedback),  # what settled the current round
            "objective": self._objective,
            "anchor": _copies(self._anchor),
            "start": _copies(self._start_params) if self._step else None,
            "outer_momentum": _copies(self._outer_momentum),
            "stats": dataclasses.asdict(self.stats),
            "rank": self.rank,
            "world_size": self.world_size,
            "optimizer_state": self.optimizer_state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; load it before the first optimizer step.

        Refused (one line) when the resume could not be exact: another plan; rank 0's state on another rank in
        the middle of a round (the other ranks' local models are not in it); or, with ``optimizer_state="keep"``,
        another rank's state at all (per-rank momentum differs even right after an average).
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise StlsgdError("PlanAverager.load_state_dict: not a PlanAverager state (or one of an older stlsgd)")
        if state["plan"] != self._plan_identity():
            raise StlsgdError(
                f"PlanAverager.load_state_dict: the state was taken with plan {state['plan']}, "
                f"not {self._plan_identity()}"
            )
        foreign = state["rank"] != self.rank or state["world_size"] != self.world_size
        if foreign and state["step"] != 0:
            raise StlsgdError(
                f"PlanAverager.load_state_dict: saved by rank {state['rank']} of {state['world_size']} at step "
                f"{state['step']} of a round; the other ranks' local models are not in it, so this restore cannot "
                "be exact: save per-rank checkpoints, or save when averager.at_boundary (docs/distributed.md)"
            )
        if foreign and self.optimizer_state == "keep" and self._moments():
            raise StlsgdError(
                f"PlanAverager.load_state_dict: saved by rank {state['rank']}, and with optimizer_state='keep' each "
                "rank's momentum differs: save per-rank checkpoints, or use optimizer_state='average'"
            )
        self._anchor = self._like_params(state["anchor"], "anchor")
        self._start_params = self._like_params(state["start"], "start")
        self._outer_momentum = self._like_params(state["outer_momentum"], "outer_momentum")
        self._cursor = Cursor.from_dict(state["cursor"])
        self._objective = state["objective"]
        self.stats = RoundStats(**state["stats"])
        self._step = int(state["step"])
        self._round = None
        if self._step:  # mid-round: the round as it was settled at its start
            self._feedback = Feedback(**state["feedback"])
            self._round = self.plan.next_round(self._cursor, self._feedback)
            if self._step >= self._round.steps:
                raise StlsgdError(
                    f"PlanAverager.load_state_dict: step {self._step} is outside round "
                    f"{self._cursor.index}, which has {self._round.steps} steps"
                )
        self._restored = True

    # ------------------------------------------------------------------ internals

    def _like_params(self, tensors: list[torch.Tensor] | None, what: str) -> list[torch.Tensor] | None:
        if tensors is None:
            return None
        if len(tensors) != len(self._params):
            raise StlsgdError(
                f"PlanAverager.load_state_dict: {what} holds {len(tensors)} tensors, the model has {len(self._params)}"
            )
        return [t.detach().to(p.device, p.dtype).clone() for t, p in zip(tensors, self._params)]

    def _plan_identity(self) -> dict[str, Any]:
        return {"name": type(self.plan).__name__, **self.plan.describe()}

    def _feedback_now(self) -> Feedback:
        lr = None if self.plan_lr else float(self.optimizer.param_groups[self.lr_group]["lr"])
        return Feedback(objective=self._objective, lr=lr)

    def _begin_round(self) -> None:
        """Settle the round that starts with the coming step, from the lr that step will use."""
        self._feedback = self._feedback_now()
        rnd = self.plan.next_round(self._cursor, self._feedback)
        if rnd.prox_gamma is not None and (rnd.new_anchor or self._anchor is None):
            # x_s of Algorithm 3: the averaged model at the start of the stage (the average just happened).
            self._anchor = _copies(self._params)
        if self.outer is not None:
            self._start_params = _copies(self._params)
        self._round = rnd

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        if not self._started:
            self._start()
        if self._round is None:
            self._begin_round()
        if self.plan_lr:
            lr = self.lr
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        gamma = self._round.prox_gamma
        if gamma is None or self._anchor is None:
            return None
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args[0] is the optimizer
        if closure is None:
            self._add_proximal(gamma)
            return None

        # step(closure) computes the gradients itself (Lightning's automatic optimization, LBFGS): the proximal
        # gradient goes on top of what each call of the closure leaves.
        def with_proximal() -> Any:
            loss = closure()
            self._add_proximal(gamma)
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": with_proximal}
        return (args[0], with_proximal, *args[2:]), kwargs

    def _add_proximal(self, gamma: float) -> None:
        """Gradient of 1/(2 gamma) ||x - x_s||^2 is (x - x_s)/gamma: only parameters, never buffers."""
        pairs = [(p, a) for p, a in zip(self._params, self._anchor) if p.grad is not None]
        if pairs:
            grads = [p.grad for p, _ in pairs]
            diffs = torch._foreach_sub([p.detach() for p, _ in pairs], [a for _, a in pairs])
            torch._foreach_add_(grads, diffs, alpha=1.0 / gamma)

    def _start(self) -> None:
        """Before the first step: processes need not be seeded alike, so a fresh run starts from rank 0's model.

        A restored run starts from its own (per-rank) state; an optimizer that already holds state while the
        averager's was not restored means a checkpoint was half loaded: refused rather than overwritten."""
        self._started = True
        self._mark = time.perf_counter()
        if self._restored or self.world_size == 1:
            return
        if self._moments() or self.iteration:
            raise StlsgdError(
                "PlanAverager: the optimizer holds state from a checkpoint but the averager's state "
                "was not restored; call averager.load_state_dict(saved) before the first step"
            )
        for flat in self._flats:
            dist.broadcast(flat, group_src=0, group=self.group)

    def _record_round(self) -> None:
        s = self.stats
        r = self._round
        s.round, s.stage, s.period, s.steps = r.index + 1, r.stage, r.period, r.end_iteration
        s.lr = (
            float(r.learning_rates()[-1]) if self.plan_lr else float(self.optimizer.param_groups[self.lr_group]["lr"])
        )
        s.objective = self._objective
        s.ddp_bytes = s.steps * sum(p.numel() * p.element_size() for p in self._params)
        for callback in self._callbacks:
            callback(s)

    def _payloads(self, riders: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """The tensors of each all-reduce: a flat model buffer and the optimizer state of its dtype and device."""
        groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {
            (f.dtype, f.device): [f] for f in self._flats
        }
        for t in riders:
            groups.setdefault((t.dtype, t.device), []).append(t)
        return list(groups.values())

    def _moments(self) -> list[torch.Tensor]:
        """The optimizer's state tensors shaped like their parameters (momentum, Adam's moments)."""
        out = []
        for p in self._params:
            for value in self.optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor) and value.shape == p.shape and torch.is_floating_point(value):
                    out.append(value)
        return out

    def _say(self, text: str) -> None:
        if self.rank == 0:
            print(text, file=sys.stderr, flush=True)

    def _flatten(self) -> None:
        """Move every floating parameter and buffer into one flat buffer per (dtype, device), as views.

        Parameters come first, in ``named_parameters`` order, then buffers; the model's own objects stay (a
        parameter keeps its identity, so the optimizer's state still refers to it).
        """
        self._params = [p for p in self.module.parameters() if torch.is_floating_point(p)]
        slots: list[tuple[nn.Module | None, str | None, torch.Tensor]] = [(None, None, p) for p in self._params]
        for module in self.module.modules():
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


def _copies(tensors: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
    return None if tensors is None else [t.detach().clone() for t in tensors]


def _unwrap(model: nn.Module) -> nn.Module:
    """The module to average: a DDP wrapper's module; FSDP (sharded parameters) is not supported."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return model.module
    if type(model).__name__ in ("FullyShardedDataParallel", "FSDPModule") or hasattr(model, "_fsdp_wrapped_module"):
        raise StlsgdError("model: FSDP shards the parameters; stlsgd averages whole models: use a plain or DDP model")
    return model


class _CsvLog:
    """One row per round: the fields of :class:`RoundStats`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._new = True

    def write(self, stats: RoundStats) -> None:
        with open(self.path, "w" if self._new else "a", newline="") as fh:
            writer = csv_module.DictWriter(fh, fieldnames=FIELDS)
            if self._new:
                writer.writeheader()
                self._new = False
            writer.writerow({**dataclasses.asdict(stats), "saved": stats.saved})


__all__ = ["PlanAverager", "RoundStats"]
