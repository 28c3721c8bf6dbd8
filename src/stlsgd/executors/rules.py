"""Round rules on tensors: what a round does to a model besides the plan's local steps, written once for the
simulator (stacked clients, NumPy or torch), the torchrun executor, the drop-in and Flower.

- :class:`RoundRule`: which rules a run uses (drift correction, an outer step).
- :func:`add_proximal`: STL-SGD^nc's proximal gradient (Algorithm 3): g += (x - x_s) / gamma.
- :func:`drift_correction` and :func:`update_control`: SCAFFOLD's control variates (Karimireddy et al., ICML
  2020, option II): every step's gradient gets c - c_i; after the round
  c_i <- c_i - c + (x_start - y_i) / (sum of the round's learning rates), and c becomes the mean of the c_i
  (sent with the model); with a window M (or a share of the round), y_i is the client's model after the round's
  first M steps and the sum runs over those steps' learning rates (:meth:`RoundRule.control_steps`). Where the
  executor sees each step's gradient (the drop-in),
  :func:`accumulate_gradients` and :func:`control_from_gradients` give the same c_i under plain SGD as the
  lr-weighted mean of the round's gradients, which stays a gradient under momentum and Adam.
- :func:`outer_step`: DiLoCo's outer step on the averaged model (:class:`OuterNesterov`).
- :func:`optimizer_moments`, :func:`check_optimizer_state`: the optimizer-state policy at an average
  (``"keep"`` each process's own, ``"average"`` it with the model, ``"reset"`` it to zero).

Every function takes parallel sequences (or dicts with the same keys) of NumPy arrays or torch tensors and
changes its first argument(s) in place, so each executor calls it on whatever layout it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from stlsgd.errors import StlsgdError
from stlsgd.executors.averaging import Array, OuterNesterov

if TYPE_CHECKING:  # torch is needed only where tensors are met (see stlsgd.executors.averaging)
    import torch

OptimizerState = Literal["average", "keep", "reset"]
OPTIMIZER_STATES: tuple[str, ...] = ("average", "keep", "reset")


@dataclass(frozen=True)
class RoundRule:
    """How a round updates the model besides the plan's local steps.

    ``drift``: SCAFFOLD's control variates (option II) correct each client's steps by c - c_i; after the round
    c_i <- c_i - c + (x_start - y_i) / (sum of the round's learning rates), and c becomes the mean of the c_i
    (sent with the model: a round's bytes double). ``drift_window``: c_i from the round's first
    ``drift_window`` steps only (y_i then the model after them, the sum over their learning rates). Option II's c_i
    is the client's mean gradient along the round's path; over a long round at a large step most of that path
    lies near the client's own corrected optimum (x_start - y_i stays bounded while the sum of learning rates
    grows, so the new c_i is mostly the old c_i - c), not at the averaged model where the next round starts. From
    the first steps c_i stays near the client's gradient at the averaged model, option I's target, without
    option I's extra pass over the data.
    ``drift_share``: c_i from the first floor(share x steps) of each round instead (:meth:`control_steps`). A
    fixed window's noise, a mean of W samples, moves each client as far as its steps carry it, which on long rounds no
    longer depends on the round's length or lr: the floor it sets stays as STL-SGD's stages halve eta and double
    k. A share of the round grows with k, so that floor halves with each doubling, as option II's does.
    ``outer``: the average takes an outer optimizer step (:class:`~stlsgd.executors.averaging.OuterNesterov`)
    instead of replacing the model.
    """

    drift: bool = False
    drift_window: int | None = None
    drift_share: float | None = None
    outer: OuterNesterov | None = None

    def __post_init__(self) -> None:
        # a window needs drift correction and at least one step; a share drift correction, a value in (0, 1] and
        # no window beside it
        window, share = self.drift_window, self.drift_share
        if window is not None and (not self.drift or window < 1):
            raise StlsgdError(f"drift_window: needs drift=True and at least 1 step, got {window!r}")
        if share is not None and (not self.drift or not 0 < share <= 1 or window is not None):
            raise StlsgdError(
                f"drift_share: needs drift=True, a share in (0, 1] and no drift_window beside it, got {share!r}"
            )

    def control_steps(self, steps: int) -> int:
        """How many of a round's ``steps`` local steps its control variates are taken over: the first
        ``drift_window``, or the first floor(``drift_share`` x steps) (at least one), else all of them (option II)."""
        if self.drift_window is not None:
            return min(steps, self.drift_window)
        if self.drift_share is not None:
            return max(int(self.drift_share * steps + 1e-9), 1)  # 0.29 x 100 is 28.999999999999996 in floating point
        return steps


PLAIN = RoundRule()


def zeros_like(value: Array) -> Array:
    return np.zeros_like(value) if isinstance(value, np.ndarray) else value.new_zeros(value.shape)


def copy_of(value: Array) -> Array:
    return value.copy() if isinstance(value, np.ndarray) else value.detach().clone()


def add_proximal(
    grads: list[torch.Tensor], params: list[torch.Tensor], anchor: list[torch.Tensor], gamma: float
) -> None:
    """In place: g += (x - x_s) / gamma, the gradient of 1/(2 gamma) ||x - x_s||^2 (Algorithm 3's proximal
    term; parameters only, never buffers)."""
    if grads:
        import torch

        torch._foreach_add_(grads, torch._foreach_sub([p.detach() for p in params], anchor), alpha=1.0 / gamma)


def drift_correction(control: Sequence[Any], control_mean: Sequence[Any]) -> list[Any]:
    """c - c_i for each tensor: what SCAFFOLD adds to every stochastic gradient of the round."""
    return [c - ci for ci, c in zip(control, control_mean)]


def update_control(
    control: Sequence[Any], start: Sequence[Any], end: Sequence[Any], correction: Sequence[Any], lr_sum: float
) -> None:
    """In place: c_i <- c_i - c + (x_start - y_i) / lr_sum (SCAFFOLD option II), written as
    (x_start - y_i) / lr_sum - (c - c_i) with ``correction`` = c - c_i the round used."""
    for ci, x0, y, d in zip(control, start, end, correction):
        ci[...] = (x0 - y) / lr_sum - d


def accumulate_gradients(sums: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], lrs: Sequence[float]) -> None:
    """In place: sums += lr g, for the drop-in's control variate (see :func:`control_from_gradients`)."""
    for total, g, lr in zip(sums, grads, lrs):
        total.add_(g, alpha=lr)


def control_from_gradients(control: Sequence[Any], sums: Sequence[Any], lr_sums: Sequence[float]) -> None:
    """In place: c_i <- sum_t lr_t g_t / sum_t lr_t, the lr-weighted mean of the round's gradients (before the
    correction). Under plain SGD x_start - y_i = sum_t lr_t (g_t + c - c_i), so this is :func:`update_control`'s
    option II exactly; with momentum or Adam it stays a mean of gradients, where the displacement would carry the
    optimizer's amplification (1/(1 - momentum)) into the next round's correction. A total of 0 (no step) keeps
    c_i."""
    for ci, total, lr_sum in zip(control, sums, lr_sums):
        if lr_sum > 0:
            ci[...] = total / lr_sum


def outer_step(
    outer: OuterNesterov, start: Sequence[Any], averaged: Sequence[Any], momentum: list[Any] | None
) -> list[Any]:
    """In place: each ``averaged`` tensor becomes the outer step's model from ``start`` (DiLoCo); returns the
    outer momentum (made, zero, on the first call when ``momentum`` is None)."""
    if momentum is None:
        momentum = [zeros_like(x) for x in start]
    for x0, x, m in zip(start, averaged, momentum):
        outer.step(x0, x, m)
    return momentum


def check_optimizer_state(policy: str) -> None:
    if policy not in OPTIMIZER_STATES:
        raise StlsgdError(f"optimizer_state: must be 'average', 'keep' or 'reset', got {policy!r}")


def optimizer_moments(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The optimizer's state tensors shaped like their parameters (SGD's momentum, Adam's moments): what the
    optimizer-state policy averages or resets."""
    import torch

    out = []
    for p in params:
        for value in optimizer.state.get(p, {}).values():
            if isinstance(value, torch.Tensor) and value.shape == p.shape and torch.is_floating_point(value):
                out.append(value)
    return out


def reset_moments(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
    for t in optimizer_moments(optimizer, params):
        t.zero_()


__all__: list[str] = [
    "OPTIMIZER_STATES",
    "PLAIN",
    "OptimizerState",
    "RoundRule",
    "add_proximal",
    "accumulate_gradients",
    "check_optimizer_state",
    "control_from_gradients",
    "copy_of",
    "drift_correction",
    "optimizer_moments",
    "outer_step",
    "reset_moments",
    "update_control",
    "zeros_like",
]
