"""The averager: a thin class over the plan driver (:mod:`stlsgd.algorithms.driver`), the round rules
(:mod:`stlsgd.executors.rules`) and the flat model (:mod:`stlsgd.dropin.flat`); see :mod:`stlsgd.dropin`."""

from __future__ import annotations

import dataclasses
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from stlsgd.algorithms.driver import PlanDriver
from stlsgd.algorithms.plan import Cursor, Feedback, Plan, Round
from stlsgd.dropin import checkpoint as ckpt
from stlsgd.dropin.flat import FlatModel
from stlsgd.dropin.payload import all_reduce_mean, broadcast_from_root, max_gap_to_root
from stlsgd.dropin.stats import CsvLog, RoundStats
from stlsgd.errors import StlsgdError
from stlsgd.executors import distributed
from stlsgd.executors.averaging import OuterNesterov
from stlsgd.executors.rules import (
    OptimizerState,
    RoundRule,
    accumulate_gradients,
    add_proximal,
    check_optimizer_state,
    control_from_gradients,
    drift_correction,
    optimizer_moments,
    outer_step,
    reset_moments,
)


class PlanAverager:
    """Runs ``plan`` in the loop of ``model`` and ``optimizer``; see :mod:`stlsgd.dropin`.

    ``group``: the process group to average over (default: the default group, which is initialised from
    torchrun's environment when it does not exist yet; alone without either). ``hook=False`` leaves the counting
    to explicit :meth:`after_step` calls (the adapters use it). ``drift=True``: SCAFFOLD's drift correction
    (see :mod:`stlsgd.dropin`); ``drift_window``: the control variate from each round's first that many steps,
    or ``drift_share``: from that share of each round's steps (:class:`~stlsgd.executors.rules.RoundRule`).
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
        drift: bool = False,
        drift_window: int | None = None,
        drift_share: float | None = None,
        on_round: Callable[[RoundStats], None] | None = None,
        log_every: int | None = None,
        csv: str | Path | None = None,
        hook: bool = True,
    ) -> None:
        self.module = _unwrap(model)
        self.optimizer = optimizer
        self.plan = plan
        check_optimizer_state(optimizer_state)
        if not 0 <= lr_group < len(optimizer.param_groups):
            raise StlsgdError(f"lr_group: the optimizer has {len(optimizer.param_groups)} param groups, got {lr_group}")
        if log_every is not None and log_every < 1:
            raise StlsgdError(f"log_every: must be >= 1 round, got {log_every}")
        self.plan_lr, self.optimizer_state, self.lr_group = plan_lr, optimizer_state, lr_group
        #: The round rules every executor shares: drift correction, its control variates' window, the outer step.
        self.rule = RoundRule(bool(drift), drift_window, drift_share, outer)
        self.driver = PlanDriver(plan)
        # Only the caller's own group is kept: holding the default group's object past the user's
        # destroy_process_group leaves its destructor to the interpreter's exit (an abort under torchrun);
        # None means "the default group", looked up at each collective.
        self.place = distributed.locate(group)
        self.group = group
        if model is not self.module:  # DDP: its gradient all-reduce would undo the point of local steps
            setattr(model, "require_backward_grad_sync", False)  # noqa: B010 - DDP's attribute, not nn.Module's
            self._say(
                "DDP's per-step gradient all-reduce is switched off: the model is averaged at the end of "
                "each round of the plan instead"
            )
        elif self.world_size > 1:
            _refuse_live_ddp(self.module)
        self.flat = FlatModel(self.module)
        if not self.flat.params:
            raise StlsgdError("model: has no floating-point parameters to average")
        self._callbacks = [on_round] if on_round is not None else []
        if log_every is not None:

            def log(stats: RoundStats) -> None:
                if stats.round % log_every == 0:
                    self._say(stats.line())

            self._callbacks.append(log)
        if csv is not None:
            self._callbacks.append(CsvLog(Path(csv)).write if self.rank == 0 else (lambda s: None))
        self.stats = RoundStats()
        self._anchor: list[torch.Tensor] | None = None  # x_s of Algorithm 3
        self._start_params: list[torch.Tensor] | None = None  # the model at the round's start (outer step)
        self._outer_momentum: list[torch.Tensor] | None = None
        # Drift correction: this rank's control variate c_i and the group's mean c; each param group's sum of
        # the round's learning rates so far.
        self._control: list[torch.Tensor] | None = None
        self._control_mean: list[torch.Tensor] | None = None
        self._lr_sums: list[float] | None = None
        self._grad_sums: list[torch.Tensor] | None = None  # sum of lr g over the round, per parameter
        self._group_of = _group_index(optimizer, self.flat.params)
        self._objective: float | None = None
        self._restored = False
        self._started = False
        self._last_ended = False
        self._mark = time.perf_counter()
        self._hooks = [optimizer.register_step_pre_hook(self._before_step)]
        self._hooked = hook
        if hook:
            self._hooks.append(optimizer.register_step_post_hook(self._after_hooked_step))
        self._lr_ratios = [1.0] * len(optimizer.param_groups)
        if plan_lr:
            if plan.next_round(Cursor()).lrs is None:
                raise StlsgdError(
                    "plan_lr: the plan has no learning rate of its own; give it lr=... or leave plan_lr off"
                )
            self._lr_ratios = _lr_ratios(optimizer, lr_group)
            self._say(
                "the plan sets the learning rate of every step (plan_lr=True): param group "
                f"{lr_group} takes the plan's lr and every other group keeps its ratio to it; the LR scheduler's "
                "values are overridden"
            )

    @property
    def drift(self) -> bool:
        """Whether the rule corrects drift (SCAFFOLD's control variates)."""
        return self.rule.drift

    @property
    def outer(self) -> OuterNesterov | None:
        """The outer step the average takes, if any."""
        return self.rule.outer

    # ------------------------------------------------------------------ where the loop stands

    @property
    def rank(self) -> int:
        return self.place.rank

    @property
    def world_size(self) -> int:
        return self.place.world

    @property
    def current_round(self) -> Round:
        """The round the next optimizer step belongs to (as it would start now, before its first step)."""
        return self.driver.peek(self._feedback_now())

    @property
    def round_index(self) -> int:
        return self.driver.cursor.index

    @property
    def step_in_round(self) -> int:
        return self.driver.step

    @property
    def at_boundary(self) -> bool:
        """Right after an average (or before the first step): every process holds the same model."""
        return self.driver.at_boundary

    @property
    def iteration(self) -> int:
        """Optimizer steps taken so far (the paper's t)."""
        return self.driver.iteration

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
        """The learning rate of the next step (of param group ``lr_group``): the plan's with ``plan_lr``, else
        the optimizer's."""
        if self.plan_lr:
            return float(self.current_round.learning_rates()[self.driver.step])
        return float(self.optimizer.param_groups[self.lr_group]["lr"])

    def report_loss(self, loss: float | torch.Tensor) -> None:
        """Feed the training loss to a plan that adapts to it (AdaComm); read at the next round's start."""
        self._objective = float(loss)

    # ------------------------------------------------------------------ the loop

    def after_step(self) -> bool:
        """Count one optimizer step; True when it ended a round and the model was averaged over the group.

        With the hook on (the default) the post-step hook counts every step and this only answers for the last
        one (a call by hand never counts a step twice); with ``hook=False`` each call counts one step."""
        if self._hooked:
            return self._last_ended
        return self._count()

    def average(self) -> None:
        """Every process's floating parameters and buffers become their mean over the group (one all-reduce
        per dtype and device), and the optimizer's momentum-like state follows ``optimizer_state``. Called at
        the end of every round; call it by hand to leave a loop in the middle of a round with one model (the
        round is not ended: :attr:`stats` count the average and the steps so far)."""
        self._exchange(round_end=False)
        self._update_stats(self.driver.round, round_end=False)

    def models_in_sync(self, atol: float = 0.0) -> bool:
        """Whether every process holds rank 0's parameters and buffers (to ``atol``): a check for debugging."""
        self.flat.check()
        if self.world_size == 1:
            return True
        return max_gap_to_root(self.flat.flats, self.group) <= atol

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
        mid = not self.driver.at_boundary
        return {
            "format": ckpt.STATE_FORMAT,
            "version": ckpt.STATE_VERSION,
            **self.driver.state_dict(),  # the plan's identity, the cursor, the step, the feedback
            "objective": self._objective,
            "anchor": ckpt.copies(self._anchor),
            "start": ckpt.copies(self._start_params) if mid else None,
            "outer_momentum": ckpt.copies(self._outer_momentum),
            "drift": self.drift,
            "control": ckpt.copies(self._control),
            "control_mean": ckpt.copies(self._control_mean),
            "lr_sums": list(self._lr_sums) if mid and self._lr_sums is not None else None,
            "grad_sums": ckpt.copies(self._grad_sums) if mid else None,
            "stats": dataclasses.asdict(self.stats),
            "rank": self.rank,
            "world_size": self.world_size,
            "optimizer_state": self.optimizer_state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; load it before the first optimizer step, on every rank (the
        ranks agree: a state refused on one rank is refused on all with the same line).

        Refused (one line) when the resume could not be exact: another plan; a missing key, a negative step, a
        tensor of the wrong shape; a load after training began; rank 0's state on another rank in the middle of
        a round (the other ranks' local models are not in it); or, with ``optimizer_state="keep"`` or
        ``drift=True``, another rank's state at all (per-rank momentum and control variates differ even right
        after an average).
        """
        error: str | None = None
        try:
            self._load(state)
        except StlsgdError as exc:
            error = str(exc)
        if self.world_size > 1:
            errors: list[str | None] = [None] * self.world_size
            dist.all_gather_object(errors, error, group=self.group)
            for rank, message in enumerate(errors):
                if message is not None:
                    raise StlsgdError(f"rank {rank}: {message}")
        elif error is not None:
            raise StlsgdError(error)

    def _load(self, state: dict[str, Any]) -> None:
        if self._started:
            raise ckpt.refuse(
                f"training already began ({self.iteration} steps counted): load the state before the first "
                "optimizer step"
            )
        state = ckpt.upgrade(state)
        moments = bool(optimizer_moments(self.optimizer, self.flat.params))
        ckpt.check_owner(
            state,
            rank=self.rank,
            world=self.world_size,
            keeps_moments=self.optimizer_state == "keep" and moments,
            drift=self.drift,
        )
        params = self.flat.params
        anchor = ckpt.tensors_like(state["anchor"], params, "anchor")
        start = ckpt.tensors_like(state["start"], params, "start")
        outer_momentum = ckpt.tensors_like(state["outer_momentum"], params, "outer_momentum")
        control = ckpt.tensors_like(state["control"], params, "control")
        control_mean = ckpt.tensors_like(state["control_mean"], params, "control_mean")
        try:
            stats = RoundStats(**state["stats"])
        except TypeError as err:
            raise ckpt.refuse(f"stats: {err}") from None
        driver = PlanDriver(self.plan)
        driver.load_state_dict(state, who=ckpt.WHO)
        if not driver.at_boundary and self.outer is not None and start is None:
            raise ckpt.refuse("a mid-round state without the round's starting model (start)")
        if not driver.at_boundary and self.drift and (state["grad_sums"] is None or state["lr_sums"] is None):
            raise ckpt.refuse("a mid-round state without the round's gradient sums (grad_sums, lr_sums)")
        self.driver = driver
        self._anchor, self._start_params, self._outer_momentum = anchor, start, outer_momentum
        self._control, self._control_mean = control, control_mean
        self._lr_sums = None if state["lr_sums"] is None else [float(x) for x in state["lr_sums"]]
        self._grad_sums = ckpt.tensors_like(state["grad_sums"], params, "grad_sums")
        self._objective = state["objective"]
        self.stats = stats
        self._restored = True

    # ------------------------------------------------------------------ internals

    def _feedback_now(self) -> Feedback:
        lr = None if self.plan_lr else float(self.optimizer.param_groups[self.lr_group]["lr"])
        return Feedback(objective=self._objective, lr=lr)

    def _begin_round(self) -> Round:
        """Settle the round that starts with the coming step, from the lr that step will use."""
        rnd = self.driver.settle(self._feedback_now())
        params = self.flat.params
        if rnd.prox_gamma is not None and (rnd.new_anchor or self._anchor is None):
            # x_s of Algorithm 3: the averaged model at the start of the stage (the average just happened).
            self._anchor = ckpt.copies(params)
        if self.outer is not None:
            self._start_params = ckpt.copies(params)
        if self.drift:
            self._lr_sums = [0.0] * len(self.optimizer.param_groups)
            self._grad_sums = [torch.zeros_like(p) for p in params]
            if self._control is None:
                self._control = [torch.zeros_like(p) for p in params]
                self._control_mean = [torch.zeros_like(p) for p in params]
        return rnd

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        if not self._started:
            self._start()
        rnd = self.driver.round or self._begin_round()
        if self.plan_lr:
            lr = float(rnd.learning_rates()[self.driver.step])
            for ratio, group in zip(self._lr_ratios, self.optimizer.param_groups):
                group["lr"] = lr * ratio
        if self._lr_sums is not None and self._in_window():
            for i, group in enumerate(self.optimizer.param_groups):
                self._lr_sums[i] += float(group["lr"])
        if rnd.prox_gamma is None and not self.drift:
            return None
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args[0] is the optimizer
        if closure is None:
            self._correct_gradients(rnd)
            return None

        # step(closure) computes the gradients itself (Lightning's automatic optimization, LBFGS): the
        # corrections go on top of what each call of the closure leaves.
        def corrected() -> Any:
            loss = closure()
            self._correct_gradients(rnd)
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": corrected}
        return (args[0], corrected, *args[2:]), kwargs

    def _correct_gradients(self, rnd: Round) -> None:
        """The proximal gradient (Algorithm 3) and drift's c - c_i, on the parameters that have a gradient."""
        live = [i for i, p in enumerate(self.flat.params) if p.grad is not None]
        if not live:
            return
        params = [self.flat.params[i] for i in live]
        grads = [p.grad for p in params]
        if rnd.prox_gamma is not None and self._anchor is not None:
            add_proximal(grads, params, [self._anchor[i] for i in live], rnd.prox_gamma)  # type: ignore[arg-type]
        if self._control is not None and self._control_mean is not None and self._grad_sums is not None:
            with torch.no_grad():
                lrs = self.optimizer.param_groups
                if self._in_window():
                    accumulate_gradients(
                        [self._grad_sums[i] for i in live],
                        grads,  # type: ignore[arg-type]
                        [0.0 if self._group_of[i] is None else float(lrs[self._group_of[i]]["lr"]) for i in live],  # type: ignore[index]
                    )
                correction = drift_correction([self._control[i] for i in live], [self._control_mean[i] for i in live])
                torch._foreach_add_(grads, correction)  # type: ignore[arg-type]

    def _in_window(self) -> bool:
        """Whether the coming step is one of those the round's control variate is taken over
        (:meth:`~stlsgd.executors.rules.RoundRule.control_steps`)."""
        rnd = self.driver.round
        assert rnd is not None  # settled by _before_step, which every call comes from
        return self.driver.step < self.rule.control_steps(rnd.steps)

    def _after_hooked_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._last_ended = self._count()

    def _count(self) -> bool:
        if self.driver.round is None:  # hook=False without a pre-step call (counted by hand)
            self._begin_round()
        if not self.driver.count():
            return False
        self._exchange(round_end=True)
        done = self.driver.finish()
        self._update_stats(done, round_end=True)
        return True

    def _exchange(self, round_end: bool) -> None:
        """The average: the model (and what rides with it) over the group, then the outer step and the
        optimizer-state policy; at a round's end with drift, the control variates' update and mean."""
        started = time.perf_counter()
        self.stats.compute_s += started - self._mark
        self.flat.check()
        params = self.flat.params
        riders = optimizer_moments(self.optimizer, params) if self.optimizer_state == "average" else []
        means: list[torch.Tensor] = []
        if round_end and self._control is not None and self._grad_sums is not None and self._lr_sums is not None:
            sums = self._lr_sums
            totals = [0.0 if where is None else sums[where] for where in self._group_of]
            with torch.no_grad():
                control_from_gradients(self._control, self._grad_sums, totals)
            means = [c.clone() for c in self._control]  # c = mean of the c_i, in the model's all-reduce
        if self.world_size > 1:
            self.stats.bytes_sent += all_reduce_mean(self.flat.flats, riders + means, self.group, self.world_size)
            self.stats.averages += 1
        if means:
            self._control_mean = means
        if self.outer is not None and self._start_params is not None:
            with torch.no_grad():
                self._outer_momentum = outer_step(
                    self.outer, self._start_params, [p.data for p in params], self._outer_momentum
                )
        if self.optimizer_state == "reset":
            reset_moments(self.optimizer, params)
        self._mark = time.perf_counter()
        self.stats.comm_s += self._mark - started

    def _start(self) -> None:
        """Before the first step: processes need not be seeded alike, so a fresh run starts from rank 0's model.

        A restored run starts from its own (per-rank) state; an optimizer that already holds state while the
        averager's was not restored means a checkpoint was half loaded: refused rather than overwritten."""
        self._started = True
        self._mark = time.perf_counter()
        if self._restored or self.world_size == 1:
            return
        if optimizer_moments(self.optimizer, self.flat.params) or self.iteration:
            raise StlsgdError(
                "PlanAverager: the optimizer holds state from a checkpoint but the averager's state "
                "was not restored; call averager.load_state_dict(saved) before the first step"
            )
        broadcast_from_root(self.flat.flats, self.group)

    def _update_stats(self, rnd: Round | None, round_end: bool) -> None:
        """The stats after an average: at the end of round ``rnd`` (then the callbacks see them), or of an
        average called by hand (``rnd`` the round under way, or None)."""
        s = self.stats
        if round_end and rnd is not None:
            s.round, s.stage, s.period = rnd.index + 1, rnd.stage, rnd.period
        s.steps = self.driver.iteration
        if rnd is not None and self.plan_lr:
            s.lr = float(rnd.learning_rates()[max(0, min(rnd.steps, self.driver.step or rnd.steps) - 1)])
        else:
            s.lr = float(self.optimizer.param_groups[self.lr_group]["lr"])
        s.objective = self._objective
        s.ddp_bytes = s.steps * self.flat.nbytes_params
        if round_end:
            for callback in self._callbacks:
                callback(s)

    def _say(self, text: str) -> None:
        if self.rank == 0:
            print(text, file=sys.stderr, flush=True)


def _group_index(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> list[int | None]:
    """Each parameter's param group in ``optimizer`` (None: the optimizer does not step it)."""
    where = {id(p): i for i, group in enumerate(optimizer.param_groups) for p in group["params"]}
    return [where.get(id(p)) for p in params]


def _lr_ratios(optimizer: torch.optim.Optimizer, lr_group: int) -> list[float]:
    """Each param group's lr over group ``lr_group``'s (what plan_lr keeps while it sets the plan's lr)."""
    lrs = [float(g["lr"]) for g in optimizer.param_groups]
    if len(lrs) == 1:
        return [1.0]
    if lrs[lr_group] <= 0:
        raise StlsgdError(
            f"plan_lr: param group {lr_group} has lr {lrs[lr_group]}, so the other groups' lrs cannot be scaled "
            "by the plan's; give it a positive lr, or choose another lr_group"
        )
    return [lr / lrs[lr_group] for lr in lrs]


def _unwrap(model: nn.Module) -> nn.Module:
    """The module to average: a DDP wrapper's module; FSDP (sharded parameters) is not supported."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return model.module
    if type(model).__name__ in ("FullyShardedDataParallel", "FSDPModule") or hasattr(model, "_fsdp_wrapped_module"):
        raise StlsgdError("model: FSDP shards the parameters; stlsgd averages whole models: use a plain or DDP model")
    return model


def _refuse_live_ddp(module: nn.Module) -> None:
    """Refuse a module that a DistributedDataParallel with its gradient all-reduce on wraps: every backward
    would still all-reduce the gradients, and the averages would come on top of them."""
    from torch.nn.parallel import DistributedDataParallel

    for obj in gc.get_objects():
        if (
            isinstance(obj, DistributedDataParallel)
            and obj.module is module
            and getattr(obj, "require_backward_grad_sync", True)
        ):
            raise StlsgdError(
                "model: a live DistributedDataParallel wraps this module and would still all-reduce every "
                "gradient: give PlanAverager the DDP model itself (its all-reduce is then switched off)"
            )
