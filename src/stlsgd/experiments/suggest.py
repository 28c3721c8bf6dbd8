"""Tuning-free STL-SGD^sc: the constants of the paper's theory estimated from the data, and a proposal.

``stlsgd suggest CONFIG`` estimates, for the config's logistic problem (Eq. 8) and partition:

- L: the largest eigenvalue of the Hessian at x_0 = 0, X^T X / (4n) + lambda I, by power iteration; and
  L_max = max_i ||x_i||^2 / 4 + lambda, the smoothness of the worst single sample (from the row norms);
- mu = lambda (Eq. 8 is lambda-strongly convex);
- sigma^2: the variance of single-sample gradients at x_0, E_i ||grad f_i(x_0) - grad f(x_0)||^2;
- zeta^2: the spread of the clients' gradients at x_0, 1/N sum_c ||grad f_c(x_0) - grad f(x_0)||^2 (the paper's
  zeta_f^* is taken at x*; x_0 needs no optimum and is where stage 1 starts).

It prints them with the values Theorem 2 prescribes (eta_1 <= 1/(6L), T_1 eta_1 = 6/mu, and k_1 = min{1/(6 eta_1
L N), 1/(9 eta_1 L)} IID or min{sigma / sqrt(6 eta_1 L N (sigma^2 + 4 zeta^2)), 1/(9 eta_1 L)} Non-IID), which are
too conservative to use (k_1 < 1: an average after every step), and the proposal ``algorithm.auto = true`` runs:

- eta_1 = N / (2L): the largest step 1/(2L) of one client, scaled by the N clients whose steps are averaged (the
  linear scaling the paper's eta_1 = N/10 follows);
- T_1 = 1 / (mu eta_1): the paper's experimental rule eta_1 T_1 = 1/lambda (Theorem 2's form, with 1 for 6);
- when the clients sample alike (zeta^2 / sigma^2 <= IID_SHARE) and the run has a target gap (so f* and x* are
  computed for it anyway): one round of Local SGD, no drift correction, sized by the quadratic model at x*
  (:func:`model_gap`, :func:`one_round`): each client runs alone until the round's end, at a single client's step
  eta_1 = 1/(2L) on eta_t = eta_1 / (1 + eta_1 t / c), and c and the round's K steps are the pair with the fewest
  steps for which the model's gap, the bias left in each Hessian direction plus the N clients' averaged noise
  eta_K sigma*^2 / (4N), is a third of the target (within the run's budget: where the budget is shorter, the round
  is all of it, at the c whose model gap after it is least). Every client samples the whole objective, so a round
  buys only the average of N runs: the fewest rounds are one long enough for the target;
- when the clients sample alike and there is no target: LR-coupled STL (the paper's eta k = constant on
  eta_t = eta_1 / (1 + mu eta_1 t), the 1/(mu t) decay of strongly convex SGD, where Algorithm 2 halves eta once a
  stage), k_1 = IID_K1_STAGES T_1 (at most the plans' cap, 2^20), no drift correction: each round is
  1 + IID_K1_STAGES times all the steps before it (up to that cap), and the lr falls smoothly inside it;
- when the clients differ and the run has a target gap (and d (d + sum_c min(n_c, d)) <= CLIENT_MODEL_SIZE): the model
  at x* of each client (:class:`ClientsAtOptimum`) runs drift-corrected Local SGD (SCAFFOLD, option II, and with
  control variates from a round's first DRIFT_WINDOWS steps, ``drift_window``, whose sampling noise it draws from each
  client's gradient covariance at x*, doubled: WINDOW_NOISE; a candidate's rounds the median of DRIFT_DRAWS draws of
  it; and at each evaluation the chance that the averaged noise's gap, chi^2 over the few directions it lies in,
  leaves the gap under the target) on the clients' quadratics (:func:`drift_rounds`) for candidate plans at one
  client's step 1/(2L) -- Local SGD + drift with periods up to 2^20, and STL-SGD^sc + drift with Algorithm 2's stages
  (:func:`drift_candidates`) -- and ``auto`` runs the one with the fewest rounds (then the most draws in by then,
  then steps, then the lowest last lr) if that is fewer than STATIONARY_SLACK times the rounds the stationary stages
  below need at least to halve eta down to the clients' averaged noise (:func:`stl_rounds`)
  and every draw of it reaches within the budget (else the next: a run that misses by its budget's end never
  reaches), and a Local SGD + drift pick once more among it and Local SGD + drift at half and twice its period
  and its decay (:func:`neighbours`): long periods where the model has the control variates carry them, short ones
  elsewhere; then once more between it and the same plan from a first step of N/(2L) with its late schedule kept
  (:func:`first_step`: the logistic loss's bounded gradients let such steps saturate the margins, which the model
  takes as landing on the fixed point along every curvature h >= 1/eta); where no draw of the pick reaches with the
  window's noise drawn from the clients' covariance at each round's averaged model instead of at x* (far from x*
  the samples' gradients are larger), the same choice made again with it drawn there (:func:`drift_pick`); and
  where the clients' rows are few (TRUE_OBJECTIVE_SIZE), a Local SGD + drift pick once more among it and the same
  plan at half, 1.5, twice and four times its period (TRUE_PERIODS) and half and a quarter of its decay constant,
  each with its first rounds run on the clients' true logistic objectives without noise until the gap is within
  NEAR_TARGET times the target, and the rest on the quadratics (:func:`true_choice`): the quadratic at x* is right
  near x* and too slow far from it; where the pick's median is the first evaluation but not every draw's, those
  plans and the same at four times its window are weighed for more draws in there;
- otherwise drift correction on, its control variates from the first FALLBACK_SHARE of each round's steps
  (``drift_share``; option II with a network), and stages that end when the run is stationary
  (``stage_end = "stationary"``, :class:`~stlsgd.algorithms.stl_sgd.STLSGDStationary`: the objective is higher
  than five or more rounds before, at most T_s), and k_1 = T_1 / R, R = R_NONIID sqrt(1 + 4 zeta^2 / sigma^2)
  (Theorem 2's Non-IID factor), but at least MIN_K1 steps (at most T_1 / 2). With the stage ended online, R no
  longer has to be the rounds a stage.
  While the period is at most the budget / DIMINISHING_BUDGET (``diminishing_k``), a stage also ends once its fall
  over the test's window is under a quarter of its fall so far (not with a network: it buys rounds with steps).
  With the clients' models built, eta halves only until the clients' averaged noise at x* is under a third of the
  target (``halvings``, :func:`stationary_halvings`); later stages keep that eta and still grow k.
  With a network given (``algorithm.network``, ``stlsgd suggest --network``), every period is capped at
  k_max = NETWORK_CAP q, q = (latency + the bytes a client sends a round / bandwidth) / step the cost of one round
  in client-steps: longer rounds would cut communication, already at most a third of a round's time, and add drift
  steps; in IID data the network changes nothing (a longer period removes rounds without adding steps there).

``auto`` sets lr, k, T1, iid, drift, drift_window, drift_share, stage_end, k_max, diminishing_k and halvings itself:
any of them given beside it is refused (STLSCConfig).

Measured against each column's grid (docs/results/schedules.md, *Tuning-free default*): the fixed-length rule this
replaces (R = 64 sqrt(1 + 4 zeta^2/sigma^2) rounds a stage) spent 775 rounds on a9a Non-IID and 655 on MNIST
Non-IID; no static rule tried held on every column.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import scipy.sparse as sp
from scipy.stats import chi2

from stlsgd.algorithms.plan import Cursor, Plan, Round
from stlsgd.algorithms.registry import MAX_STEPS, REGISTRY, MethodConfig, PlanContext
from stlsgd.algorithms.schedules import DEFAULT_K_MAX
from stlsgd.algorithms.stl_sgd import STATIONARY_WINDOW, STLSCConfig
from stlsgd.costmodel import Network
from stlsgd.data import Partition
from stlsgd.errors import ConfigError, StlsgdError
from stlsgd.files import cache_dir
from stlsgd.problems.logistic import LogisticRegression, _expit

# The first period under drift correction (Non-IID) is T_1 / R with R = R_NONIID sqrt(1 + 4 zeta^2 / sigma^2)
# (Theorem 2's Non-IID factor on a base measured on a9a and MNIST Non-IID: a9a took 145-160 rounds with R = 38,
# MNIST 245-290 with R = 40; with a fixed 64 or 128 steps, 130-195 and 325-415), but at least MIN_K1 steps (at most
# T_1 / 2): a small data set has a short T_1 and R would leave a step or two a round, over which five rounds move
# the objective less than its noise, so stages ended early (digits49: 1,530 rounds at k_1 = 2, 20-35 at 60).
R_NONIID = 32
MIN_K1 = 64
# Alike clients without a target gap: LR-coupled STL's first period, in units of T_1 = 1/(mu eta_1). Every client
# samples the whole objective, so a round buys only the average of N runs: a first round long enough for the
# 1/(mu t) decay to bring eta down 257-fold leaves one to three rounds. Medians of three seeds
# (docs/results/schedules.md), 8 -> 32 -> 256 T_1: a9a IID 6 -> 5 -> 3 rounds, MNIST IID 4 -> 3 -> 3, three small
# sets 2-3 -> 1-2 -> 1; 512 and 1,024 T_1 no fewer (on a9a and MNIST both are the plans' 2^20 cap on a period).
IID_K1_STAGES = 256
# Alike clients with a target gap: one round of Local SGD sized by the quadratic model at x* (:func:`one_round`) to
# reach ONE_ROUND_MARGIN times less than the target. On 60 one-round runs on a9a and MNIST (lr 0.05-10, c 1,000 to
# 1/mu, 100 k to 3.3 M steps), the model's gap was 0.7-1.7x the measured one in 33 of the 35 that ended under 3.5e-4
# (0.32x where the lr fell 16,000-fold, 0.56x at MNIST's 3.2e-4), and down to 0.09x in rounds that ended far from x*
# (gaps of 4e-4 to 3e-2: outside the quadratic model's reach, and not where a sized round ends). A round's gap is
# random (the last iterates of N runs): sized for half the target, 3 of 18 runs on six sets (seeds 0-2) ended their
# round 1.05-1.17x over it; for a third, 1 of 18 (digits 3/8, 1.38x; docs/results/schedules.md).
ONE_ROUND_MARGIN = 3.0
# Below this share of the gradient noise, the clients count as sampling alike (zeta^2 / sigma^2).
IID_SHARE = 1e-3
# With a network, no round longer than NETWORK_CAP times the client-steps one round's communication costs. Measured
# on a9a Non-IID, datacenter (0.5 ms a round, 446 ns a step: q = 1,121), seeds 0-2, predicted time to the target:
# uncapped 325, 392, 377 ms (stationary stages only, as with a network); capped at 2q 285, 285, 351 ms (at about
# 1q, when the cap was chosen: 373, 352, 326 ms against 2q's 278, 312, 358); MNIST (639 ns, 2q = 1,597) 1,569, 922,
# 1,328 -> 979, 912, 1,049 ms (docs/results/schedules.md).
NETWORK_CAP = 2
# Clients that differ: a stage also ends on diminishing returns while its period is at most the budget /
# DIMINISHING_BUDGET (STLSGDStationary.diminishing_k). Such stages are about ten rounds and k doubles each stage, so a
# stage at period k costs about 10 k steps and the ones after it twice as many each: at k = budget / 256 the next
# four would cost 10 k (2 + 4 + 8 + 16) = 300 k, more than the budget. MNIST Non-IID (budget 3.6 M, seeds 0-2): with
# the test at every period, the budget at every seed; up to 14,000 steps (3.6 M / 256), 150, 150, 160 rounds; up to
# 30,000, 130, 149, the budget (docs/results/schedules.md). Without a budget, or with a network (predicted time, not
# rounds), off.
DIMINISHING_BUDGET = 256
# Clients that differ, with a target gap: the plan of the clients' quadratic models at x* (:func:`drift_rounds`)
# that reaches the target in the fewest rounds, at one client's step 1/(2L): Local SGD + drift with a period of
# DRIFT_PERIODS and an lr_decay of DRIFT_DECAYS mu lr, or STL-SGD^sc + drift (Algorithm 2's stages) from
# T_1 = DRIFT_LR_T1 / (mu lr) and k_1 of DRIFT_K1 -- where it is fewer than STATIONARY_SLACK times the rounds
# STL-SGD^sc's stationary stages need at least (:func:`stl_rounds`). Measured on thirteen Non-IID sets, seeds 0-2
# (docs/results/schedules.md, *Tuning-free default*): the model chose a plan on eight, which took 1.16-6.3x fewer
# rounds than the stationary stages on six of them and as many on two; on the other five auto runs the stationary
# stages as before. Periods up to the plans' cap (2^20) and decays of 8 and 16 mu lr since a9a Non-IID's windowed
# Local SGD + drift took 15 rounds at k 327,680 (lr 3.2, lr_decay 1e-3: 3,200 / t late in a round, 10 mu lr at
# 1/(2L)), where the model's best up to 65,536 was 35; auto's plan there (k 262,144, W 4,096) took 25 rounds at 4 mu
# lr and 20 at 8 (seeds 0-2). A decay of 2 mu lr since make_classification 11's plan took 55-75 rounds without it and
# 10-25 with it (its windowed grid's best: 10).
# Powers of four, and where the pick is Local SGD + drift, the powers of two beside it (:func:`neighbours`, which
# also tries half and twice the pick's decay).
DRIFT_PERIODS = (256, 1024, 4096, 16384, 65536, 262144, 1048576)
DRIFT_DECAYS = (0.0, 0.25, 1.0, 2.0, 4.0, 8.0, 16.0)
DRIFT_LR_T1 = (0.03, 0.1, 0.3, 1.0)
DRIFT_K1 = (16, 64, 256, 1024, 4096)
# The stationary stages' count (:func:`stl_rounds`) is the least they spend, not what they take: measured (seeds
# 0-2), MNIST 3/5 (its test split, 8 clients) 125, 135, 145 rounds against a count of 80, MNIST 4/9 150, 150, 160
# against 90, make_classification 11 110, 135, 130 against 110. The model's best candidate is taken while its
# rounds are under STATIONARY_SLACK times the count: with the count alone MNIST 3/5 ran the stationary stages (135,
# 2.25x its windowed grid's best, 60); at twice the count the model's plan (105 rounds in the model) took 90, 95, 85.
# The model's rounds have been above the runs' more often than below (make_classification 11: 25 in the model; 10,
# 25, 20 run). It costs model rounds: every candidate that does not reach runs twice as far (a9a Non-IID's suggest
# 25 -> 50 s, MNIST 4/9's 228 -> 482 s, both plans unchanged; docs/results/schedules.md, *Three more unseen sets*).
STATIONARY_SLACK = 2
# Each candidate also with the control variates from a round's first W steps (``drift_window``): over a long round
# option II's c_i is a mean along the client's path to its own corrected optimum, not its gradient at the averaged
# model; from a short window it is that gradient but noisy (N(0, Sigma_c / W), which the model draws). Measured on
# the parity set (8 clients, auto's lr, lr_decay and k 65,536, seeds 0-2): W 256 the budget at every seed (the
# noise held the gap at 1.3-2.5e-4), 1,024 15, 15, 15, 4,096 25, 25, 25; the model with the noise gave 20 and 25
# (without it, 10 for 256: docs/results/schedules.md, *Control variates from a round's first steps*). 16,384 since the
# sparse, text-like sets' grids chose it (sparse67: windowed Local SGD + drift 10 rounds at W 16,384, auto's W 4,096
# plan 15): with it the model's picks on the five sparse sets took 10, 10, 15, 15 and 10 rounds at every seed (seeds
# 0-2) where they took medians of 15, 15, 20, 20 and 15 (sparse17, 29, 41, 53, 67); the other 41 held-out sets and
# Table 2+'s columns kept their plans (docs/results/schedules.md, *Six more unseen sets, and a window of 16,384 steps*).
DRIFT_WINDOWS = (256, 1024, 4096, 16384)
# The window's noise is drawn at WINDOW_NOISE times that variance, Sigma_c / W. At Sigma_c / W the model was right on
# the parity set and make_classification 11 but not on a9a Non-IID (lr 1/(2L), k 262,144): with W 1,024 it gave 20
# rounds and the runs stalled at gaps of 1.5-4e-4 (39, the budget, 39 at seeds 0-2); with W 4,096 it gave 21-25 and
# the runs took 20-25. At twice the variance the model ranks them as the runs do, and keeps the parity set's W 1,024
# (15 rounds at each seed); make_classification 11 then gets a plan of 55-75 rounds where W 256 at Sigma_c / W took
# 31 (docs/results/schedules.md, *Longer periods, and the window's noise*). Fitted on a9a, not derived. Tried at 1 again
# with the model as it is now: a9a Non-IID 15 rounds against 20, but 47 of 55 held-out sets within 1.5x of their grids
# against 50 (*The window's noise at Sigma_c / W, again*).
WINDOW_NOISE = 2.0
# Each candidate's rounds are the median over DRIFT_DRAWS draws of that noise (seeds 0, 1, ...), as a run's are
# judged by the median of its seeds: one draw put a plan at its first evaluation by luck. With one draw the model
# gave make_hastie_10_2 (16 clients) a plan whose runs' gaps at that evaluation were 1.12e-4, 1.30e-4 and 8.5e-5
# against the target's 1e-4 (10, 10, 5 rounds); with the median of three, hastie and digits 1/7 went from 10 to 5
# rounds (seeds 0-2), and with five digits 2/5 too (docs/results/schedules.md, *The median of five draws*).
DRIFT_DRAWS = 5
# The clients' models cost a thin SVD of each client's n_c x d curvature rows and, every model round and plan, two
# products with their N x d x r bases (r <= min(n_c, d)) and one with the d x d Hessian: they grow as d (d + sum_c
# min(n_c, d)). Measured on this 2-core machine (`proposal_for`, 234 candidates, five draws, alone): MNIST 4/9, 32
# clients of 368 rows, 784 (784 + 11,791) = 9.9e6, 63 s where no candidate reaches (the first three draws of every
# one whose noise term alone does not keep it over the target run to STATIONARY_SLACK x the stationary stages'
# count); sparse41 (benchmarks/heldout_sets.py: 16 clients of 500 rows, 4,000 features), 4.8e7, 37 s and 1.6 GB
# where its plan reaches in 20 rounds, over 2^25 when that was the cap (it ran the stationary stages: 6.3x the best
# grid row; the model's plan 1.33x); a dense 30,000 x 2,000 make_classification set on 32 clients, 6.4e7, none
# reaching: `stlsgd suggest` 133 s and 4.7 GB in all. Since the averaged noise is a chi^2 draw at each evaluation and
# 16,384 is a window (275 candidates), MNIST 4/9 takes 169 s and 1.0 GB (`stlsgd suggest`, x* cached). Above
# CLIENT_MODEL_SIZE they are not built, and auto runs the stationary stages.
CLIENT_MODEL_SIZE = 2**26
# The stationary stages (no network) take their control variates from each round's first FALLBACK_SHARE of steps
# (``drift_share``). Option II's mean along a long round is biased towards each client's own corrected optimum, and a
# fixed window's noise sets a floor that stays put as eta halves and k doubles (MNIST 4/9, W 1,024: 7.5-9.4e-4 through
# stages 10 and 11, and the budget at every seed, at 2.0-2.8e-4). A share of the round grows with k. Measured against
# option II, seeds 0-2 (docs/results/schedules.md, *The stationary stages' control variates from a quarter of each
# round*): MNIST 4/9 (Table 2+'s MNIST Non-IID column) 150, 150, 160 -> 135, 130, 125; classification200 (32 clients
# of 312 rows) the budget x3 -> 160, 165, 165; parity at a 1e-5 target 140, budget, budget -> 145, 160, 135;
# make_classification 11 with a 0.5 M budget 125, 135, 130 -> 130, 135, 115; but on 4 clients 138, 135, budget ->
# budget, 95, budget. An eighth, a sixteenth and a 64th tried at seed 0: MNIST 150/175/-, the 32-client set
# 145/130/160 (a quarter: 135 and 160); a half and an eighth at seeds 0-2 on eight such configs: MNIST 150 and 150,
# parity at 1e-5 no median for either (the doc's table). With a network the periods are capped at about two rounds'
# cost in steps, short rounds where the path's bias is small: option II there, as measured.
FALLBACK_SHARE = 0.25
# Where the clients' rows are few (N x the most rows a client has x d <= TRUE_OBJECTIVE_SIZE), a Local SGD + drift pick
# is chosen once more among it and the same plan at half and a quarter of its decay constant lr / lr_decay, each at
# TRUE_PERIODS times its period (:func:`true_variants`), each run on the clients' true logistic objectives,
# without noise, until the gap is within NEAR_TARGET times the target (at most TRUE_ROUNDS rounds) and on the
# quadratics at x* from there (:func:`true_start`). The quadratic at x* is too slow far from x*, by 2-4x in the gap at
# rounds 5-10 on the sets where auto missed, and right within about ten times the target. Of the 64 held-out sets
# under the size whose auto does not run the stationary stages (all but the MNIST pairs save one of 200 rows, the
# sparse sets, w8a, a9a's test split, one of 10,000 x 200 on 32 clients and the CIFAR-10 splits), it moved 12 picks:
# make_classification 1262 2.5x -> 1.5x its grid's best, 1209_std 2.0x -> 1.0x and 1212 1.6x -> 1.5x, and none out of
# 1.5x; of seven one-field variants, parity at a 1e-5 target went out (1.38x -> 1.58x). It adds up to about 60 s to a
# proposal there (make_classification 1204: 13 -> 73 s). Blocks of TRUE_BLOCK / L_0 of lr: at a half, gaps 3% apart
# (docs/results/schedules.md, *The clients' true objectives in the early rounds*). Four times the period and the room
# of BUDGET_ROOM came after an unseen set (three clusters a class, 32 clients) ran 10 rounds where its grid's best ran
# 5: at four times the pick's period it runs 5, with the budget 1.5x the steps it reaches in; on the 64 held-out sets
# before, they moved two picks, one from 10 rounds to 5 and one to the same median, and took make_classification
# 1204's proposal from 74 to 95 s alone (*Eight more unseen sets; four times the period, and room in the budget*).
TRUE_OBJECTIVE_SIZE = 2**20
NEAR_TARGET = 10.0
TRUE_ROUNDS = 40
TRUE_BLOCK = 1.0
TRUE_PERIODS = (0.5, 1.0, 1.5, 2.0, 4.0)
BUDGET_ROOM = 1.25
# drift_rounds runs its plans in chunks whose (N, plans, d) temporaries hold about this many numbers (32 MB).
CHUNK_ENTRIES = 2**22


def _share(sigma2: float, zeta2: float) -> float:
    """zeta^2 / sigma^2, the clients' difference against the gradient noise; 0 when sigma^2 = 0 (every sample's
    gradient the same: no client can differ). Clients sample alike at most IID_SHARE."""
    return zeta2 / sigma2 if sigma2 > 0 else 0.0


@dataclass(frozen=True)
class AtOptimum:
    """The quadratic model of Eq. 8 at x* that sizes alike clients' one long round (:func:`one_round`)."""

    target_gap: float
    #: Single-sample gradient variance at x*, E_i ||grad f_i(x*)||^2.
    sigma2: float
    #: Eigenvalues h_i of the Hessian at x*, and w_i = h_i (v_i . x*)^2 / 2: what direction i holds of
    #: f(x_0) - f* in the model (x_0 = 0).
    curvatures: tuple[float, ...]
    weights: tuple[float, ...]


@dataclass(frozen=True)
class ClientsAtOptimum:
    """Each client's quadratic model of its objective f_c (Eq. 8 on its rows) at x*, which :func:`drift_rounds`
    runs drift-corrected Local SGD on: grad f_c(x) = H_c (x - x*) + g_c."""

    target_gap: float
    #: x*, and the Hessian of f at x* (the gap is (x - x*)^T H (x - x*) / 2).
    x: np.ndarray
    hessian: np.ndarray
    #: H_c's eigenvalues (N, r) and eigenvectors (N, d, r: columns) in the span of client c's rows, r at most
    #: min(rows, d) (:func:`_row_space`; a client with fewer is padded by zero columns); every direction outside
    #: that span has H_c's curvature ``lam``, the L2 term's. (N, d): each grad f_c(x*).
    curvatures: np.ndarray
    bases: np.ndarray
    lam: float
    gradients: np.ndarray
    #: The clients' own single-sample gradient variance at x*, E_c E_{i in c} ||grad f_i(x*) - grad f_c(x*)||^2:
    #: drift correction removes the part of sigma*^2 that lies between clients, not this.
    noise: float
    #: Per client a factor F_c of its single-sample gradient covariance at x* (F_c^T F_c = Sigma_c): a control
    #: variate measured over W samples is off by N(0, Sigma_c / W), drawn as F_c^T z / sqrt(W). Empty: noiseless.
    spreads: tuple[np.ndarray, ...] = ()
    #: The number of independent directions the averaged noise's gap lies in, in effect (:func:`noise_dof`, nu): at
    #: an evaluation that gap is its mean, eta noise / (4 N batch), times chi^2_nu / nu (Satterthwaite's
    #: approximation of a sum of weighted chi^2_1). inf: the mean itself.
    noise_dof: float = math.inf
    #: Per client its rows times their labels, y_i x_i (n_c x d): a sample's loss gradient at x is
    #: -sigma(-y_i x_i . x) y_i x_i, from which :func:`drift_rounds` draws a window's noise where the run is
    #: (``noise_where = "iterate"``). Empty: not kept.
    signed_rows: tuple[sp.csr_matrix | np.ndarray, ...] = ()


@dataclass(frozen=True)
class Estimates:
    n: int
    d: int
    num_clients: int
    L: float
    L_max: float
    mu: float
    sigma2: float
    zeta2: float
    #: With a target gap (f* known) and alike clients: the model at x* (else None).
    optimum: AtOptimum | None = None
    #: With a target gap and clients that differ: each client's model at x* (else None).
    clients: ClientsAtOptimum | None = None
    #: Why the clients' models were not built where they would have been (their size), for suggest to say.
    clients_skipped: str | None = None
    #: The least and largest row weight where the objective is the clients' mean of unequal shares (else None).
    row_weights: tuple[float, float] | None = None


def _sample_gradients(problem: LogisticRegression, w: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray, float]:
    """The per-sample loss gradients at ``w`` (one row each; the L2 term lam w, the same for every sample, left
    out), their mean, and sigma^2 = E_i ||grad f_i(w) - grad f(w)||^2, which that shared term does not change."""
    y = problem.y
    G = sp.diags(-y * _expit(-y * (problem.X @ w))) @ problem.X
    return G, *_spread(G)


def _spread(G: sp.csr_matrix) -> tuple[np.ndarray, float]:
    """The mean of the rows of ``G`` and their variance, E_i ||G_i - mean||^2 (at least 0)."""
    g = np.asarray(G.mean(axis=0)).ravel()
    return g, max(float(np.asarray(G.multiply(G).sum(axis=1)).mean() - g @ g), 0.0)


def at_optimum(problem: LogisticRegression, target_gap: float, cache_dir: Path | None = None) -> AtOptimum:
    """The model at x* (Newton's, or the one :meth:`LogisticRegression.optimum` cached for the target)."""
    w = problem.minimizer(cache_dir)
    sigma2 = _sample_gradients(problem, w)[2]
    h, V = np.linalg.eigh(problem.hessian(w))
    return AtOptimum(
        target_gap=target_gap,
        sigma2=sigma2,
        curvatures=tuple(h.tolist()),
        weights=tuple((0.5 * h * (V.T @ w) ** 2).tolist()),
    )


def _row_space(A: sp.csr_matrix, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """The eigenvalues and eigenvectors (d, r: columns) of A^T A + lam I in the span of A's rows, r = rank A: its
    singular values s above numerical zero (as numpy's matrix_rank) give s^2 + lam. Every other direction has lam."""
    _, s, Vt = np.linalg.svd(A.toarray(), full_matrices=False)
    keep = s > s.max(initial=0.0) * max(A.shape) * np.finfo(float).eps
    return s[keep] ** 2 + lam, Vt[keep].T


def clients_at_optimum(
    problem: LogisticRegression, partition: Partition, target_gap: float, cache_dir: Path | None = None
) -> ClientsAtOptimum:
    """Each client's quadratic model at x* (:class:`ClientsAtOptimum`): a thin SVD of each client's n_c x d
    curvature rows (:meth:`LogisticRegression.hessian_factor`), whose cost and size grow as d min(n_c, d), not d^2."""
    w = problem.minimizer(cache_dir)
    G = _sample_gradients(problem, w)[0]
    hs, Vs, gs, noise = [], [], [], []
    factors: list[np.ndarray] = []
    signed: list[sp.csr_matrix | np.ndarray] = []
    for c in range(partition.num_clients):
        rows = partition.client_rows(c)
        signed.append(_compact(sp.csr_matrix(sp.diags(problem.y[rows]) @ problem.X[rows])))
        h, V = _row_space(problem.hessian_factor(w, rows), problem.lam)
        gc, spread = _spread(G[rows])
        hs.append(h)
        Vs.append(V)
        gs.append(gc + problem.lam * w)
        noise.append(spread)
        centred = (G[rows].toarray() - gc) / math.sqrt(len(rows))  # centred^T centred = Sigma_c
        factors.append(centred if centred.shape[0] <= centred.shape[1] else np.asarray(np.linalg.qr(centred, mode="r")))
    r = max(len(h) for h in hs)  # clients of lower rank padded: curvature lam, a zero column (no effect)
    hessian = problem.hessian(w)
    return ClientsAtOptimum(
        target_gap=target_gap,
        x=w,
        hessian=hessian,
        curvatures=np.array([np.pad(h, (0, r - len(h)), constant_values=problem.lam) for h in hs]),
        bases=np.array([np.pad(V, ((0, 0), (0, r - V.shape[1]))) for V in Vs]),
        lam=problem.lam,
        gradients=np.array(gs),
        noise=float(np.mean(noise)),
        spreads=tuple(factors),
        noise_dof=noise_dof(hessian, sum(f.T @ f for f in factors) / len(factors)),
        signed_rows=tuple(signed),
    )


def _compact(A: sp.csr_matrix) -> sp.csr_matrix | np.ndarray:
    """``A`` as a dense array where at least a quarter of it is stored: the products of :func:`_draws_at` run
    about 9x faster on CIFAR-10's pixels that way (25 x 3,072 a client, all but 0.5% of it nonzero)."""
    return A.toarray() if A.nnz >= 0.25 * A.shape[0] * A.shape[1] else A


def noise_dof(H: np.ndarray, Sigma: np.ndarray) -> float:
    """In how many independent directions, in effect, SGD's stationary gap on the quadratic (x - x*)^T H (x - x*) / 2
    lies, with gradient noise covariance Sigma: that gap is sum_j s_j z_j^2 (z_j ~ N(0, 1)), s_j the eigenvalues of
    H^1/2 P H^1/2 / 2, P the iterates' covariance, H P + P H = eta Sigma (the continuous Lyapunov equation; in H's
    eigenbasis P_ij = eta Sigma_ij / (h_i + h_j)), and nu = (sum_j s_j)^2 / sum_j s_j^2 (inf where there is no noise).
    Its mean, eta tr(Sigma) / 4, is the model's averaged noise term; on make_classification 11 (16 clients) nu = 1.17,
    93 % of it along one direction, so the gap at an evaluation is under half that mean at one evaluation in two."""
    h, V = np.linalg.eigh(H)
    h = np.clip(h, 0.0, None)
    root = np.sqrt(h)
    with np.errstate(invalid="ignore", divide="ignore"):
        M = np.nan_to_num(np.outer(root, root) * (V.T @ Sigma @ V) / np.add.outer(h, h))
    s = np.clip(np.linalg.eigvalsh(M), 0.0, None)
    return float(s.sum() ** 2 / (s**2).sum()) if s.sum() > 0 else math.inf


def _passes(m: ClientsAtOptimum, bias: np.ndarray | float, mean: np.ndarray) -> np.ndarray:
    """The chance that an evaluation's gap, ``bias`` plus the averaged noise's (``mean`` in the mean, drawn as
    :attr:`ClientsAtOptimum.noise_dof` says), is under the target; 0 where ``mean`` is nan (no evaluation)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        room = np.where(mean > 0, (m.target_gap - bias) / mean, np.where(bias <= m.target_gap, np.inf, -np.inf))
    chance = (room >= 1.0).astype(float) if math.isinf(m.noise_dof) else chi2.cdf(room * m.noise_dof, m.noise_dof)
    return np.where(np.isnan(mean), 0.0, chance)


def _misses_from(m: ClientsAtOptimum, plan: PlanRounds, max_rounds: int, every: int) -> np.ndarray:
    """The chance that ``plan``'s evaluations from the i-th on all miss the target with no bias at all, for i = 0 ..
    max_rounds // every (the last: none left, 1)."""
    mean = plan.lasts(max_rounds, every) * m.noise / (4 * m.gradients.shape[0] * plan.batch)
    return np.append(np.cumprod((1.0 - _passes(m, 0.0, mean))[::-1])[::-1], 1.0)


def _moved(
    m: ClientsAtOptimum,
    e: np.ndarray,
    g: np.ndarray,
    ue: np.ndarray,
    ug: np.ndarray,
    sums: np.ndarray,
    out: np.ndarray | None = None,
    scratch: np.ndarray | None = None,
) -> np.ndarray:
    """Each client's model minus x* (N, P, d) after steps whose lr sums are ``sums`` (4, P: S1, S2, S3 and the
    largest lr, :class:`RoundSums`), from ``e`` (P, d), the average's error, with ``g`` (N, P, d), its fixed point's
    gradient term; ``ue`` and ``ug`` are both in the clients' bases (N, P, r) (:func:`drift_rounds`). Along
    curvature h the error shrinks by s(h) = exp(-h S1 - h^2 S2 / 2 - h^3 S3 / 3) and g pulls by (1 - s(h)) / h:
    outside the bases h = lam, inside the difference. Where a step's lr eta has eta h >= 1, s(h) = 0: the
    quadratic's factor 1 - eta h would overshoot, but the logistic loss's gradients are bounded (|grad f_i| <=
    ||x_i||), so such steps saturate the margins along h instead of diverging, and the smaller steps after them
    settle it (:func:`first_step`). Written into ``out`` (N, P, d), with ``scratch`` of that shape for a product,
    where given."""
    S1, S2, S3, top = (s[None, :, None] for s in sums)

    def shrink_pull(h: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:  # h > 0: lam > 0 (Eq. 8)
        x = h * S1 + h**2 * S2 / 2 + h**3 * S3 / 3
        over = h * top >= 1.0
        return np.where(over, 0.0, np.exp(-x)), np.where(over, 1.0 / h, -np.expm1(-x) / h)

    s_h, p_h = shrink_pull(m.curvatures[:, None, :])  # (N, P, r)
    s_l, p_l = shrink_pull(m.lam)  # (1, P, 1)
    inside = (s_h - s_l) * ue - (p_h - p_l) * ug
    # s_l e - p_l g + inside V^T, in place: each (N, P, d) temporary is memory's time on CIFAR-10's pixels
    out = np.multiply(p_l, g, out=out)
    np.subtract(s_l * e[None], out, out=out)
    out += np.matmul(inside, m.bases.transpose(0, 2, 1), out=scratch)
    return out


class RoundSums(NamedTuple):
    """What :func:`drift_rounds` reads of one round: S_j = sum_t eta_t^j (j = 1, 2, 3) and the largest eta_t, over its
    learning rates and over its window's, its last learning rate, and the samples its control variates are measured
    on."""

    sums: list[float]
    window: list[float]
    last: float
    samples: float


class PlanRounds:
    """One plan's rounds as :func:`drift_rounds` reads them (:class:`RoundSums`), None from the round it stops at
    (over the plans' cap on a period or over ``budget``).
    Built as far as asked and kept: a plan's rounds do not depend on the noise, so the draws of
    :func:`fewest_median_rounds` build them once; a round's sums only when read (:meth:`lasts` needs none).
    ``window``: the control variates from each round's first ``window`` steps (None: the whole round's, option II)."""

    def __init__(self, plan: Plan, window: int | None, batch: int, budget: int | None) -> None:
        self.window, self.batch = window, batch
        self._plan, self._budget = plan, budget
        self._cursor = Cursor()
        self._rounds: list[Round] = []
        self._sums: list[RoundSums] = []
        self._stopped = False

    def _round(self, r: int) -> Round | None:
        while len(self._rounds) <= r and not self._stopped:
            rnd = self._plan.next_round(self._cursor)
            self._cursor = self._plan.advance(self._cursor, rnd)
            # A round over the plans' cap on a period (a stage of Algorithm 2 without a budget) is out of reach. So is
            # one that would cross the budget: the executors cut it there and end the run, so a plan that misses in
            # it never reaches; counted at a third of the target, it ended a make_blobs run at its budget
            # (docs/results/schedules.md, *The budget's last round, in the clients' model*).
            if rnd.lr is None:
                raise ValueError("the clients' model runs plans that set their learning rates")
            over = rnd.steps > DEFAULT_K_MAX or (self._budget is not None and self._cursor.iteration > self._budget)
            if over:
                self._stopped = True
                break
            self._rounds.append(rnd)
        return self._rounds[r] if r < len(self._rounds) else None

    def __getitem__(self, r: int) -> RoundSums | None:
        if self._round(r) is None:
            return None
        while len(self._sums) <= r:
            lrs = self._rounds[len(self._sums)].learning_rates()
            seen = len(lrs) if self.window is None else min(self.window, len(lrs))
            self._sums.append(
                RoundSums(
                    [*(np.add.reduce(lrs**p) for p in (1, 2, 3)), float(lrs.max())],
                    [*(np.add.reduce(lrs[:seen] ** p) for p in (1, 2, 3)), float(lrs[:seen].max())],
                    float(lrs[-1]),
                    float(seen * self.batch),
                )
            )
        return self._sums[r]

    def lasts(self, rounds: int, every: int) -> np.ndarray:
        """The learning rate at the last step of each round among the first ``rounds`` that an evaluation every
        ``every`` rounds sees (nan where the plan has stopped before it: no evaluation there reaches)."""
        evaluated = [self._round(r - 1) for r in range(every, rounds + 1, every)]
        return np.array(
            [math.nan if x is None or x.lrs is None else x.lrs(np.array([x.end_iteration - 1]))[0] for x in evaluated]
        )


def plan_rounds(
    m: ClientsAtOptimum,
    plans: Sequence[Plan],
    windows: Sequence[int | None] | None = None,
    batch: int = 1,
    budget: int | None = None,
) -> list[PlanRounds]:
    """Each plan's :class:`PlanRounds` in the clients' models ``m`` (with ``windows[j]``, plan j's control variates
    from each round's first W steps; within ``budget`` steps)."""
    windows = [None] * len(plans) if windows is None else windows
    return [PlanRounds(plan, window, batch, budget) for plan, window in zip(plans, windows, strict=True)]


class Start(NamedTuple):
    """Where a plan goes on from in the clients' quadratic models (:func:`true_start`): the rounds it has run, the
    averaged model x after them and each client's control variate (N, d)."""

    rounds: int
    x: np.ndarray
    control: np.ndarray


def _blocks(rnd: Round, window: int | None, cap: float) -> tuple[np.ndarray, int, float]:
    """A round's learning rates merged into blocks, each ending at the step where the running sum passes a multiple
    of ``cap`` (about ``cap`` of lr each; a larger single step is one block): each block's sum, the index of the
    block that ends the ``window``'s steps (all of them without one), and the window's sum S1."""
    lrs = rnd.learning_rates()
    total = np.cumsum(lrs)
    seen = len(lrs) if window is None else min(window, len(lrs))
    ends = np.searchsorted(total, np.arange(cap, total[-1], cap), side="left") + 1
    ends = np.unique(np.concatenate([ends, [seen, len(lrs)]]))
    return np.diff(total[ends - 1], prepend=0.0), int(np.searchsorted(ends, seen)), float(total[seen - 1])


def true_fits(m: ClientsAtOptimum) -> bool:
    """Whether the clients' rows are few enough for :func:`true_start`: N x the most rows a client has x d at most
    TRUE_OBJECTIVE_SIZE."""
    rows = max((Z.shape[0] for Z in m.signed_rows), default=0)
    return bool(m.signed_rows) and len(m.signed_rows) * rows * m.x.shape[0] <= TRUE_OBJECTIVE_SIZE


def true_start(m: ClientsAtOptimum, plans: Sequence[PlanRounds]) -> list[Start | None]:
    """Each plan's first rounds of drift-corrected Local SGD (SCAFFOLD, option II, with the plan's window) on the
    clients' own logistic objectives, with full gradients and no noise, from x_0 = 0 until the averaged model's gap
    (x - x*)^T H (x - x*) / 2 is within NEAR_TARGET times the target: where :func:`drift_rounds` goes on from (None
    where a plan is not that near within TRUE_ROUNDS rounds, or stops before, at the budget or the plans' cap).

    The quadratic at x* is right near x* and too slow before. On make_classification with one class a tenth of the
    rows (16 clients, the grid's setting: lr 3.2, lr / lr_decay 3,200, k 81,920, W 256) the quadratic from x_0 had
    the gap at 1.7e-3, 3.0e-4 and 1.3e-4 at rounds 5, 10 and 15, where these rounds have 7.8e-4, 1.23e-4 and 5.9e-5
    and the simulator at batch 32 (a 32nd of the noise) 7.4e-4, 1.28e-4 and 5.9e-5; from these rounds' state after
    round 5 (7.8e-4) the quadratic has 1.3e-4 and 5.9e-5 at rounds 10 and 15 (docs/results/schedules.md, *Curvature
    along the run, and the clients' true objectives without noise*).

    A round's learning rates are merged into blocks of about TRUE_BLOCK / L_0 of lr, L_0 the clients' largest
    curvature at x_0 = 0, where the logistic loss's curvature is largest: each block is one stable step of gradient
    descent. A single larger step stays one step (a first step of N/(2L)). The plans run side by side, block by
    block, the clients' rows padded with zero rows (whose gradient is 0) into one (N, rows, d) array."""
    rows = [Z.toarray() if isinstance(Z, sp.spmatrix) else np.asarray(Z) for Z in m.signed_rows]
    n, d = m.gradients.shape
    Z = np.zeros((n, max(len(z) for z in rows), d))
    for c, z in enumerate(rows):
        Z[c, : len(z)] = z
    share = np.array([1.0 / len(z) for z in rows])[:, None, None]
    cap = TRUE_BLOCK / (max(float(np.linalg.norm(z, 2)) ** 2 / (4 * len(z)) for z in rows) + m.lam)
    count = len(plans)
    x, y, window = np.zeros((count, d)), np.zeros((n, count, d)), np.zeros((n, count, d))
    control, delta = np.zeros((n, count, d)), np.zeros((n, count, d))
    done = [0] * count  # rounds run
    at = [0] * count  # the next block of the round
    blocks: dict[int, tuple[np.ndarray, int, float]] = {}  # the live plans' rounds
    out: list[Start | None] = [None] * count
    live = []
    for j, plan in enumerate(plans):
        first = plan._round(0)
        if first is not None:
            blocks[j] = _blocks(first, plan.window, cap)
            live.append(j)
    while live:
        idx = np.array(live)
        steps = np.array([blocks[j][0][at[j]] for j in live])
        ya = y[:, idx]
        weights = _expit(-np.matmul(ya, Z.transpose(0, 2, 1)))  # (N, P, rows): sigma(-y_i x_i . y)
        grad = -np.matmul(weights, Z) * share + m.lam * ya + delta[:, idx]
        y[:, idx] = ya - steps[None, :, None] * grad
        for j in list(live):
            sums, last, s1 = blocks[j]
            if at[j] == last:
                window[:, j] = y[:, j]
            at[j] += 1
            if at[j] < len(sums):
                continue
            # the round's end: c_c <- c_c - c + (x - y_c) / S1 (rules.update_control), then x <- mean_c y_c
            control[:, j] += (x[j] - window[:, j]) / s1 - control[:, j].mean(axis=0)
            delta[:, j] = control[:, j].mean(axis=0) - control[:, j]
            x[j] = y[:, j].mean(axis=0)
            y[:, j] = x[j]
            done[j] += 1
            at[j] = 0
            err = x[j] - m.x
            if 0.5 * err @ m.hessian @ err <= NEAR_TARGET * m.target_gap:
                out[j] = Start(done[j], x[j].copy(), control[:, j].copy())
                live.remove(j)
                continue
            following = plans[j]._round(done[j]) if done[j] < TRUE_ROUNDS else None
            if following is None:
                live.remove(j)
            else:
                blocks[j] = _blocks(following, plans[j].window, cap)
    return out


def drift_rounds(
    m: ClientsAtOptimum,
    plans: Sequence[PlanRounds],
    *,
    every: int = 1,
    max_rounds: int,
    seeds: int | Sequence[int] = 0,
    stop: Callable[[int, list[int | None]], bool] | None = None,
    noise_where: Literal["optimum", "iterate"] = "optimum",
    start: Start | None = None,
) -> list[int | None]:
    """For each plan (its rounds as it gives them without feedback, :func:`plan_rounds`): the rounds it takes, with
    drift correction (SCAFFOLD, option II; with a ``window`` W, the control variates from each round's first W
    steps, :class:`~stlsgd.executors.rules.RoundRule`'s ``drift_window``), from x_0 = 0 to the target gap in the
    clients' quadratic models at x*, counted at evaluations every ``every`` rounds; None when not within
    ``max_rounds`` rounds, where :class:`PlanRounds` stops (the budget, the plans' cap on a period), or not by the
    evaluation at which ``stop(round, reached so far)`` holds.

    Each round, client c steps from the averaged model x with its correction delta_c = c - c_c on the round's
    learning rates eta_t: in its eigenbasis the error to its fixed point z_c = x* - H_c^-1 (g_c + delta_c) shrinks
    by prod_t (1 - eta_t h), taken as exp(-h S1 - h^2 S2 / 2 - h^3 S3 / 3) with S_j = sum_t eta_t^j (0 where some
    eta_t h >= 1: :func:`_moved`); then
    c_c <- c_c - c + (x - y_c) / S1 (:func:`~stlsgd.executors.rules.update_control`; y_c and S1 those of the
    window's steps) plus the noise of a mean of the window's (or round's) W batch samples, drawn as N(0,
    WINDOW_NOISE Sigma_c / (W batch)) (:attr:`ClientsAtOptimum.spreads`; one draw per client and round from plan
    j's seed, ``seeds[j]`` or the one ``seeds``: plans of the same seed see the same draws), and x <- mean_c y_c. The
    gap at an evaluation is the bias (x - x*)^T H (x - x*) / 2 plus the N clients' averaged noise at the round's last
    step, eta sigma_c^2 / (4 N batch) in the mean (sigma_c^2 the clients' own variance, :attr:`ClientsAtOptimum.noise`),
    at each evaluation that mean times chi^2_nu / nu (:attr:`ClientsAtOptimum.noise_dof`), independent of the one
    before (the steep directions it lies in settle within a round). A plan reaches at the first evaluation by which
    it has been under the target with a chance of a half: its runs' median, given the draw of the window's noise.
    With ``noise_where = "iterate"`` (and the clients' rows kept, :attr:`ClientsAtOptimum.signed_rows`) the window's
    noise is drawn from Sigma_c at each plan's averaged model instead of at x* (:func:`_draws_at`), per plan.
    With a ``start`` every plan goes on from that state after its rounds (:func:`true_start`), not from x_0 = 0.

    The plans run side by side, so that each pass over the clients' N x d x r bases serves all of them, in chunks
    of about CHUNK_ENTRIES numbers a temporary; a plan leaves the arrays once it reaches or stops, and one whose
    averaged noise alone, with no bias, would not reach (:meth:`PlanRounds.lasts`) never enters."""
    n, d = m.gradients.shape
    count = len(plans)
    if not count:
        return []
    seed_of = np.full(count, seeds) if isinstance(seeds, int) else np.asarray(seeds)
    rngs = [np.random.default_rng(s) for s in np.unique(seed_of).tolist()]
    draw_of = np.searchsorted(np.unique(seed_of), seed_of)  # each plan's row of the round's draws
    windowed = np.array([p.window is not None for p in plans])
    batch = np.array([p.batch for p in plans], dtype=float)
    # a plan's sums once it has read a round (the window's are the round's without one)
    sums, wsums, last, samples = np.ones((4, count)), np.ones((4, count)), np.zeros(count), np.ones(count)
    reached: list[int | None] = [None] * count
    # A plan whose evaluations all miss the target with a chance over a half even with no bias (the bias is >= 0)
    # never reaches and is not run; one whose chance of having missed so far, times that of the evaluations left with
    # no bias, is over a half leaves the arrays. On MNIST 4/9 (32 clients), where no candidate reaches, 36 of 234 are
    # never run (134 with the noise taken at its mean, when the proposal took 86 s; 219 s with the chance before plans
    # left on the way, 190 s after).
    rest = np.array([_misses_from(m, p, max_rounds, every) for p in plans])
    live = np.flatnonzero(rest[:, 0] <= 0.5)
    # the plans still run, in the order of e's rows and control's columns
    e = np.tile(-m.x if start is None else start.x - m.x, (len(live), 1))  # x - x*, from x_0 = 0 or the start
    control = np.zeros((n, len(live), d)) if start is None else np.repeat(start.control[:, None], len(live), axis=1)
    missed = np.ones(len(live))  # the chance that no evaluation so far was under the target
    chunk = max(CHUNK_ENTRIES // (n * d), 1)
    at_iterate = noise_where == "iterate" and bool(m.signed_rows)
    # A chunk's five (N, P, d) arrays, and the round's draws at the iterates, are held from round to round:
    # allocated anew each time, their pages cost the kernel about 21 of the 30 system seconds of a proposal on
    # CIFAR-10's pixels (docs/results/schedules.md, *The clients' model's steps in place*).
    space = np.empty((5, n * min(chunk, len(live)) * d))
    draw_space = np.empty(n * len(live) * d if at_iterate else 0)
    for r in range(1 if start is None else start.rounds + 1, max_rounds + 1):
        keep = np.ones(len(live), dtype=bool)
        for i, j in enumerate(live.tolist()):
            got = plans[j][r - 1]
            if got is None:
                keep[i] = False
            else:
                sums[:, j], wsums[:, j], last[j], samples[j] = got
        if not keep.all():
            live, e, control, missed = live[keep], e[keep], control[:, keep], missed[keep]
        if not len(live):
            break
        draws = None
        if at_iterate:  # (N, P, d): each plan's N(0, Sigma_c(x)) at its own averaged model x
            normals = [[rng.standard_normal(Z.shape[0]) for Z in m.signed_rows] for rng in rngs]
            draws = _draws_at(
                m,
                m.x + e,
                [np.array([normals[k][c] for k in draw_of[live]]) for c in range(n)],
                draw_space[: e.size * n].reshape(n, *e.shape),
            )
        elif m.spreads:  # (N, seeds, d): each seed's N(0, Sigma_c) for every client
            draws = np.array([[f.T @ rng.standard_normal(f.shape[0]) for f in m.spreads] for rng in rngs])
            draws = draws.transpose(1, 0, 2)
        for a in range(0, len(live), chunk):
            at = live[a : a + chunk]
            ctrl, ea = control[:, a : a + chunk], e[a : a + chunk]
            delta, g, moved, measured, scratch = (s[: ctrl.size].reshape(ctrl.shape) for s in space)  # (N, P, d)
            np.subtract(ctrl.mean(axis=0), ctrl, out=delta)
            np.add(m.gradients[:, None, :], delta, out=g)
            ue, ug = np.matmul(ea, m.bases), np.matmul(g, m.bases)  # both in client c's basis: (N, P, r)
            _moved(m, ea, g, ue, ug, sums[:, at], moved, scratch)
            # where each plan's control variates are read: its window's end, else the round's
            w = windowed[at]
            if w.all():
                _moved(m, ea, g, ue, ug, wsums[:, at], measured, scratch)
            else:
                np.copyto(measured, moved)
                if w.any():
                    measured[:, w] = _moved(m, ea[w], g[:, w], ue[:, w], ug[:, w], wsums[:, at[w]])
            # the new control variates, -delta + (x - y_c) / S1 (+ the window's noise), written into control
            np.subtract(ea[None], measured, out=measured)
            measured /= wsums[0, at][None, :, None]
            np.subtract(measured, delta, out=ctrl)
            if draws is not None:
                rows = slice(a, a + len(at)) if at_iterate else draw_of[at]
                ctrl += np.multiply(draws[:, rows], np.sqrt(WINDOW_NOISE / samples[at])[None, :, None], out=scratch)
            e[a : a + chunk] = moved.mean(axis=0)
        if r % every:
            continue
        bias = 0.5 * np.einsum("cd,cd->c", e @ m.hessian, e)
        missed *= 1.0 - _passes(m, bias, last[live] * m.noise / (4 * n * batch[live]))
        done = missed <= 0.5
        for j in live[done].tolist():
            reached[j] = r
        out = done | (missed * rest[live, r // every] > 0.5)
        if out.any():
            live, e, control, missed = live[~out], e[~out], control[:, ~out], missed[~out]
        if stop is not None and stop(r, reached):
            break
    return reached


def _draws_at(
    m: ClientsAtOptimum, x: np.ndarray, normals: list[np.ndarray], out: np.ndarray | None = None
) -> np.ndarray:
    """(N, P, d): at each of P points ``x`` (P, d), each client's draw of N(0, Sigma_c(x)), its single-sample
    gradient covariance there, from ``normals[c]`` (P, n_c) standard normals: sum_i (z_i - mean z) g_i(x) /
    sqrt(n_c), whose covariance is Sigma_c(x) (the L2 term, the same for every sample, drops out). Written into
    ``out`` where given."""
    out = np.empty((len(m.signed_rows), *x.shape)) if out is None else out
    for c, (Z, z) in enumerate(zip(m.signed_rows, normals, strict=True)):
        weights = _expit(-(Z @ x.T)) * (z - z.mean(axis=1, keepdims=True)).T  # (n_c, P)
        np.negative((Z.T @ weights).T, out=out[c])
        out[c] /= math.sqrt(Z.shape[0])
    return out


def stl_rounds(e: Estimates, noise: float, target_gap: float, every: int, batch: int = 1) -> int:
    """The rounds STL-SGD^sc + drift (``auto``'s stationary stages) spends at least, by a count, not a model: the
    stages that halve eta_1 = N/(2L) down to where the N clients' averaged noise, eta noise / (4 N batch), is a
    third of the target, at two windows of the stationarity test a stage."""
    lr_noise = noise_lr(e.num_clients, noise, target_gap, batch)
    stages = max(math.ceil(math.log2(e.num_clients / (2.0 * e.L) / lr_noise)), 1) if lr_noise < math.inf else 1
    return 2 * max(every, STATIONARY_WINDOW) * stages


def noise_lr(num_clients: int, noise: float, target_gap: float, batch: int = 1) -> float:
    """The lr at which the N clients' averaged noise, eta noise / (4 N batch), is a third of the target (inf
    without noise)."""
    return 4.0 * num_clients * batch * target_gap / (3.0 * noise) if noise > 0 else math.inf


def stationary_halvings(e: Estimates, batch: int = 1) -> int | None:
    """The fewest halvings of the stationary stages' eta_1 = N/(2L) that take it under :func:`noise_lr` with the
    clients' own noise at x* (:attr:`ClientsAtOptimum.noise`), at which ``auto`` stops halving it; None without the
    clients' models. Below that eta the averaged noise is under a third of the target, and what is left of the gap is
    bias, which a smaller eta only slows: on CIFAR-10 cats and dogs (seed 1) the stages took eta on to a quarter of
    it, the gap still 13x the target at half of it, and ran out the budget (docs/results/schedules.md, *A floor on
    the stationary stages' eta*)."""
    if e.clients is None:
        return None
    lr_noise = noise_lr(e.num_clients, e.clients.noise, e.clients.target_gap, batch)
    if lr_noise == math.inf:
        return 0
    return max(math.floor(math.log2(e.num_clients / (2.0 * e.L) / lr_noise)) + 1, 0)


def estimate(
    problem: LogisticRegression,
    partition: Partition,
    iterations: int = 200,
    target_gap: float | None = None,
    cache_dir: Path | None = None,
    client_models: bool = True,
) -> Estimates:
    """The constants of Theorem 2 for ``problem`` on ``partition`` (see the module docstring), and with a target
    gap the model at x* :func:`one_round` plans from, or where clients differ (and ``client_models``) each client's,
    :func:`drift_pick`'s."""
    X, lam, n, d = problem.X, problem.lam, problem.num_samples, problem.X.shape[1]
    v = np.random.default_rng(0).standard_normal(d)
    L = 0.0
    for _ in range(iterations):  # power iteration on H(0) = X^T X / (4n) + lam I (X^T diag(weights) X: row weights)
        v = X.T @ (X @ v if problem.weights is None else problem.weights * (X @ v)) / (4 * n) + lam * v
        L = float(np.linalg.norm(v))
        if not (L > 0 and math.isfinite(L)):
            raise StlsgdError("suggest: the Hessian at x_0 is zero or not finite (no features?); cannot estimate L")
        v /= L
    rows = np.asarray(X.multiply(X).sum(axis=1)).ravel()
    G, g, sigma2 = _sample_gradients(problem, np.zeros(d))  # at x_0 = 0
    clients = np.array(
        [np.asarray(G[partition.client_rows(c)].mean(axis=0)).ravel() for c in range(partition.num_clients)]
    )
    # around grad f(x_0): the samples' mean, or where rows carry weights the clients' mean (what those weights make f)
    centre = g if problem.weights is None else clients.mean(axis=0)
    zeta2 = max(float(np.mean(np.sum((clients - centre) ** 2, axis=1))), 0.0)
    differ = target_gap is not None and _share(sigma2, zeta2) > IID_SHARE
    size = d * (d + int(np.minimum(partition.sizes, d).sum()))
    skipped = (
        f"the clients' models at x* not built: d (d + sum_c min(n_c, d)) = {size:.3g} is over "
        f"{CLIENT_MODEL_SIZE:.3g} (their cost grows as that: 63 s at MNIST 4/9's 9.9e6 where no plan reaches)"
        if client_models and differ and size > CLIENT_MODEL_SIZE
        else None
    )
    return Estimates(
        n=n,
        d=d,
        num_clients=partition.num_clients,
        L=L,
        L_max=float(rows.max() / 4 + lam),
        mu=lam,
        sigma2=sigma2,
        zeta2=zeta2,
        # With a target, the model at x* sizes alike clients' one round, and the clients' models (each client's
        # Hessian in its rows' span) choose between the two plans of clients that differ (:func:`propose`).
        optimum=at_optimum(problem, target_gap, cache_dir)
        if target_gap is not None and _share(sigma2, zeta2) <= IID_SHARE
        else None,
        clients=clients_at_optimum(problem, partition, target_gap, cache_dir)
        if target_gap is not None and client_models and differ and skipped is None
        else None,
        clients_skipped=skipped,
        row_weights=None if problem.weights is None else (float(problem.weights.min()), float(problem.weights.max())),
    )


def theorem2(e: Estimates) -> dict[str, float]:
    """Theorem 2's values at its largest step eta_1 = 1/(6L), IID and Non-IID."""
    eta = 1.0 / (6.0 * e.L)
    k_iid = min(1.0 / (6 * eta * e.L * e.num_clients), 1.0 / (9 * eta * e.L))
    k_non = (
        min(
            math.sqrt(e.sigma2) / math.sqrt(6 * eta * e.L * e.num_clients * (e.sigma2 + 4 * e.zeta2)),
            1.0 / (9 * eta * e.L),
        )
        if e.sigma2 > 0
        else k_iid
    )
    return {"lr": eta, "T1": 6.0 / (e.mu * eta), "k1_iid": k_iid, "k1_noniid": k_non}


def _round_bytes(e: Estimates) -> int:
    """What a client sends a round with drift correction: x and its control variate, float64."""
    return 2 * 8 * e.d


def round_in_steps(e: Estimates, network: Network) -> float:
    """q: what one round's communication costs, in client-steps."""
    assert network.step_s is not None  # the config refuses a network without a step's time
    return (network.latency_s + _round_bytes(e) / network.bandwidth_Bps) / network.step_s


def model_gap(e: Estimates, lr: float, c: float, steps: int, batch: int = 1) -> float:
    """The gap f - f* after one round of ``steps`` steps from x_0 = 0 on eta_t = lr / (1 + lr t / c) (c / t once
    t >> c / lr), averaged over the N clients, in the quadratic model at x*: the bias sum_i w_i D^(-2 c h_i),
    D = 1 + lr steps / c = lr / eta_K (prod_t (1 - eta_t h) ~ exp(-h sum_t eta_t) = D^(-c h)), plus the N
    clients' averaged noise at the last lr, eta_K sigma*^2 / (4 N batch) (SGD's stationary spread on a quadratic,
    E[f - f*] = eta tr(Sigma) / 4)."""
    o = e.optimum
    assert o is not None
    D = 1.0 + lr * steps / c
    h, w = np.asarray(o.curvatures), np.asarray(o.weights)
    return float(np.sum(w * D ** (-2.0 * c * h))) + lr / D * o.sigma2 / (4.0 * e.num_clients * batch)


def one_round(e: Estimates, lr: float, batch: int = 1, max_steps: int = MAX_STEPS) -> tuple[float, int]:
    """(c, K): the decay constant of eta_t = lr / (1 + lr t / c) and the fewest steps K <= ``max_steps`` for which
    :func:`model_gap` is at most the target / ONE_ROUND_MARGIN, over c = 1/mu (every direction's bias falls at
    least as fast as 1/t^2) halved down to 1/h_max; when no K up to ``max_steps`` gets there, all of them at the c
    whose model gap after them is least."""
    o = e.optimum
    assert o is not None
    goal, cs = o.target_gap / ONE_ROUND_MARGIN, []
    c = 1.0 / e.mu
    while c * max(o.curvatures) >= 1.0:
        cs.append(c)
        c /= 2.0
    at_most = {c: model_gap(e, lr, c, max_steps, batch) for c in cs}  # the least each c can reach
    best: tuple[float, int] | None = None
    for c in cs:
        if at_most[c] <= goal:
            lo, hi = 0, max_steps  # model_gap falls with the steps: the fewest that reach the goal, by bisection
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if model_gap(e, lr, c, mid, batch) <= goal else (mid, hi)
            if best is None or hi < best[1]:
                best = (c, hi)
    return best if best is not None else (min(cs, key=at_most.__getitem__), max_steps)


def propose(
    e: Estimates,
    network: Network | None = None,
    batch: int = 1,
    max_iterations: int | None = None,
    eval_every: int = 1,
) -> dict[str, Any]:
    """The settings ``algorithm.auto`` runs with (see the module docstring), and why; ``max_iterations`` is the
    run's budget, which the one round of alike clients fits in; ``eval_every`` the rounds between the run's
    evaluations, at which the clients' model counts rounds as the run does."""
    share = _share(e.sigma2, e.zeta2)
    # sigma^2 = 0: every sample has the same gradient at x_0, nothing to average away and no clients differ.
    fallback = "sigma^2 = 0 (every sample's gradient at x_0 is the same): treated as IID" if e.sigma2 <= 0 else None
    lr = e.num_clients / (2.0 * e.L)
    T1 = max(int(math.ceil(1.0 / (e.mu * lr))), 1)
    drift = share > IID_SHARE
    if not drift and e.optimum is not None:
        # Alike clients and a target: one round as long as the model says the target needs. No average happens
        # before its end, so each client runs at a single client's step, 1/(2L).
        lr1 = 1.0 / (2.0 * e.L)
        c, steps = one_round(e, lr1, batch, MAX_STEPS if max_iterations is None else max_iterations)
        gap = model_gap(e, lr1, c, steps, batch)
        short = gap > e.optimum.target_gap / ONE_ROUND_MARGIN
        if not short or max_iterations is not None:
            return {
                "method": "local_sgd",
                "lr": lr1,
                "lr_decay": lr1 / c,
                "k": float(steps),
                "drift": False,
                "model_gap": gap,
                # The budget is too short for the round the model asks for: the whole budget, at its best decay.
                "fallback": f"the budget, {steps} steps, is shorter than the round the target needs in the model "
                "at x*: one round of all of it"
                if short
                else fallback,
            }
        fallback = f"no round up to {MAX_STEPS} steps reaches the target in the model at x*"
    if not drift:
        # Alike clients: STL's eta k = constant on eta_t = eta_1 / (1 + mu eta_1 t), the 1/(mu t) decay of
        # strongly convex SGD, instead of halving eta once a stage (LR-coupled STL).
        return {
            "method": "lr_coupled",
            "lr": lr,
            "lr_decay": e.mu * lr,
            "k": float(min(IID_K1_STAGES * T1, DEFAULT_K_MAX)),  # the plans' cap on a period
            "T1": T1,
            "drift": False,
            "fallback": fallback,
        }
    if e.clients is not None and network is None:
        stl = stl_rounds(e, e.clients.noise, e.clients.target_gap, eval_every, batch)
        pick = drift_pick(e, e.clients, STATIONARY_SLACK * stl, batch, max_iterations, eval_every)
        if pick is not None:
            return {**pick, "stl_rounds": stl}
        fallback = (
            "no Local SGD + drift or STL-SGD^sc + drift schedule tried reaches the target in the clients' models at x* "
            "(with the control variates' noise drawn at x*, or where the best so found does not reach with it drawn at "
            f"each round's averaged model, drawn there) in fewer than {STATIONARY_SLACK * stl} rounds "
            f"({STATIONARY_SLACK} x the stationary stages' count, {stl})"
        )
    elif network is None and e.clients_skipped is not None:
        fallback = e.clients_skipped
    k = max(T1 // math.ceil(R_NONIID * math.sqrt(1 + 4 * share)), min(MIN_K1, T1 // 2), 1)
    k_max = None
    if network is not None:
        k_max = max(math.ceil(NETWORK_CAP * round_in_steps(e, network) - 1e-9), 1)
        k = min(k, k_max)
    return {
        "method": "stl_sc",
        "lr": lr,
        "T1": T1,
        "k": float(k),
        "k_max": k_max,
        "drift": True,
        "drift_share": FALLBACK_SHARE if network is None else None,
        "iid": True,
        # Clients that differ: a stage ends when the run is stationary (at most T_s), not after a fixed R rounds,
        # and, while the period is short against the budget, once its returns diminish.
        "stage_end": "stationary",
        # Not with a network: that rule buys rounds with steps, which a priced step makes a loss (it spent MNIST's
        # budget at k_max = 2q on two seeds of three, and a9a took 321 ms instead of 285).
        "diminishing_k": None
        if network is not None or max_iterations is None
        else max(max_iterations // DIMINISHING_BUDGET, 1),
        "halvings": stationary_halvings(e, batch) if network is None else None,
        "rounds_per_stage": math.ceil(T1 / k),
        "fallback": fallback,
    }


def candidate_plans(
    e: Estimates, m: ClientsAtOptimum, candidates: list[dict[str, Any]], batch: int, max_iterations: int | None
) -> tuple[list[Plan], list[PlanRounds]]:
    """The plans of ``candidates`` (:func:`drift_candidates`, :func:`neighbours`) and their rounds in the clients'
    models ``m`` within the budget (:func:`plan_rounds`): what :func:`drift_pick` chooses from."""
    context = PlanContext(num_samples=e.n, num_clients=e.num_clients, lam=e.mu, iid=False)
    plans = [method_config(STLSCConfig(auto=True, batch=batch), c).plan(context) for c in candidates]
    return plans, plan_rounds(m, plans, [c.get("drift_window") for c in candidates], batch, max_iterations)


def drift_pick(
    e: Estimates, m: ClientsAtOptimum, bar: int, batch: int, max_iterations: int | None, eval_every: int
) -> dict[str, Any] | None:
    """The plan of :func:`drift_candidates` that reaches the target in the fewest rounds of :func:`drift_rounds`,
    the median of DRIFT_DRAWS draws of the window's noise (:func:`fewest_median_rounds`; then the fewest steps), if
    fewer than ``bar`` (STATIONARY_SLACK x the stationary stages' count, :func:`stl_rounds`) and if every one of its
    draws reaches within the budget and under ``bar``; else None (:func:`_fewest_reaching`). Where that is Local
    SGD + drift, the same choice once more among it and :func:`neighbours`, at most its rounds: the periods and
    decays between the candidates' beside its own.

    The window's noise is drawn from the clients' covariance at x*. Where no draw of the pick reaches under ``bar``
    with it drawn at each round's averaged model instead (:func:`_draws_at`), the whole choice is made again
    with it drawn there (``"noise": "iterate"`` in what this returns; None where nothing reaches then). Far from x*
    the samples' gradients are larger: on CIFAR-10's pixels the clients' variance at x_0 is 38-50x that at x*, and
    picks that reached in 30-90 rounds in the model ran out their budgets (docs/results/schedules.md, *The window's
    noise where the run is*). Blended towards x_0's covariance for every choice, it moved 13 of 30 other sets'
    picks, some to plans that took twice the rounds; as a check on the pick it left those of 54 of the 57 held-out
    sets as they were.

    Last, where the clients' rows are few, a Local SGD + drift pick against the plans beside it at faster decays, with
    their first rounds run on the clients' true objectives (:func:`true_choice`)."""
    choose = partial(_choose, e, m, bar, batch, max_iterations, eval_every)
    where: Literal["optimum", "iterate"] = "optimum"
    got = choose(where)
    if got is not None and not _holds_at_iterate(e, m, got[0], bar, batch, max_iterations, eval_every):
        where = "iterate"
        got = choose(where)
    if got is None:
        return None
    got = true_choice(e, m, got, bar, batch, max_iterations, eval_every, where)
    return {**got[0], "model_rounds": got[1], "noise": where, "fallback": None}


def _choose(
    e: Estimates,
    m: ClientsAtOptimum,
    bar: int,
    batch: int,
    max_iterations: int | None,
    eval_every: int,
    noise_where: Literal["optimum", "iterate"],
) -> tuple[dict[str, Any], int] | None:
    """:func:`drift_pick`'s choice with the window's noise drawn at ``noise_where``: the fewest rounds among
    :func:`drift_candidates`, and where that is Local SGD + drift, among it and its :func:`neighbours`, then between
    it and its :func:`first_step`."""
    got = _fewest_reaching(e, m, drift_candidates(e), bar, batch, max_iterations, eval_every, noise_where=noise_where)
    if got is not None and got[0]["method"] == "local_sgd":
        # the pick against the plans beside it, then against its first step at N/(2L) (a tie there keeps the pick:
        # the same steps, and its last lr is the lower)
        for variants in (neighbours, first_step):
            near = [got[0], *variants(e, got[0])]
            got = _fewest_reaching(e, m, near, bar, batch, max_iterations, eval_every, got[1], noise_where) or got
    return got


def _holds_at_iterate(
    e: Estimates,
    m: ClientsAtOptimum,
    pick: dict[str, Any],
    bar: int,
    batch: int,
    max_iterations: int | None,
    eval_every: int,
) -> bool:
    """Whether any of DRIFT_DRAWS draws of ``pick`` reaches under ``bar`` with the window's noise drawn at each
    round's averaged model (:func:`drift_pick`). Any, not the median: so drawn, the model is slower than the runs on
    most sets, and MNIST 2/7's test split, whose pick takes 35 rounds at every seed, reaches in 2 of 5 draws."""
    built = candidate_plans(e, m, [pick], batch, max_iterations)[1][0]
    return any(d is not None for d in _every_draw(m, built, bar, eval_every, "iterate"))


def _every_draw(
    m: ClientsAtOptimum,
    plan: PlanRounds,
    bar: int,
    eval_every: int,
    noise_where: Literal["optimum", "iterate"],
    start: Start | None = None,
) -> list[int | None]:
    """``plan``'s rounds under ``bar`` at each of DRIFT_DRAWS draws of the window's noise (seeds 0, 1, ...), from
    ``start`` where given."""
    return drift_rounds(
        m,
        [plan] * DRIFT_DRAWS,
        every=eval_every,
        max_rounds=bar - 1,
        seeds=range(DRIFT_DRAWS),
        noise_where=noise_where,
        start=start,
    )


def _fewest_reaching(
    e: Estimates,
    m: ClientsAtOptimum,
    candidates: list[dict[str, Any]],
    bar: int,
    batch: int,
    max_iterations: int | None,
    eval_every: int,
    most: int | None = None,
    noise_where: Literal["optimum", "iterate"] = "optimum",
) -> tuple[dict[str, Any], int] | None:
    """The candidate with the fewest median rounds under ``bar`` (and at most ``most``; then the fewest steps, then
    the first) every draw of which reaches within the budget and under ``bar``, and its median rounds; None when
    none does.

    A plan that misses the target by its budget's end never reaches it, and runs have been over the model's draws
    late in a long plan: with a plan whose median reached by the last evaluation before the budget, but not all its
    draws, `make_classification` 11 with its labels dealt in order (``s`` = 0) stalled at 1.4-2.4e-4 against the
    draws' 0.8-1.5e-4 and ran out its budget, as did make_blobs at a 1e-5 target (docs/results/schedules.md,
    *Clients of unequal shares, and configs beyond the held-out sets'*). Such a plan is passed over for the next."""
    plans, built = candidate_plans(e, m, candidates, batch, max_iterations)
    left = list(range(len(plans)))  # the candidates not passed over
    while left:
        best = fewest_median_rounds(
            lambda pairs, cap, stop: drift_rounds(
                m,
                [built[left[j]] for j, _ in pairs],
                every=eval_every,
                max_rounds=cap,
                seeds=[seed for _, seed in pairs],
                stop=stop,
                noise_where=noise_where,
            ),
            len(left),
            bar - 1 if most is None else min(most, bar - 1),
        )
        if best is None:
            return None
        # the fewest rounds (then the most draws in by then), then the fewest steps to them, then the least averaged
        # noise there (the lowest lr at round r's end: the gap's widest part is that noise's draw; make_hastie_10_2's
        # plan and the same at half its decay both reached at round 5 in every draw of the model, and at round 5 the
        # latter's runs were at 1.0-1.2e-4, the plan's under the 1e-4 target), then the candidates' order
        r, tied = best
        i = left[min(tied, key=lambda j: (_steps_to(plans[left[j]], r), built[left[j]].lasts(r, r)[0], j))]
        if all(d is not None for d in _every_draw(m, built[i], bar, eval_every, noise_where)):
            return candidates[i], r
        left.remove(i)
    return None


def fewest_median_rounds(
    run: Callable[[list[tuple[int, int]], int, Callable[[int, list[int | None]], bool]], list[int | None]],
    count: int,
    max_rounds: int,
    draws: int = DRIFT_DRAWS,
) -> tuple[int, list[int]] | None:
    """The fewest rounds, in median over ``draws`` noise draws (seeds 0, 1, ...), that any of ``count`` candidates
    takes within ``max_rounds``, and of the candidates that take them those with the most draws in by then; None
    when none does. ``run(pairs, cap, stop)`` gives the rounds of (candidate, seed) ``pairs`` within ``cap`` (None:
    not within it), as :func:`drift_rounds` does, and may end at the first evaluation at which ``stop(round, reached
    so far)`` holds.

    A candidate's median is at most r once a majority of its draws have reached by r, so the draws run in two
    groups: the majority's seeds for every candidate, ended at the first round at which some candidate has reached
    in all of them (the fewest median rounds are at most that: the cap for what follows), then the rest's seeds for
    the candidates with a draw within the cap, ended at the first round at which a majority of some candidate's
    draws of both groups have reached. A draw not within the cap counts as above every number: it cannot change a
    median at the cap or under it, and only those decide."""
    need = draws // 2 + 1
    got: list[list[float]] = [[] for _ in range(count)]
    cap = max_rounds
    for group in (range(need), range(need, draws)):
        pairs = [(j, s) for j in range(count) if sum(v <= cap for v in got[j]) + len(group) >= need for s in group]
        if not pairs:
            break
        for (j, _), rounds in zip(pairs, run(pairs, cap, partial(_majority_within, got, pairs, need)), strict=True):
            got[j].append(math.inf if rounds is None else rounds)
        # the round at which the run stopped, or the fewest rounds a majority of some candidate's draws reached in
        cap = int(min([sorted(v)[need - 1] for v in got if len(v) >= need] + [cap]))
    medians = [sorted(v + [math.inf] * (draws - len(v)))[draws // 2] for v in got]
    fewest = min(medians, default=math.inf)
    if fewest == math.inf:
        return None
    # of those, the ones with the most draws in by then: more of a run's chances to be in by then
    within = {j: sum(x <= fewest for x in v) for j, v in enumerate(got) if medians[j] == fewest}
    return int(fewest), [j for j, n in within.items() if n == max(within.values())]


def _majority_within(
    got: list[list[float]], pairs: list[tuple[int, int]], need: int, r: int, reached: list[int | None]
) -> bool:
    """Whether ``need`` of some candidate's draws have reached by round r: those in ``got`` and the ``pairs``'
    (candidate, seed) ``reached`` so far (:func:`fewest_median_rounds`)."""
    within = [sum(v <= r for v in values) for values in got]
    for (j, _), rounds in zip(pairs, reached, strict=True):
        within[j] += rounds is not None
    return max(within) >= need


def drift_candidates(e: Estimates) -> list[dict[str, Any]]:
    """What :func:`drift_pick` chooses from, at one client's step 1/(2L) (each client runs alone for a round):
    Local SGD + drift with a period of DRIFT_PERIODS and an lr_decay of DRIFT_DECAYS mu lr, and STL-SGD^sc + drift
    with Algorithm 2's stages (eta halves, T and k double) from T_1 = DRIFT_LR_T1 / (mu lr) and k_1 of
    DRIFT_K1 (at most T_1), T_1 without a last round of under a quarter of k_1 (:func:`whole_rounds`); each with
    option II's control variates and then with each ``drift_window`` of DRIFT_WINDOWS (for Local SGD, those
    shorter than its period; the unwindowed candidates come first, so a tie keeps option II)."""
    lr = 1.0 / (2.0 * e.L)
    stagewise = []
    for scale in DRIFT_LR_T1:
        T1 = max(int(math.ceil(scale / (e.mu * lr))), 1)
        for k in DRIFT_K1:
            if k > T1:
                continue
            T = whole_rounds(T1, k)
            stagewise.append(
                {
                    "method": "stl_sc",
                    "lr": lr,
                    "T1": T,
                    "k": float(k),
                    "drift": True,
                    "iid": True,
                    "stage_end": "length",
                    "rounds_per_stage": math.ceil(T / k),
                }
            )
    plain = _local_candidates(e, DRIFT_PERIODS) + stagewise
    return plain + _windowed(plain)


def neighbours(e: Estimates, pick: dict[str, Any]) -> list[dict[str, Any]]:
    """Local SGD + drift beside ``pick`` (one of :func:`drift_candidates`): at half and twice its period (up to the
    plans' cap) with every lr_decay of DRIFT_DECAYS mu lr and half and twice its own, and at its period with half
    and twice its lr_decay; each with option II's control variates and each window of DRIFT_WINDOWS shorter than the
    period. The candidates' periods are powers of four and their decays a few multiples of mu lr: these are the
    plans between them around the pick.

    On w8a-test the model's pick, k 16,384, took 45, 30, 45 rounds (seeds 0-2) and 32,768 at the same decay and
    window 35, 40, 30; on sparse17 (k 16,384, lr_decay mu lr) 20, 20, 20 and k 32,768 at mu lr / 2 15, 15, 10.
    Every power of two as a period made the same choices on 37 sets, and doubled the proposal's time where no
    candidate reaches (MNIST 4/9: 58 -> 115 s), where the neighbours cost nothing (docs/results/schedules.md,
    *Periods between the powers of four*)."""
    k, units = int(pick["k"]), pick["lr_decay"] / (e.mu * pick["lr"])
    between = [u for u in (units / 2, units * 2) if u > 0 and not any(math.isclose(u, d) for d in DRIFT_DECAYS)]
    periods = [p for p in (k // 2, 2 * k) if p <= DEFAULT_K_MAX]
    plain = _local_candidates(e, periods, (*DRIFT_DECAYS, *between)) + _local_candidates(e, [k], between)
    return plain + _windowed(plain)


def first_step(e: Estimates, pick: dict[str, Any]) -> list[dict[str, Any]]:
    """``pick`` (Local SGD + drift at one client's step 1/(2L), a decaying lr) with its first step at N/(2L), the
    stationary stages' eta_1, and its late schedule kept: lr / lr_decay, the c of eta_t = lr / (1 + lr t / c) ~ c / t,
    the same; a list of that one plan, empty where there is none (another method, a constant lr, one client).

    Along the steep directions such steps overshoot, which the logistic loss's bounded gradients turn into saturated
    margins rather than divergence (:func:`_moved`), and along the flat ones they cover in a few thousand steps the
    distance from x_0 = 0 that steps of 1/(2L) take a round or more for. A grid's best on
    `make_classification` with scikit-learn's defaults (16 clients) started at 81 times 1/(2L) and took 10 rounds
    (eight seeds' median) where `auto`'s plan took 20, and the same plan from 81 times its first step 15
    (docs/results/schedules.md, *A first step of N/(2L)*). Unchecked, N/(2L) on the pick took 3 of 26 held-out sets
    to fewer rounds and 4 to more; the clients' model, with such steps in it, gives those four the pick's rounds."""
    if pick["method"] != "local_sgd" or not pick["lr_decay"] or e.num_clients < 2:
        return []
    lr = e.num_clients / (2.0 * e.L)
    return [{**pick, "lr": lr, "lr_decay": lr * pick["lr_decay"] / pick["lr"]}]


def true_variants(pick: dict[str, Any], wider: bool = False) -> list[dict[str, Any]]:
    """``pick`` (Local SGD + drift) at TRUE_PERIODS times its period (half, the same, one and a half, twice and four
    times, up to the plans' cap), and each of those at half and a quarter of its decay constant c = lr / lr_decay
    (lr_decay x2, x4; none at a constant lr); with ``wider`` and a window W, also each of those periods over 4 W at its
    decay with a window of 4 W (at most the longest of DRIFT_WINDOWS), a quarter of the window's noise in the control
    variates; not ``pick`` itself. What :func:`true_choice` weighs it against: the quadratic at x* is slow far from x*,
    most for the longer periods and faster decays, whose bias it shrinks too late. One and a half: a plan at twice the
    period often reaches only at the last evaluation its budget holds, and one between does not (make_classification
    with one class a tenth of the rows: 98,304 steps, 15 rounds over eight seeds, 1.5x the grid's best, where the pick
    took 22.5). Four times: on make_classification with three clusters a class on 32 clients the pick, k 65,536, took 10
    rounds at every seed and the grid's best 5; at four times its period and half its decay constant the true objectives
    and the runs both give 5. Each of them also from a first step of N/(2L) (:func:`first_step`) was tried and is not
    weighed: on 78 held-out sets it moved 15 picks, two misses to within 1.5x and two sets within it to the budget,
    where the noiseless true objectives gave 15 and 5 rounds (docs/results/schedules.md, *Six more unseen sets; a first
    step of N/(2L) on the true objectives: tried, not kept*)."""
    k = int(pick["k"])
    periods = [p for p in (int(k * f) for f in TRUE_PERIODS) if p <= DEFAULT_K_MAX]
    faster = (1.0, 2.0, 4.0) if pick["lr_decay"] else (1.0,)
    beside = [
        {**pick, "lr_decay": pick["lr_decay"] * f, "k": float(p)} for f in faster for p in periods if (f, p) != (1, k)
    ]
    window = pick.get("drift_window")
    if wider and window is not None and 4 * window <= DRIFT_WINDOWS[-1]:
        beside += [{**pick, "k": float(p), "drift_window": 4 * window} for p in periods if 4 * window < p]
    return beside


def true_choice(
    e: Estimates,
    m: ClientsAtOptimum,
    got: tuple[dict[str, Any], int],
    bar: int,
    batch: int,
    max_iterations: int | None,
    eval_every: int,
    noise_where: Literal["optimum", "iterate"] = "optimum",
) -> tuple[dict[str, Any], int]:
    """Where the clients' rows are few enough (:func:`true_fits`), a Local SGD + drift pick against
    :func:`true_variants`, each with its first rounds run on the clients' true objectives (:func:`true_start`) and
    the rest in the quadratic models at x* (:func:`drift_rounds` from there, DRIFT_DRAWS draws). A plan beside the
    pick replaces it where its median rounds are fewer than the pick's and every draw of it reaches with room in its
    budget (:func:`_with_room`); of those, the fewest rounds, then the fewest steps. The pick stands otherwise, with
    its rounds so counted where every draw of it reaches (``true_rounds`` says how many ran on the true objectives).
    Anywhere else, ``got`` as it is.

    The true objectives' rounds leave out the sampling noise, and the runs are noisier: without a condition on the
    budget, of 18 held-out sets whose pick such a choice moved, two ran out the budget at some seeds, both with a plan
    of 131,072-step rounds whose last evaluation before the budget was 1.97 M of its 2 M steps
    (docs/results/schedules.md, *The clients' true objectives in the early rounds*). A tie with the pick keeps it:
    evaluations every few rounds make ties common.

    Where the pick's median is the first evaluation, none reaches in fewer rounds: where every draw of it is in
    there, the plans beside it are not run; where some are not, the plans beside it, with those at a window four
    times as long (``wider``), are weighed for more draws in there (then the fewest steps), a run's better chance to
    be in by then. A window's noise kept digits 3/6 at 10 rounds at two seeds of three, three draws of five in the
    model; at four times the period and the window, 5 at seeds 0-4, every draw in. At later evaluations the same
    ranking, with the longer window, moved seven of 78 held-out sets' picks: one median went 20 -> 15, one 15 -> 20
    over eight seeds, five kept theirs (docs/results/schedules.md, *Surer picks at the first evaluation*)."""
    pick = got[0]
    if pick["method"] != "local_sgd" or not true_fits(m):
        return got
    own = candidate_plans(e, m, [pick], batch, max_iterations)[1]
    chosen, to_beat = got, (got[1], 0)  # the quadratics' rounds, unless every draw reaches
    drawn = _reaching(m, own[0], bar, eval_every, noise_where, true_start(m, own)[0])
    first = drawn is not None and drawn.median <= eval_every

    def rank(d: Reached) -> tuple[int, int]:
        # fewer median rounds; at the first evaluation, more draws in there
        return d.median, -d.within if first else 0

    if drawn is not None:
        chosen = {**pick, "true_rounds": drawn.true_rounds}, drawn.median
        if drawn.most <= eval_every:  # every draw at the first evaluation: no plan beside it does better
            return chosen
        to_beat = rank(drawn)
    candidates = true_variants(pick, wider=first)
    plans, built = candidate_plans(e, m, candidates, batch, max_iterations)
    best: tuple[int, int, int, int, int] | None = None
    for j, start in enumerate(true_start(m, built)):
        drawn = _reaching(m, built[j], bar, eval_every, noise_where, start)
        if drawn is None or rank(drawn) >= to_beat:
            continue
        if _with_room(plans[j], built[j], drawn.most, bar, eval_every, max_iterations):
            key = (*rank(drawn), _steps_to(plans[j], drawn.median), j, drawn.true_rounds)
            best = key if best is None or key < best else best
    if best is None:
        return chosen
    return {**candidates[best[3]], "true_rounds": best[4]}, best[0]


class Reached(NamedTuple):
    """A plan's rounds from its start (:func:`_reaching`): the median and the most over the draws, and the rounds it
    ran on the clients' true objectives first."""

    median: int
    most: int
    true_rounds: int
    #: the draws in by the median's round
    within: int


def _reaching(
    m: ClientsAtOptimum,
    plan: PlanRounds,
    bar: int,
    every: int,
    noise_where: Literal["optimum", "iterate"],
    start: Start | None,
) -> Reached | None:
    """``plan``'s rounds from ``start`` (:func:`true_start`) over DRIFT_DRAWS draws of the window's noise
    (:func:`_every_draw`), where it has a start and every draw reaches under ``bar``; else None."""
    if start is None:
        return None
    reached = sorted(r for r in _every_draw(m, plan, bar, every, noise_where, start) if r is not None)
    if len(reached) < DRIFT_DRAWS:
        return None
    median = reached[DRIFT_DRAWS // 2]
    return Reached(median, reached[-1], start.rounds, sum(r <= median for r in reached))


def _with_room(
    plan: Plan, rounds_of: PlanRounds, reached: int, bar: int, every: int, max_iterations: int | None
) -> bool:
    """Whether a run of ``plan`` that reaches at round ``reached`` has room in its budget to be slower than the
    noiseless model: an evaluation after it within the budget, or BUDGET_ROOM times its steps (the run evaluates
    once more where its budget cuts a round). 131,072-step rounds reaching at round 15, 1.97 M steps of a 2 M budget,
    ran out the budget at some seeds; 262,144-step rounds reaching at round 5, 1.31 M, reached at 5 at every seed
    (docs/results/schedules.md, *Eight more unseen sets; four times the period, and room in the budget*)."""
    if reached < _last_evaluation(rounds_of, every, bar, max_iterations):
        return True
    return max_iterations is not None and BUDGET_ROOM * _steps_to(plan, reached) <= max_iterations


def _last_evaluation(plan: PlanRounds, every: int, bar: int, max_iterations: int | None) -> float:
    """The last evaluation, under ``bar`` rounds, at which ``plan`` is within its budget (inf without one)."""
    if max_iterations is None:
        return math.inf
    return every * int(np.count_nonzero(~np.isnan(plan.lasts(bar - 1, every))))


def _local_candidates(
    e: Estimates, periods: Sequence[int], decays: Sequence[float] = DRIFT_DECAYS
) -> list[dict[str, Any]]:
    """Local SGD + drift at one client's step 1/(2L), each of ``periods`` with each lr_decay of ``decays`` mu lr."""
    lr = 1.0 / (2.0 * e.L)
    return [
        {"method": "local_sgd", "lr": lr, "lr_decay": decay * e.mu * lr, "k": float(k), "drift": True}
        for decay in decays
        for k in periods
    ]


def _windowed(plain: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each of ``plain`` with each ``drift_window`` of DRIFT_WINDOWS (for Local SGD, those shorter than its period)."""
    return [{**c, "drift_window": w} for w in DRIFT_WINDOWS for c in plain if c["method"] == "stl_sc" or w < c["k"]]


def whole_rounds(T1: int, k: int) -> int:
    """T_1 less its stage's last round where that round would be under a quarter of k steps (and some round is left).

    With drift correction a round's steps also estimate each client's control variate, (x - y_c) / sum eta_t
    (SCAFFOLD option II), which the next round, k x 2 steps in these stages, leans on throughout: from a round of a
    few single-sample steps it is mostly sampling noise. On the parity set, 8 clients, auto's plan with T_1 = 2,819
    and k_1 = 256 (a last round of 3 steps in every stage) took 100, 90, 95 rounds (seeds 0-2); with T_1 = 2,816,
    70, 75, 80 (docs/results/schedules.md, *The clients' model*). As T and k double together, every later stage
    keeps the same whole number of rounds."""
    rest = T1 % k
    return T1 - rest if 0 < rest < k / 4 and T1 - rest >= k else T1


def _steps_to(plan: Plan, rounds: int) -> int:
    """The iterations of ``plan``'s first ``rounds`` rounds."""
    cursor = Cursor()
    for _ in range(rounds):
        cursor = plan.advance(cursor, plan.next_round(cursor))
    return cursor.iteration


def method_config(auto: MethodConfig, proposal: dict[str, Any]) -> MethodConfig:
    """The method ``auto`` (an STL-SGD^sc config with ``auto = true``) runs: the proposal's method and settings,
    with the fields auto does not set (batch, the outer step) as given."""
    kept = auto.model_dump(include={"batch", "outer_lr", "outer_momentum"})
    dropped = ("T1", "rounds_per_stage", "fallback", "model_gap", "model_rounds", "stl_rounds", "noise", "true_rounds")
    fields = {k: v for k, v in proposal.items() if k not in dropped}
    if proposal["method"] == "stl_sc":
        fields["T1"] = proposal["T1"]
    return REGISTRY[proposal["method"]].model_validate({**kept, **fields})


def report(e: Estimates, proposal: dict[str, Any], network: Network | None = None) -> str:
    t2 = theorem2(e)
    if "model_rounds" in proposal:
        if proposal["method"] == "local_sgd":
            large = e.num_clients > 1 and math.isclose(proposal["lr"], e.num_clients / (2.0 * e.L))
            start = "N/(2L), the late schedule lr / lr_decay of the best at 1/(2L)" if large else "1/(2L)"
            plan = (
                f"Local SGD + drift correction, lr = {proposal['lr']:.6g} ({start}), lr_decay = "
                f"{proposal['lr_decay']:.6g} (eta_t = lr / (1 + lr_decay t)), k = {proposal['k']:.0f}"
            )
        else:
            plan = (
                f"STL-SGD^sc + drift correction, lr = {proposal['lr']:.6g} (1/(2L)), T1 = {proposal['T1']}, k = "
                f"{proposal['k']:g} ({proposal['rounds_per_stage']} rounds a stage; eta halves, T and k double)"
            )
        if proposal.get("drift_window") is not None:
            plan += f", control variates from each round's first {proposal['drift_window']} steps (drift_window)"
        where = (
            "at each round's averaged model: the best plan with it drawn at x* did not reach with it drawn there"
            if proposal.get("noise") == "iterate"
            else "at x*, and the plan also reaches with it drawn at each round's averaged model"
            if proposal.get("true_rounds") is None
            else "at x*; the quadratics' best plan, before the plans beside it, also reaches with it drawn at each "
            "round's averaged model"
        )
        model = (
            "in the clients' quadratic models at x*"
            if proposal.get("true_rounds") is None
            else f"with its first {proposal['true_rounds']} rounds on the clients' true logistic objectives (no noise: "
            f"the gap then within {NEAR_TARGET:g} x the target) and the rest in their quadratic models at x*"
        )
        rule = (
            f"{plan}: {model} it reaches the target in {proposal['model_rounds']} "
            f"rounds (the median of {DRIFT_DRAWS} draws of the control variates' noise, from the clients' gradient "
            f"covariance {where}, each at the first evaluation by which the gap has been under "
            f"the target with a chance of a half), the fewest of Local SGD + drift "
            f"(k in {', '.join(map(str, DRIFT_PERIODS))}, lr_decay in "
            f"{{{', '.join(f'{d:g}' for d in DRIFT_DECAYS)}}} mu lr; then half and twice the best's k and lr_decay, "
            "then its first step at N/(2L); where the clients' rows are few, then half, 1.5, twice and four times its "
            "k at half and a quarter of its lr / lr_decay, with their first rounds on the clients' true objectives, "
            "and where its median is the first evaluation but not every draw's, at four times its window too, for "
            "more draws in there) and STL-SGD^sc + drift (lr T1 in "
            f"{{{', '.join(f'{d:g}' for d in DRIFT_LR_T1)}}} / mu, k in {', '.join(map(str, DRIFT_K1))}), each "
            f"with option II's control variates or a drift_window of {', '.join(map(str, DRIFT_WINDOWS))}, and fewer "
            f"than {STATIONARY_SLACK} x the {proposal['stl_rounds']} rounds STL-SGD^sc's stationary stages would take "
            "at least (eta halved down to the clients' averaged noise, two windows of the stationarity test a stage)"
        )
    elif proposal["method"] == "stl_sc":
        rule = (
            f"STL-SGD^sc, lr = {proposal['lr']:.6g} (N/(2L)), T1 = {proposal['T1']} (1/(mu lr)), k = "
            f"{proposal['k']:g} (at most {proposal['rounds_per_stage']} rounds a stage), drift = true, a stage ends "
            "when the objective stops falling (at most T_s), k x2 while each stage's drop holds"
        )
        if proposal["drift_share"] is not None:
            rule += f", control variates from the first {proposal['drift_share']:g} of each round's steps (drift_share)"
        if proposal["diminishing_k"] is not None:
            rule += (
                f"; while k <= diminishing_k = {proposal['diminishing_k']} (the budget / {DIMINISHING_BUDGET}), a "
                "stage also ends once its fall over five rounds is under a quarter of its fall so far"
            )
        if proposal.get("halvings") is not None:
            h = proposal["halvings"]
            rule += (
                f"; eta halves at most {h} times (halvings), down to {proposal['lr'] / 2.0**h:.4g}, where the clients' "
                "averaged noise at x* is under a third of the target"
            )
        if proposal["k_max"] is not None:
            rule += (
                f", every period at most k_max = {proposal['k_max']} ({NETWORK_CAP} x the client-steps a round's "
                "communication costs on the network given)"
            )
    elif proposal["method"] == "local_sgd":
        o = e.optimum
        assert o is not None
        goal = o.target_gap / ONE_ROUND_MARGIN
        sized = (
            "the fewest steps for which the quadratic model at x* gives"
            if proposal["model_gap"] <= goal
            else "the run's budget, fewer steps than the quadratic model at x* needs for"
        )
        rule = (
            f"Local SGD, one round planned to reach the target: lr = {proposal['lr']:.6g} (1/(2L)), lr_decay = "
            f"{proposal['lr_decay']:.6g} (eta_t = lr / (1 + lr_decay t)), k = {proposal['k']:.0f}: {sized} a gap "
            f"of {goal:.3g} (the target / {ONE_ROUND_MARGIN:g}; this k and lr_decay: {proposal['model_gap']:.3g}), "
            "drift = false"
        )
    else:
        rule = (
            f"LR-coupled STL, lr = {proposal['lr']:.6g} (N/(2L)), lr_decay = {proposal['lr_decay']:.6g} (mu lr: "
            f"eta_t = lr / (1 + mu lr t)), k = {proposal['k']:.0f} ({IID_K1_STAGES} T1, at most {DEFAULT_K_MAX}; "
            f"T1 = 1/(mu lr) = {proposal['T1']}), k_t = k eta_1 / eta_t, drift = false"
        )
    if proposal["method"] != "stl_sc" and network is not None:
        rule += "; the network given changes nothing here (alike clients: a longer period adds no steps)"
    lines = [
        f"n = {e.n}, d = {e.d}, N = {e.num_clients} clients",
        f"L = {e.L:.6g} (power iteration on the Hessian at x_0), L_max = {e.L_max:.6g} (row norms), "
        f"mu = lambda = {e.mu:.6g}",
        f"sigma^2 = {e.sigma2:.6g} (single-sample gradients at x_0), zeta^2 = {e.zeta2:.6g} (clients' gradients "
        f"at x_0; zeta^2 / sigma^2 = {e.zeta2 / e.sigma2 if e.sigma2 else 0:.3g})",
        *(
            [
                f"objective: the clients' mean, 1/N sum_c f_c (their shares differ: row weights {e.row_weights[0]:.3g} "
                f"to {e.row_weights[1]:.3g}), which equal averages converge to; f* and the gap are its"
            ]
            if e.row_weights is not None
            else []
        ),
        *(
            [
                f"at x*: sigma*^2 = {e.optimum.sigma2:.6g}, Hessian eigenvalues {min(e.optimum.curvatures):.3g} to "
                f"{max(e.optimum.curvatures):.3g}, target gap {e.optimum.target_gap:g}"
            ]
            if e.optimum is not None
            else []
        ),
        f"Theorem 2: eta_1 <= 1/(6L) = {t2['lr']:.4g}, T_1 = 6/(mu eta_1) = {t2['T1']:.4g}, k_1 = "
        f"{t2['k1_iid']:.3g} (IID) / {t2['k1_noniid']:.3g} (Non-IID): under 1, an average every step",
        f"proposal (algorithm.auto = true): {rule}",
    ]
    if network is not None:
        lines.append(
            f"network: {network.name}, a round {network.latency_s * 1e3:.4g} ms + {_round_bytes(e)} B at "
            f"{network.bandwidth_Bps * 8 / 1e9:.4g} Gbit/s, a client-step {(network.step_s or 0) * 1e9:.4g} ns: "
            f"a round costs q = {round_in_steps(e, network):.4g} client-steps"
        )
    if proposal["fallback"]:
        lines.append(f"fallback: {proposal['fallback']}")
    return "\n".join(lines)


def estimates_for(built: Any, target_gap: float | None = None, client_models: bool = True) -> Estimates:
    """Estimates of a built experiment (with its run's target gap: the model at x*, from the cached optimum the
    run measures its gap against; the clients' models unless ``client_models`` is false); a one-line error where the
    problem is not Eq. 8."""
    if not isinstance(built.problem, LogisticRegression):
        raise ConfigError(
            "problem.kind: suggest estimates the constants of Eq. 8 (logistic regression); for "
            "networks, docs/distributed.md has measured guidance"
        )
    return estimate(
        built.problem, built.partition, target_gap=target_gap, cache_dir=cache_dir(), client_models=client_models
    )


def proposal_for(exp: Any, built: Any, network: Network | None = None) -> tuple[Estimates, dict[str, Any]]:
    """The estimates of a built experiment and what ``auto`` runs on it: its run's target, batch and budget
    passed on, the same for ``algorithm.auto`` and ``stlsgd suggest``."""
    # With a network auto prices time and runs the capped stationary stages: the clients' models are not consulted.
    e = estimates_for(built, exp.run.target_gap, client_models=network is None)
    return e, propose(e, network, exp.algorithm.batch, exp.run.max_iterations, exp.run.eval_every)


__all__ = [
    "AtOptimum",
    "ClientsAtOptimum",
    "Estimates",
    "PlanRounds",
    "RoundSums",
    "asdict",
    "candidate_plans",
    "clients_at_optimum",
    "drift_candidates",
    "drift_pick",
    "drift_rounds",
    "estimate",
    "estimates_for",
    "fewest_median_rounds",
    "model_gap",
    "one_round",
    "neighbours",
    "noise_lr",
    "plan_rounds",
    "propose",
    "proposal_for",
    "report",
    "round_in_steps",
    "stationary_halvings",
    "stl_rounds",
    "theorem2",
    "whole_rounds",
]
