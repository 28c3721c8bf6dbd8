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
  unless ``plan_lr=True`` (the paper's Algorithms 2 and 3, where the plan owns eta: logged once when on;
  param group ``lr_group`` then takes the plan's lr and every other group keeps its ratio to it).
  Plans that adapt the period to the learning rate (:class:`~stlsgd.algorithms.LRCoupled`,
  :class:`~stlsgd.algorithms.QSR`) read the lr your optimizer will use for the round's first step.
- **Optimizer state** shaped like a parameter (SGD's momentum, Adam's moments) is each process's own by
  default (``optimizer_state="keep"``, as torch's PeriodicModelAverager and Accelerate leave it); ``"average"``
  sends it with the model (twice the bytes), so that after an average every process holds the same model AND
  momentum and rank 0's checkpoint at a round boundary resumes exactly; ``"reset"`` zeroes it. Measured on the
  MNIST benchmark (docs/distributed.md): keep and average reach the same accuracy within seed noise, reset
  loses about 0.6 points.
- **DDP**: give it the DDP-wrapped model; its gradient all-reduce is switched off (``require_backward_grad_sync``,
  what ``no_sync()`` sets), so the only collectives are the averages. The inner module of a live DDP is
  refused (its all-reduce would stay on).
- **How to average**: the mean, or with ``outer=OuterNesterov(lr=0.7, momentum=0.9)`` DiLoCo's outer Nesterov
  step on the averaged update (:class:`~stlsgd.executors.averaging.OuterNesterov`), with any plan.
- **Drift correction** (``drift=True``; SCAFFOLD, Karimireddy et al. ICML 2020, option II, as the simulator's
  ``algorithm.drift``): each process keeps a control variate c_i (one tensor per parameter) and the group's mean
  c; a pre-step hook adds c - c_i to every gradient before the optimizer's step, and at the end of a round c_i
  becomes the lr-weighted mean of the round's gradients (as the optimizer received them, before the
  correction; lrs of the parameter's group), the c_i riding in the same all-reduce as the model (a round sends
  twice the parameters' bytes). With plain SGD that is option II's c_i - c + (x_start - x_i)/sum(lr) exactly:
  the simulator's numbers (tests/distributed/test_dropin_drift.py). With momentum or Adam the correction is added
  to the gradient *before* the optimizer, so it passes through the momentum buffer (and Adam's normalisation),
  as the gradient does; c_i stays a mean of gradients (the displacement x_start - x_i would carry momentum's
  1/(1 - beta) amplification into the next round's correction and grow it round after round). An optimizer's
  own ``weight_decay`` is not in the gradients and so not in c_i. With ``drift_window=M``, c_i is the mean of
  the round's first M steps' gradients only (``algorithm.drift_window``: over a long round option II's mean
  follows the client's path away from the averaged model); with ``drift_share=s``, of the round's first floor(s x
  steps) (``algorithm.drift_share``: a window that grows with the period). Each rank's c_i is in its
  :meth:`PlanAverager.state_dict` (per-rank checkpoints resume exactly; another rank's state is refused).
- **STL-SGD^nc's proximal term** 1/(2 gamma) ||x - x_s||^2 (a plan with ``gamma``; x_s the model at the start
  of the stage) is added to the gradients by a pre-step hook.
- **Checkpoints**: :meth:`PlanAverager.state_dict` holds the plan's cursor, the step in the round, the anchor,
  the counters and who saved it. Save it per rank with your model and optimizer; restoring in any order
  (before or after constructing, before the first step) is exact. A checkpoint that cannot resume exactly
  (rank 0's, loaded on another rank mid-round, or at a round boundary while per-rank momentum or control
  variates are kept) is refused on every rank with the same one-line error.
- **Observability**: :attr:`PlanAverager.stats` (rounds, averages, bytes sent, bytes a per-step DDP would have
  sent, compute and communication time); ``on_round`` callbacks, ``log_every=N`` (one line per N rounds)
  and ``csv=PATH`` (one row per round).

The package, by job: :mod:`~stlsgd.dropin.flat` (the model as flat buffers), :mod:`~stlsgd.dropin.payload`
(what one average sends), :mod:`~stlsgd.dropin.checkpoint` (the state's format and checks),
:mod:`~stlsgd.dropin.stats` (counters, log line, CSV) and :mod:`~stlsgd.dropin.averager` (the class, over the
plan driver :mod:`stlsgd.algorithms.driver` and the round rules :mod:`stlsgd.executors.rules`, which hold the
optimizer-state policy).

Without a process group (one process, not launched by torchrun) it runs as a single client: rounds are counted
and logged, and averaging is the identity.
"""

from __future__ import annotations

from stlsgd.dropin.averager import PlanAverager
from stlsgd.dropin.checkpoint import STATE_FORMAT, STATE_VERSION
from stlsgd.dropin.stats import FIELDS, RoundStats
from stlsgd.executors.rules import OptimizerState

__all__ = ["FIELDS", "STATE_FORMAT", "STATE_VERSION", "OptimizerState", "PlanAverager", "RoundStats"]
