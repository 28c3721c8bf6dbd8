"""Image classification with a neural network: the paper's non-convex problem (Section 5, Table 3).

    f(x) = 1/n sum_i CE(net_x(a_i), b_i)

All clients' models live in one state dict whose tensors carry a leading client axis -- parameters AND the
BatchNorm buffers, so the simulator's :func:`~stlsgd.executors.averaging.mean_over_clients` averages the
running statistics each round as well -- and every local step of every client is one
``vmap(grad(functional_call(...)))`` call (Algorithm 1, line 4, for all clients at once).

BatchNorm under ``vmap``: ``nn.BatchNorm2d`` in train mode updates its running statistics in place, which a
batched (per-client) buffer cannot take inside ``vmap``. The training forward therefore runs a copy of the
network whose BN layers use batch statistics only (``torch.func.replace_all_batch_norm_modules_``); a
pre-forward hook on each BN layer returns that layer's per-client batch mean and unbiased variance as an
auxiliary output, and the stacked running statistics are updated from them outside the transform, exactly
as ``nn.BatchNorm2d`` would: r <- (1 - m) r + m * stat, num_batches_tracked += 1.

STL-SGD^nc (Algorithm 3) minimises f(x) + 1/(2 gamma) ||x - x_s||^2 in each stage: the gradient of the
proximal term, (x - x_s)/gamma, is added to every parameter's stochastic gradient (BN buffers are not
parameters and are not pulled to the anchor).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, replace_all_batch_norm_modules_, vmap

from stlsgd.problems.base import Evaluation, State

_MOMENTUM_PREFIX = "momentum_buffer."


def resolve_device(device: str) -> torch.device:
    """``auto``: CUDA when available, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


@contextlib.contextmanager
def reproducible(device: torch.device) -> Iterator[None]:
    """cuDNN's deterministic algorithms, chosen without benchmarking, while a CUDA run steps or evaluates; the
    caller's settings come back after. By default cuDNN may pick convolution algorithms whose backward sums in
    no fixed order: on an H200, two identical 60-iteration ResNet18 runs ended at objectives 0.758 and 1.120;
    with these settings they end bit-identical, as runs, resumes and the torchrun executor are meant to."""
    if device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    before = cudnn.deterministic, cudnn.benchmark
    cudnn.deterministic, cudnn.benchmark = True, False
    try:
        yield
    finally:
        cudnn.deterministic, cudnn.benchmark = before


class NeuralNetProblem:
    """Cross-entropy training of ``model`` on images ``X`` (n, C, H, W) and labels ``y`` (n,), N clients stacked.

    ``momentum`` and ``weight_decay`` follow ``torch.optim.SGD`` and default to 0, the paper's plain SGD.
    With momentum, each client's momentum buffer is part of the state (key ``momentum_buffer.<param>``) and
    is averaged with the model at each round.
    """

    def __init__(
        self,
        model: nn.Module,
        X: np.ndarray,
        y: np.ndarray,
        *,
        device: str = "auto",
        eval_batch: int = 1024,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        name: str = "",
    ) -> None:
        self.device = resolve_device(device)
        self.name = name
        self.lam: float | None = None  # no L2 term: build_plan's eta_1 T_1 = 1/lambda rule does not apply
        self.eval_batch = int(eval_batch)
        self.momentum = float(momentum)
        self.weight_decay = float(weight_decay)
        self.X = torch.as_tensor(np.ascontiguousarray(X), dtype=torch.float32, device=self.device)
        self.y = torch.as_tensor(np.asarray(y), dtype=torch.int64, device=self.device)
        self.num_samples = int(self.X.shape[0])
        # Initial values are drawn on the CPU so that CPU and CUDA runs start from the same x_0.
        self._cpu_model = model.cpu()
        self.model = copy.deepcopy(model).to(self.device).eval()
        self.param_names = [n for n, _ in self.model.named_parameters()]
        self.buffer_names = [n for n, _ in self.model.named_buffers()]
        self._bn: dict[str, nn.modules.batchnorm._BatchNorm] = {
            n: m for n, m in self.model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
        }
        self._train_model = copy.deepcopy(self.model).train()
        replace_all_batch_norm_modules_(self._train_model)
        self._sink: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for bn_name, module in self._train_model.named_modules():
            if bn_name in self._bn:
                module.register_forward_pre_hook(self._stats_hook(bn_name))
        self._step = vmap(grad(self._loss, has_aux=True))

    # ------------------------------------------------------------------ state

    def init_state(self, num_clients: int, seed: int = 0) -> State:
        """Every client starts from the same x_0: the model re-initialised under ``torch.manual_seed(seed)``."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for module in self._cpu_model.modules():
                reset = getattr(module, "reset_parameters", None)
                if module is not self._cpu_model and callable(reset):
                    reset()
        state: State = {}
        named = dict(self._cpu_model.named_parameters()) | dict(self._cpu_model.named_buffers())
        for name in self.param_names + self.buffer_names:
            value = named[name].detach().to(self.device)
            state[name] = value.unsqueeze(0).repeat(num_clients, *([1] * value.dim())).contiguous()
        if self.momentum:
            for name in self.param_names:
                state[_MOMENTUM_PREFIX + name] = torch.zeros_like(state[name])
        return state

    # ------------------------------------------------------------------ local steps

    def _stats_hook(self, bn_name: str):
        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            x = inputs[0].detach()
            dims = [0, *range(2, x.dim())]
            self._sink[bn_name] = (x.mean(dim=dims), x.var(dim=dims, correction=1))

        return hook

    def _loss(self, params: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor):
        """One client's mini-batch loss (batch-statistics BN) and its BN layers' batch statistics."""
        self._sink = {}
        logits = functional_call(self._train_model, params, (xb,))
        stats, self._sink = self._sink, {}
        return F.cross_entropy(logits, yb), stats

    def local_steps(
        self,
        state: State,
        rows: np.ndarray,
        lrs: np.ndarray,
        prox: tuple[float, State] | None,
        drift: State | None = None,
    ) -> None:
        """``len(lrs)`` plain SGD steps on every client in ``state``; step t uses rows ``rows[t, c, :]``.

        With ``prox = (1/gamma, anchor)`` each step descends f + 1/(2 gamma)||x - x_s||^2 (Algorithm 3),
        ``anchor`` holding x_s with a leading axis of size 1.
        """
        n_clients = next(iter(state.values())).shape[0]
        if rows.shape[1] != n_clients:
            raise ValueError(f"rows are for {rows.shape[1]} clients but the state holds {n_clients}")
        rows_t = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(self.device)
        params = [state[n] for n in self.param_names]
        gamma_inv, anchor = (0.0, None) if prox is None else (float(prox[0]), [prox[1][n] for n in self.param_names])
        bufs = [state[_MOMENTUM_PREFIX + n] for n in self.param_names] if self.momentum else None
        corrections = None if drift is None else [drift[n] for n in self.param_names]
        with torch.no_grad(), reproducible(self.device):
            for t, lr in enumerate(np.asarray(lrs, dtype=np.float64)):
                idx = rows_t[t]
                grads, stats = self._step(dict(zip(self.param_names, params)), self.X[idx], self.y[idx])
                g = [grads[n] for n in self.param_names]
                if self.weight_decay:
                    torch._foreach_add_(g, params, alpha=self.weight_decay)
                if anchor is not None and gamma_inv > 0.0:
                    # d/dx of 1/(2 gamma)||x - x_s||^2 = (x - x_s)/gamma
                    torch._foreach_add_(g, torch._foreach_sub(params, anchor), alpha=gamma_inv)
                if corrections is not None:  # SCAFFOLD: g - c_i + c
                    torch._foreach_add_(g, corrections)
                if bufs is not None:
                    torch._foreach_mul_(bufs, self.momentum)
                    torch._foreach_add_(bufs, g)
                    g = bufs
                torch._foreach_add_(params, g, alpha=-float(lr))
                self._update_running_stats(state, stats)

    def _update_running_stats(self, state: State, stats: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """What nn.BatchNorm2d does in train mode, on the stacked per-client buffers."""
        for name, module in self._bn.items():
            if not module.track_running_stats:
                continue
            mean, var = stats[name]
            tracked = state.get(f"{name}.num_batches_tracked")
            if tracked is not None:
                tracked.add_(1)
            if module.momentum is None:  # cumulative moving average, as nn.BatchNorm2d
                assert tracked is not None  # momentum None needs the count (track_running_stats)
                factor: Any = (1.0 / tracked.to(mean.dtype)).view(-1, 1)
            else:
                factor = module.momentum
            rm, rv = state[f"{name}.running_mean"], state[f"{name}.running_var"]
            rm.add_(factor * (mean - rm))
            rv.add_(factor * (var - rv))

    # ------------------------------------------------------------------ evaluation

    def warm_up(self) -> None:
        """Nothing to compile: torch runs eagerly."""

    def evaluate(self, state: State) -> Evaluation:
        """Training loss and accuracy of client 0's model (the average, right after a round) in eval mode."""
        weights = {n: state[n][0] for n in self.param_names + self.buffer_names}
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        with torch.no_grad(), reproducible(self.device):
            for start in range(0, self.num_samples, self.eval_batch):
                xb = self.X[start : start + self.eval_batch]
                yb = self.y[start : start + self.eval_batch]
                logits = functional_call(self.model, weights, (xb,))
                loss_sum += F.cross_entropy(logits, yb, reduction="sum").double()
                correct += (logits.argmax(dim=1) == yb).sum()
        return Evaluation(objective=float(loss_sum) / self.num_samples, accuracy=int(correct) / self.num_samples)

    def optimum(self, cache_dir: Any = None) -> None:
        """No closed-form optimum for a network: runs stop on training accuracy instead."""
        return None
