"""Any stlsgd plan as a Flower federated run: a FedAvg strategy that sends each round's plan, and its client side.

Server::

    from stlsgd.algorithms import STLSGD
    from stlsgd.integrations.flower import StlsgdFedAvg

    strategy = StlsgdFedAvg(STLSGD(lr=0.1, T1=200, k1=2, gamma=10.0), max_iterations=3000,
                            initial_parameters=ndarrays_to_parameters(get_weights(model)))
    rounds = strategy.planned_rounds()      # for ServerConfig(num_rounds=rounds)

Client (a ``NumPyClient``; or call :func:`run_local_steps` from your own client's ``fit``)::

    from stlsgd.integrations.flower import StlsgdClient
    client = StlsgdClient(model, train_loader)   # fit(): load the global model, run the round's local steps

Each Flower round is one round of the plan: ``configure_fit`` settles it with the plan driver every executor uses
(:class:`~stlsgd.algorithms.driver.PlanDriver`, ``driver.settle(feedback)``) and sends, in the fit config,

==================== =====================================================================================
``stlsgd_steps``     the number of local steps (k_s, or fewer in a stage's last round) -- run exactly these
``stlsgd_lr``        the learning rate of the round's first step (absent when the plan has no lr of its own:
                     the client's optimizer keeps its lr)
``stlsgd_lrs``       float64 bytes, one lr per step, only when the lr changes within the round (lr decay)
``stlsgd_gamma``     STL-SGD^nc's gamma: each step adds the gradient (x - x_s)/gamma of 1/(2 gamma)||x - x_s||^2
``stlsgd_anchor``    x_s, the global model at the start of the stage (npz bytes, :func:`get_weights` order), sent
                     in every round of the stage but its first, where x_s is the model the round sends
``stlsgd_control``   with ``drift=True``: SCAFFOLD's server control variate c (npz bytes, :func:`get_weights` order,
                     zeros for buffers); the client adds c - c_i to every gradient and returns c_i^+ - c_i as the
                     fit metric ``stlsgd_control_delta`` (npz bytes)
``stlsgd_window``    with ``drift_window`` (or ``drift_share``): c_i^+ from the round's first that many steps only (the
                     model after them and the sum of their learning rates)
``stlsgd_batch``     the plan's per-client mini-batch size (CR-PSGD grows it)
``stlsgd_round``,    the round's index (0-based), stage and nominal period, for logs
``stlsgd_stage``,
``stlsgd_period``
==================== =====================================================================================

``aggregate_fit`` checks every client's update (:meth:`StlsgdFedAvg.check_update`: a federated server trusts no
client; a rejected update is logged on the ``stlsgd`` logger and counted in the round's metrics), averages the
valid ones as FedAvg does (weighted by the clients' example counts, each capped at the round's median count: equal
here when the clients share the batch size), with drift correction takes SCAFFOLD's server step
c <- c + (1/N) sum_i (c_i^+ - c_i), and then finishes the round with the driver; the clients' ``stlsgd_loss`` (the
loss of the received global model on each client's first batch) is fed back to adaptive plans (AdaComm). Parameters travel as
:func:`get_weights` gives them -- the floating entries of the model's ``state_dict``, BatchNorm statistics
included -- so FedAvg averages the buffers with the weights.

The proximal term is applied where Flower's FedProx baseline once got it wrong twice: the anchor is a detached
copy, never the live parameters (flwr PR #1654: ``w - w_global`` was identically 0), and the term is the squared
norm, whose gradient is linear in ``x - x_s`` (PR #2210: ``||w - w_t||`` without the square).

:func:`run_in_process` runs a strategy and clients in one process, without ray or a network (tests, examples);
with ``flwr run`` return ``ServerAppComponents(strategy=StlsgdFedAvg(...), config=ServerConfig(num_rounds=...))``
from the ServerApp's ``server_fn``, Flower's path for strategies of this (``flwr.server.strategy``) API.
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stlsgd.algorithms.driver import PlanDriver
from stlsgd.algorithms.plan import Cursor, Feedback, Plan, Round
from stlsgd.errors import StlsgdError, brief
from stlsgd.executors.rules import RoundRule, add_proximal, drift_correction, update_control
from stlsgd.integrations import missing

try:
    from flwr.client import Client, NumPyClient
    from flwr.common import (
        Code,
        DisconnectRes,
        EvaluateIns,
        EvaluateRes,
        FitIns,
        FitRes,
        GetParametersIns,
        GetParametersRes,
        GetPropertiesIns,
        GetPropertiesRes,
        Parameters,
        ReconnectIns,
        Scalar,
        ndarrays_to_parameters,
        parameters_to_ndarrays,
    )
    from flwr.server import History, Server, SimpleClientManager
    from flwr.server.client_manager import ClientManager
    from flwr.server.client_proxy import ClientProxy
    from flwr.server.strategy import FedAvg
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise missing("flwr", "flower", exc) from exc

PREFIX = "stlsgd_"
log = logging.getLogger("stlsgd")


# --------------------------------------------------------------------------- arrays on the wire


def _floating(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if torch.is_floating_point(v)}


def get_weights(model: nn.Module) -> list[np.ndarray]:
    """The floating entries of the model's ``state_dict`` as NumPy copies, in order: parameters and floating
    buffers (BatchNorm statistics). Integer buffers (``num_batches_tracked``) stay on the client, as in the
    drop-in: FedAvg's in-place average would truncate them (0.5 * 1 -> 0)."""
    return [t.detach().cpu().numpy().copy() for t in _floating(model).values()]


def set_weights(model: nn.Module, arrays: Sequence[np.ndarray]) -> None:
    """Load :func:`get_weights` arrays into the model."""
    state = _floating(model)
    if len(arrays) != len(state):
        raise StlsgdError(
            f"set_weights: got {len(arrays)} arrays, the model has {len(state)} floating "
            "parameters and buffers (exchange get_weights(model))"
        )
    with torch.no_grad():
        for (name, tensor), array in zip(state.items(), arrays):
            if tuple(array.shape) != tuple(tensor.shape):
                raise StlsgdError(f"set_weights: {name} has shape {tuple(tensor.shape)}, got {tuple(array.shape)}")
            tensor.copy_(torch.as_tensor(np.asarray(array)).to(tensor.dtype))


def pack(arrays: Sequence[np.ndarray]) -> bytes:
    """Arrays as one bytes value of a Flower config (npz, no pickle)."""
    buffer = io.BytesIO()
    np.savez(buffer, *arrays)
    return buffer.getvalue()


def unpack(data: bytes) -> list[np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        return [arrays[f"arr_{i}"] for i in range(len(arrays.files))]


# --------------------------------------------------------------------------- the server


def weighted_means(metrics: list[tuple[int, dict[str, Scalar]]]) -> dict[str, Scalar]:
    """The clients' numeric fit metrics averaged with their example counts (the strategy's default
    ``fit_metrics_aggregation_fn``: the round's ``stlsgd_loss``). Non-finite values are left out."""
    total = sum(n for n, _ in metrics)
    if total <= 0:
        return {}
    values: dict[str, list[tuple[float, float]]] = {}
    for n, m in metrics:
        for k, v in m.items():
            x = _finite(v)
            if x is not None:
                values.setdefault(k, []).append((n / total, x))
    out: dict[str, Scalar] = {}
    for k in sorted(values):
        value = sum(share * x for share, x in values[k])
        if math.isfinite(value):
            out[k] = value
    return out


def _finite(value: object) -> float | None:
    """``value`` as a finite float, or None when it is no real number (bool, text, bytes) or not finite."""
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, (bool, np.bool_)):
        return None
    try:
        x = float(value)
    except OverflowError:  # an int beyond float's range
        return None
    return x if math.isfinite(x) else None


#: The largest ``num_examples`` accepted: beyond 2^53 a count is no longer an exact float weight.
MAX_EXAMPLES = 2**53
#: The largest client loss accepted in magnitude: a fed-back objective stays far from overflow in an adaptive
#: plan's arithmetic (AdaComm's F / F_0); no trained model has a loss near it.
MAX_LOSS = 1e100


@dataclass(frozen=True)
class Rejection:
    """A client update the server did not average: the Flower round, the client's id and why."""

    server_round: int
    cid: str
    reason: str

    def __str__(self) -> str:
        return f"client {self.cid}: {self.reason}"


@dataclass
class _Update:
    """A client update that passed the checks of :meth:`StlsgdFedAvg.check_update`."""

    cid: str
    arrays: list[np.ndarray]
    num_examples: int
    metrics: dict[str, Scalar]
    control_delta: list[np.ndarray] | None
    weight: float = 0.0


class RejectedUpdate(Exception):
    """Why :meth:`StlsgdFedAvg.check_update` will not average a client's update (one line)."""

    def __init__(self, reason: str) -> None:
        super().__init__(_one_line(reason))


def _one_line(text: object, limit: int = 200) -> str:
    """Text a client chose (a status message, a value's repr) as one bounded line for logs and metrics."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _check_arrays(what: str, arrays: list[np.ndarray], like: list[np.ndarray]) -> None:
    """Raise :class:`RejectedUpdate` unless ``arrays`` match ``like`` in number, shape and dtype, and are finite."""
    if len(arrays) != len(like):
        raise RejectedUpdate(f"{what}: {len(arrays)} arrays, the global model has {len(like)}")
    for i, (a, b) in enumerate(zip(arrays, like)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise RejectedUpdate(
                f"{what}: array {i} is {a.dtype}{list(a.shape)}, the global model's is {b.dtype}{list(b.shape)}"
            )
        if not np.all(np.isfinite(a)):
            raise RejectedUpdate(f"{what}: array {i} holds NaN or infinite values")


def _distance(arrays: list[np.ndarray], reference: list[np.ndarray] | None) -> float:
    """||arrays - reference|| over all arrays, in float64 (inf when it overflows)."""
    total = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for i, a in enumerate(arrays):
            d = a.astype(np.float64) if reference is None else a.astype(np.float64) - reference[i]
            total += float(np.sum(d * d))
    return math.sqrt(total) if math.isfinite(total) else math.inf


class StlsgdFedAvg(FedAvg):
    """FedAvg whose rounds are the rounds of ``plan``, with drift correction on demand and every client update
    checked before it is averaged (see the module docstring).

    ``max_iterations``: a hard cap on local steps, as ``run.max_iterations`` is for the simulator: the round that
    would cross it is cut there (the plan driver's rule, ``algorithms.budget``) and no round is configured after
    it; :meth:`planned_rounds` counts the rounds that takes. ``drift``: SCAFFOLD's control variates
    (Karimireddy et al., ICML 2020, option II), as the simulator's ``RoundRule(drift=True)``; ``drift_window``: the
    clients' control variates from each round's first that many steps (``RoundRule.drift_window``),
    ``drift_share``: from that share of each round's steps. ``example_cap``: a client's averaging weight is its
    ``num_examples`` capped at ``example_cap`` times the round's median count (None: FedAvg's raw counts).
    ``max_update_ratio``: with 3 or more valid updates in a round, one whose distance to the global model (or whose
    control-variate update) is more than this many times the round's median is rejected (None: no such check).
    Other keyword arguments are FedAvg's; a user's ``on_fit_config_fn`` config is sent too (the ``stlsgd_`` keys
    win).
    """

    def __init__(
        self,
        plan: Plan,
        *,
        max_iterations: int | None = None,
        drift: bool = False,
        drift_window: int | None = None,
        drift_share: float | None = None,
        example_cap: float | None = 1.0,
        max_update_ratio: float | None = 10.0,
        **fedavg_options: Any,
    ) -> None:
        fedavg_options.setdefault("fit_metrics_aggregation_fn", weighted_means)
        super().__init__(**fedavg_options)
        if max_iterations is not None and max_iterations < 1:
            raise StlsgdError(f"max_iterations: must be >= 1 local step, got {max_iterations}")
        #: The round rules every executor shares (drift correction and its control variates' window).
        self.rule = RoundRule(drift, drift_window, drift_share)
        if example_cap is not None and not (math.isfinite(example_cap) and example_cap >= 1):
            raise StlsgdError(f"example_cap: must be a finite number >= 1 (or None), got {example_cap}")
        if max_update_ratio is not None and not (math.isfinite(max_update_ratio) and max_update_ratio >= 1):
            raise StlsgdError(f"max_update_ratio: must be a finite number >= 1 (or None), got {max_update_ratio}")
        self.plan = plan
        #: The plan's position, the round settled for the clients and the feedback that settled it (the plan
        #: driver every executor uses).
        self.driver = PlanDriver(plan, max_iterations=max_iterations)
        self.max_iterations = max_iterations
        self.example_cap = example_cap
        self.max_update_ratio = max_update_ratio
        self.averages = 0
        self.completed: list[Round] = []  # the rounds averaged so far
        self.objective: float | None = None
        self.anchor: list[np.ndarray] | None = None
        #: SCAFFOLD's server control variate c, one array per global array (zeros for buffers).
        self.control: list[np.ndarray] | None = None
        #: The global model after the last average (or as last sent).
        self.weights: list[np.ndarray] | None = None
        #: Every update rejected so far.
        self.rejected: list[Rejection] = []
        self._num_clients = 0

    @property
    def drift(self) -> bool:
        """Whether the rule corrects drift (SCAFFOLD's control variates)."""
        return self.rule.drift

    def __repr__(self) -> str:
        return (
            f"StlsgdFedAvg(plan={type(self.plan).__name__}, drift={self.drift}, accept_failures={self.accept_failures})"
        )

    def planned_rounds(self) -> int:
        """Rounds until ``max_iterations`` under constant feedback (an adaptive plan may differ at run time)."""
        if self.max_iterations is None:
            raise StlsgdError("planned_rounds: give the strategy max_iterations")
        count = 0
        for rnd in self.plan.rounds(feedback=Feedback(objective=self.objective)):
            if rnd.start_iteration >= self.max_iterations:
                return count
            count += 1
        raise AssertionError("unreachable")  # pragma: no cover

    @property
    def cursor(self) -> Cursor:
        """The plan's position: the start of the round being run, or of the next one."""
        return self.driver.cursor

    def round_config(self, parameters: Parameters) -> dict[str, Scalar]:
        """Settle the next round of the plan and the config that tells the clients how to run it. A round that
        was settled and not averaged (every update rejected) is the one settled again, as it was."""
        rnd = self.driver.settle(Feedback(objective=self.objective))
        sent = parameters_to_ndarrays(parameters)
        self.weights = sent
        config: dict[str, Scalar] = {
            PREFIX + "round": rnd.index,
            PREFIX + "stage": rnd.stage,
            PREFIX + "period": rnd.period,
            PREFIX + "steps": rnd.steps,
            PREFIX + "batch": rnd.batch,
        }
        if rnd.lrs is not None:
            lrs = np.asarray(rnd.learning_rates(), dtype=np.float64)
            config[PREFIX + "lr"] = float(lrs[0])
            if not np.all(lrs == lrs[0]):
                config[PREFIX + "lrs"] = lrs.tobytes()
        if rnd.prox_gamma is not None:
            config[PREFIX + "gamma"] = float(rnd.prox_gamma)
            if rnd.new_anchor or self.anchor is None:
                self.anchor = [a.copy() for a in sent]  # x_s: this round's model
            else:
                config[PREFIX + "anchor"] = pack(self.anchor)
        if self.drift:
            if self.control is None:
                self.control = [np.zeros_like(a) for a in sent]
            config[PREFIX + "control"] = pack(self.control)
            if self.rule.drift_window is not None or self.rule.drift_share is not None:
                config[PREFIX + "window"] = self.rule.control_steps(rnd.steps)
        return config

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        if self.max_iterations is not None and self.cursor.iteration >= self.max_iterations:
            return []  # the budget is spent: Flower's remaining rounds train nothing
        pairs = super().configure_fit(server_round, parameters, client_manager)
        if not pairs:
            return pairs
        self._num_clients = client_manager.num_available()
        config = {**pairs[0][1].config, **self.round_config(parameters)}
        fit_ins = FitIns(parameters, config)
        return [(client, fit_ins) for client, _ in pairs]

    # ----------------------------------------------------------------- untrusted clients

    def check_update(self, cid: str, res: FitRes) -> _Update:
        """One client's update, or :class:`RejectedUpdate` saying why it cannot be averaged: a failed status, a
        ``num_examples`` that is not an integer in [1, 2^53], arrays that are unreadable, of another number,
        shape or dtype than the global model sent, or not finite, a ``stlsgd_loss`` that is not a finite
        number within 1e100, and with drift correction a missing or malformed control-variate update."""
        if self.weights is None:
            raise RejectedUpdate("no round was configured")
        if res.status.code != Code.OK:
            raise RejectedUpdate(f"status {res.status.code.name}: {res.status.message}")
        n = res.num_examples
        if not (isinstance(n, (int, np.integer)) and not isinstance(n, bool) and 1 <= n <= MAX_EXAMPLES):
            raise RejectedUpdate(f"num_examples must be an integer from 1 to 2^53, got {n!r}")
        try:
            arrays = parameters_to_ndarrays(res.parameters)
        except Exception as exc:  # noqa: BLE001 - anything a client sends that NumPy cannot read
            raise RejectedUpdate(f"unreadable parameters ({brief(exc, 80)})") from None
        _check_arrays("parameters", arrays, self.weights)
        metrics = dict(res.metrics or {})
        if PREFIX + "loss" in metrics:
            loss = metrics[PREFIX + "loss"]
            if (x := _finite(loss)) is None or abs(x) > MAX_LOSS:
                raise RejectedUpdate(f"stlsgd_loss must be a finite number within 1e100, got {loss!r}")
        delta = None
        if self.drift:
            data = metrics.pop(PREFIX + "control_delta", None)
            if not isinstance(data, bytes):
                raise RejectedUpdate("no stlsgd_control_delta (drift correction is on: use StlsgdClient or return it)")
            try:
                delta = unpack(data)
            except Exception as exc:  # noqa: BLE001
                raise RejectedUpdate(f"unreadable stlsgd_control_delta ({brief(exc, 80)})") from None
            _check_arrays("stlsgd_control_delta", delta, self.weights)
        return _Update(_one_line(cid, 40), arrays, int(n), metrics, delta)

    def _outliers(self, updates: list[_Update], server_round: int) -> list[Rejection]:
        """Updates too far from the round's median (robust only with 3 or more: a median of 2 is their mean)."""
        ratio = self.max_update_ratio
        if ratio is None or len(updates) < 3:
            return []
        out: list[Rejection] = []
        measures: list[tuple[str, list[float]]] = [("update", [_distance(u.arrays, self.weights) for u in updates])]
        if self.drift:
            measures.append(("control-variate update", [_distance(u.control_delta or [], None) for u in updates]))
        for what, norms in measures:
            median = float(np.median(norms))
            for u, norm in zip(updates, norms):
                if norm > ratio * median and all(r.cid != u.cid for r in out):
                    out.append(
                        Rejection(
                            server_round,
                            u.cid,
                            f"{what} norm {norm:.3g} is over {ratio:g}x the round's median {median:.3g}",
                        )
                    )
        return out

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Check every update (:meth:`check_update`, then the outlier rule), average the rest with capped
        weights, update SCAFFOLD's c, feed the loss back and advance the plan. When no update survives (or one
        was rejected and ``accept_failures`` is False) nothing is averaged and the plan does not move: the same
        round is configured again. The metrics hold ``stlsgd_rejected`` (a count) and ``stlsgd_rejections``
        (``client <cid>: <why>; ...``); each rejection is also logged on the ``stlsgd`` logger."""
        rnd = self.driver.round
        if rnd is None or self.weights is None:
            return None, {}
        rejected: list[Rejection] = []
        updates: list[_Update] = []
        for proxy, res in sorted(results, key=lambda pair: _cid_order(pair[0].cid)):  # a fixed summation order
            try:
                updates.append(self.check_update(proxy.cid, res))
            except RejectedUpdate as why:
                rejected.append(Rejection(server_round, _one_line(proxy.cid, 40), str(why)))
        outliers = self._outliers(updates, server_round)
        rejected += outliers
        updates = [u for u in updates if all(r.cid != u.cid for r in outliers)]
        parameters = None
        if updates and (self.accept_failures or not (failures or rejected)):
            parameters = self._average(rnd, updates, rejected, server_round)
        metrics: dict[str, Scalar] = {}
        if parameters is not None and self.fit_metrics_aggregation_fn:
            metrics = dict(self.fit_metrics_aggregation_fn([(u.weight, u.metrics) for u in updates]))  # type: ignore[misc]
        metrics[PREFIX + "rejected"] = len(rejected)
        if rejected:
            metrics[PREFIX + "rejections"] = "; ".join(str(r) for r in rejected)
            for r in rejected:
                log.warning("stlsgd: Flower round %d: rejected the update of %s", server_round, r)
            self.rejected += rejected
        if parameters is None:
            first = next((f for f in failures if isinstance(f, BaseException)), None)
            log.warning(
                "stlsgd: Flower round %d: nothing averaged (%d updates, %d rejected, %d failures%s); the plan's "
                "round %d runs again",
                server_round,
                len(results),
                len(rejected),
                len(failures),
                "" if first is None else f", the first: {type(first).__name__}: {brief(first, 160)}",
                rnd.index,
            )
        return parameters, metrics

    def _average(
        self, rnd: Round, updates: list[_Update], rejected: list[Rejection], server_round: int
    ) -> Parameters | None:
        """The capped-weight average of the checked updates (float64 sums), SCAFFOLD's server step, the fed-back
        loss, and the plan's advance; None (and a rejection of the round) if the average is not finite."""
        assert self.weights is not None
        counts = np.array([u.num_examples for u in updates], dtype=np.float64)
        limit = math.inf if self.example_cap is None else self.example_cap * float(np.median(counts))
        for u in updates:
            u.weight = u.num_examples if u.num_examples <= limit else limit
        total = sum(u.weight for u in updates)
        shares = [u.weight / total for u in updates]
        averaged = []
        for i, like in enumerate(self.weights):
            acc = np.zeros(like.shape, dtype=np.float64)
            for share, u in zip(shares, updates):
                acc += share * u.arrays[i].astype(np.float64)
            averaged.append(acc.astype(like.dtype))
        if not all(np.all(np.isfinite(a)) for a in averaged):
            rejected.append(Rejection(server_round, "*", "the average of the valid updates is not finite"))
            return None
        if self.drift:
            # SCAFFOLD's server step: c <- c + (1/N) sum over the round's clients of (c_i^+ - c_i), N the clients
            # available (all of them take part in a full-participation round: c becomes the mean of the c_i).
            assert self.control is not None
            n = max(self._num_clients, len(updates))
            for i, c in enumerate(self.control):
                step = np.zeros(c.shape, dtype=np.float64)
                for u in updates:
                    step += u.control_delta[i].astype(np.float64)  # type: ignore[index]
                self.control[i] = (c.astype(np.float64) + step / n).astype(c.dtype)
        losses = [
            (share, float(u.metrics[PREFIX + "loss"]))
            for share, u in zip(shares, updates)
            if PREFIX + "loss" in u.metrics
        ]
        if losses:
            weight = sum(s for s, _ in losses)
            objective = sum((s / weight) * v for s, v in losses)
            if math.isfinite(objective):
                self.objective = objective
        self.weights = averaged
        self.driver.count(rnd.steps)  # the clients ran the round's steps: count them, move the cursor past it
        self.driver.finish()
        self.averages += 1
        self.completed.append(rnd)
        return ndarrays_to_parameters(averaged)

    # ----------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The plan driver's state (the plan's identity and position) and SCAFFOLD's c: save it with the global
        parameters to restart the server."""
        return {
            "driver": self.driver.state_dict(),
            "averages": self.averages,
            "objective": self.objective,
            "anchor": None if self.anchor is None else [a.copy() for a in self.anchor],
            "control": None if self.control is None else [c.copy() for c in self.control],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        who = "StlsgdFedAvg.load_state_dict"
        if not isinstance(state, dict) or not {"averages", "objective", "anchor"} <= state.keys():
            raise StlsgdError(f"{who}: not a state StlsgdFedAvg.state_dict() saved")
        driver = state.get("driver")
        if driver is None and "cursor" in state:  # saved before the plan driver: a round boundary
            driver = {"plan": state.get("plan"), "cursor": state["cursor"], "step": 0, "feedback": None}
        control = state.get("control")
        if self.drift != (control is not None) and int(state["averages"]) > 0:
            have = "has" if control is not None else "has no"
            raise StlsgdError(
                f"{who}: the state {have} a control variate, and this strategy's "
                f"drift={self.drift}: build the strategy as the saved one was"
            )
        self.driver.load_state_dict(driver, who=who)  # type: ignore[arg-type]
        self.averages = int(state["averages"])
        self.objective = state["objective"]
        self.anchor = None if state["anchor"] is None else [np.asarray(a).copy() for a in state["anchor"]]
        self.control = None if control is None else [np.asarray(c).copy() for c in control]


def _cid_order(cid: str) -> tuple[int, int | str]:
    return (0, int(cid)) if str(cid).isdigit() else (1, str(cid))


# --------------------------------------------------------------------------- the client side


Batches = Iterable[tuple[torch.Tensor, torch.Tensor]] | Callable[[int], tuple[torch.Tensor, torch.Tensor]]


def _batch_source(batches: Batches) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """``batches`` as a function of the plan's batch size: a callable as it is; an iterable (a DataLoader) read
    in order, started again when it runs out."""
    if callable(batches):
        return batches
    state: dict[str, Any] = {"it": iter(batches)}

    def next_batch(_: int) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return next(state["it"])
        except StopIteration:
            state["it"] = iter(batches)
            try:
                return next(state["it"])
            except StopIteration:
                raise StlsgdError(
                    "run_local_steps: the batches are empty (or an iterator that ran out: pass a "
                    "DataLoader, a list, or a function of the batch size)"
                ) from None

    return next_batch


def _refuse(key: str, what: str) -> StlsgdError:
    return StlsgdError(f"run_local_steps: {PREFIX}{key}: {what} (a malformed round from the server: not run)")


def _config_int(config: dict[str, Scalar], key: str, default: int | None = None) -> int:
    value = config.get(PREFIX + key, default)
    if not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1):
        raise _refuse(key, f"must be an integer >= 1, got {value!r}")
    return int(value)


def _config_lrs(config: dict[str, Scalar], steps: int) -> list[float] | None:
    """The round's per-step learning rates, each a finite number >= 0 (None: the plan leaves the lr to the
    optimizer)."""
    if PREFIX + "lrs" in config:
        data = config[PREFIX + "lrs"]
        if not isinstance(data, bytes) or len(data) != 8 * steps:
            raise _refuse("lrs", f"must be {steps} float64 learning rates, one per step")
        lrs: list[float] = np.frombuffer(data, dtype=np.float64).tolist()
        for lr in lrs:
            if (x := _finite(lr)) is None or x < 0:
                raise _refuse("lrs", f"each must be a finite number >= 0, got {lr!r}")
        return lrs
    if PREFIX + "lr" not in config:
        return None
    sent = config[PREFIX + "lr"]
    if (x := _finite(sent)) is None or x < 0:
        raise _refuse("lr", f"must be a finite number >= 0, got {sent!r}")
    return [x] * steps


def _sent_arrays(model: nn.Module, config: dict[str, Scalar], key: str) -> dict[str, torch.Tensor]:
    """An npz value of the config (``anchor``, ``control``), checked against the model's floating entries in
    :func:`get_weights` order -- number, shapes, finiteness -- as tensors by name on the parameters' devices."""
    state = _floating(model)
    try:
        arrays = unpack(config[PREFIX + key])  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - whatever the bytes are, they are not an npz of arrays
        raise _refuse(key, f"unreadable ({brief(exc, 80)})") from None
    if len(arrays) != len(state):
        raise _refuse(
            key,
            f"holds {len(arrays)} arrays, the model has {len(state)} floating parameters and buffers "
            "(exchange get_weights(model))",
        )
    out = {}
    for (name, tensor), array in zip(state.items(), arrays):
        if tuple(array.shape) != tuple(tensor.shape):
            raise _refuse(key, f"{name} has shape {tuple(tensor.shape)}, got {tuple(array.shape)}")
        if not (np.issubdtype(array.dtype, np.floating) and np.all(np.isfinite(array))):
            raise _refuse(key, f"{name} must hold finite floating values")
        out[name] = torch.as_tensor(array).to(tensor.device, tensor.dtype)
    return out


def _anchor(model: nn.Module, config: dict[str, Scalar]) -> dict[str, torch.Tensor]:
    """x_s per parameter name: the stage's first global model as sent, else (a stage's first round) a DETACHED
    COPY of the model as received -- never the live parameters, whose difference to themselves is always 0."""
    params = dict(model.named_parameters())
    if PREFIX + "anchor" in config:
        sent = _sent_arrays(model, config, "anchor")
        return {n: sent[n] for n in params}
    return {n: p.detach().clone() for n, p in params.items()}


def run_local_steps(
    model: nn.Module,
    batches: Batches,
    config: dict[str, Scalar],
    *,
    optimizer: torch.optim.Optimizer | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
    control: Sequence[np.ndarray] | None = None,
) -> dict[str, Any]:
    """Run exactly the round's ``stlsgd_steps`` local steps on ``model``, which must hold the global model just
    received (:func:`set_weights`).

    ``batches``: ``(x, y)`` pairs (a DataLoader, restarted when it runs out) or a function of the plan's batch
    size returning one pair. ``optimizer``: default plain SGD at the config's lr (a plan without an lr needs
    yours; its lr is then left alone). Each step: ``loss_fn(model(x), y)``, backward, then for STL-SGD^nc the
    proximal gradient (x - x_s)/gamma added to every parameter's gradient, then with drift correction (the
    config holds ``stlsgd_control``, SCAFFOLD's c) c - c_i, then the optimizer's step at the round's lr. With
    ``stlsgd_window`` the new c_i is taken over the round's first that many steps.
    ``control``: this client's c_i from its last round (:func:`get_weights` order; None: zeros).

    Returns ``steps``, ``num_examples`` (samples seen), ``loss`` (the first batch's loss, i.e. the received
    global model's) and ``last_loss``; with drift correction also ``control`` (the new c_i, to keep for the next
    round) and ``control_delta`` (c_i^+ - c_i, to return to the server as ``stlsgd_control_delta``, packed).
    SCAFFOLD's option II: c_i^+ = c_i - c + (x - y_i) / (sum of the round's learning rates), the rule the
    simulator uses; it assumes plain SGD steps (with momentum or Adam the correction is still applied to the
    gradient, but c_i then measures the optimizer's displacement, not the mean gradient).
    """
    if PREFIX + "steps" not in config:
        raise StlsgdError(
            "run_local_steps: the fit config has no stlsgd_steps (is the server's strategy StlsgdFedAvg?)"
        )
    steps = _config_int(config, "steps")
    batch = _config_int(config, "batch", 1)
    lrs = _config_lrs(config, steps)
    if optimizer is None:
        if lrs is None:
            raise StlsgdError("run_local_steps: the plan has no learning rate of its own: pass your optimizer")
        optimizer = torch.optim.SGD(model.parameters(), lr=lrs[0])
    gamma: float | None = None
    if PREFIX + "gamma" in config:
        sent_gamma = config[PREFIX + "gamma"]
        if (g := _finite(sent_gamma)) is None or g <= 0:
            raise _refuse("gamma", f"must be a finite number > 0, got {sent_gamma!r}")
        gamma = g
    anchor = _anchor(model, config) if gamma is not None else {}
    names = list(_floating(model).keys())
    named = list(model.named_parameters())
    correction: list[torch.Tensor] | None = None
    if PREFIX + "control" in config:
        c = _sent_arrays(model, config, "control")
        if control is None:
            mine = {n: torch.zeros_like(t) for n, t in c.items()}
        else:
            mine = _sent_arrays(model, {PREFIX + "c_i": pack(list(control))}, "c_i")
        start = [p.detach().clone() for _, p in named]
        c_i = [mine[n].clone() for n, _ in named]
        correction = cast(list[torch.Tensor], drift_correction(c_i, [c[n] for n, _ in named]))  # c - c_i, all round
    window = _config_int(config, "window", steps) if correction is not None else steps
    at_window: list[torch.Tensor] | None = None
    next_batch = _batch_source(batches)
    model.train()
    first = last = float("nan")
    seen = 0
    lr_sum = 0.0
    for step in range(steps):
        x, y = next_batch(batch)
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        with torch.no_grad():
            live = [i for i, (_, p) in enumerate(named) if p.grad is not None]
            grads = [named[i][1].grad for i in live]
            if gamma is not None:  # d/dx 1/(2 gamma)||x - x_s||^2
                add_proximal(grads, [named[i][1] for i in live], [anchor[named[i][0]] for i in live], gamma)  # type: ignore[arg-type]
            if correction is not None:
                for i, grad in zip(live, grads):
                    grad.add_(correction[i])  # type: ignore[union-attr]  # SCAFFOLD: g - c_i + c
        if lrs is not None:
            for group in optimizer.param_groups:
                group["lr"] = lrs[step]
        if step < window:
            lr_sum += float(optimizer.param_groups[0]["lr"])
        optimizer.step()
        if correction is not None and step + 1 == window < steps:
            at_window = [p.detach().clone() for _, p in named]
        last = float(loss.detach())
        if step == 0:
            first = last
        seen += len(y)
    out: dict[str, Any] = {"steps": steps, "num_examples": seen, "loss": first, "last_loss": last}
    if correction is not None:
        if lr_sum > 0:  # a round of lr 0 leaves c_i as it was
            with torch.no_grad():
                ended = [p.detach() for _, p in named] if at_window is None else at_window
                update_control(c_i, start, ended, correction, lr_sum)
        new = {n: ci for (n, _), ci in zip(named, c_i)}
        # c_i in get_weights order; buffers (BatchNorm statistics) have none: zeros
        out["control"] = [new[n].cpu().numpy() if n in new else mine[n].cpu().numpy().copy() for n in names]
        out["control_delta"] = [
            (new[n] - mine[n]).cpu().numpy() if n in new else np.zeros_like(mine[n].cpu().numpy()) for n in names
        ]
    return out


class StlsgdClient(NumPyClient):
    """A NumPyClient that runs the rounds :class:`StlsgdFedAvg` sends: ``fit`` loads the global model, runs
    :func:`run_local_steps` and returns :func:`get_weights` (and, with drift correction, its control-variate
    update in the metrics as ``stlsgd_control_delta``); ``evaluate`` reports the mean loss and accuracy over
    ``eval_batches`` (required for federated evaluation).

    With drift correction the client keeps its c_i between rounds in ``self.control``: keep the client object
    alive, or save and restore ``control`` yourself (a Flower ClientApp that builds a new client every round:
    through its context's state)."""

    def __init__(
        self,
        model: nn.Module,
        batches: Batches,
        *,
        eval_batches: Iterable[Any] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
    ) -> None:
        self.model, self.batches, self.eval_batches = model, batches, eval_batches
        self.optimizer, self.loss_fn = optimizer, loss_fn
        self.control: list[np.ndarray] | None = None

    def get_parameters(self, config: dict[str, Scalar]) -> list[np.ndarray]:
        return get_weights(self.model)

    def fit(
        self, parameters: list[np.ndarray], config: dict[str, Scalar]
    ) -> tuple[list[np.ndarray], int, dict[str, Scalar]]:
        set_weights(self.model, parameters)
        out = run_local_steps(
            self.model, self.batches, config, optimizer=self.optimizer, loss_fn=self.loss_fn, control=self.control
        )
        metrics: dict[str, Scalar] = {PREFIX + "loss": out["loss"], PREFIX + "steps": out["steps"]}
        if "control" in out:
            self.control = out["control"]
            metrics[PREFIX + "control_delta"] = pack(out["control_delta"])
        return get_weights(self.model), out["num_examples"], metrics

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Scalar]) -> tuple[float, int, dict[str, Scalar]]:
        if self.eval_batches is None:
            raise StlsgdError(
                "StlsgdClient.evaluate: give the client eval_batches (or set the strategy's fraction_evaluate=0)"
            )
        set_weights(self.model, parameters)
        self.model.eval()
        total, correct, n = 0.0, 0, 0
        with torch.no_grad():
            for x, y in self.eval_batches:
                out = self.model(x)
                total += float(self.loss_fn(out, y)) * len(y)
                correct += int((out.argmax(1) == y).sum())
                n += len(y)
        return total / max(n, 1), n, {"accuracy": correct / max(n, 1)}


# --------------------------------------------------------------------------- one process, no ray, no network


class InProcessClientProxy(ClientProxy):
    """A Flower client called directly in the server's process (what :func:`run_in_process` registers)."""

    def __init__(self, cid: str, client: Client | NumPyClient) -> None:
        super().__init__(cid)
        self.node_id = int(cid) if cid.isdigit() else abs(hash(cid))
        self.client: Client = client.to_client() if isinstance(client, NumPyClient) else client

    def get_properties(self, ins: GetPropertiesIns, timeout: float | None, group_id: int | None) -> GetPropertiesRes:
        return self.client.get_properties(ins)

    def get_parameters(self, ins: GetParametersIns, timeout: float | None, group_id: int | None) -> GetParametersRes:
        return self.client.get_parameters(ins)

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        return self.client.fit(ins)

    def evaluate(self, ins: EvaluateIns, timeout: float | None, group_id: int | None) -> EvaluateRes:
        return self.client.evaluate(ins)

    def reconnect(self, ins: ReconnectIns, timeout: float | None, group_id: int | None) -> DisconnectRes:
        return DisconnectRes(reason="")


def run_in_process(strategy: FedAvg, clients: Sequence[Client | NumPyClient], num_rounds: int | None = None) -> History:
    """Flower's own server loop (``flwr.server.Server.fit``) over ``clients`` called in this process, one after
    another: no ray, no sockets. ``num_rounds`` defaults to ``strategy.planned_rounds()`` for a
    :class:`StlsgdFedAvg`."""
    if num_rounds is None:
        if not isinstance(strategy, StlsgdFedAvg):
            raise StlsgdError("run_in_process: give num_rounds")
        num_rounds = strategy.planned_rounds()
    manager = SimpleClientManager()
    for i, client in enumerate(clients):
        manager.register(InProcessClientProxy(str(i), client))
    server = Server(client_manager=manager, strategy=strategy)
    # One client at a time: in one interpreter threads gain nothing (the GIL), and a fixed order keeps the
    # clients' steps from interleaving, so two runs of the same clients give the same bits.
    server.set_max_workers(1)
    history, _ = server.fit(num_rounds=num_rounds, timeout=None)
    return history


__all__ = [
    "InProcessClientProxy",
    "Rejection",
    "RejectedUpdate",
    "StlsgdClient",
    "StlsgdFedAvg",
    "get_weights",
    "pack",
    "run_in_process",
    "run_local_steps",
    "set_weights",
    "unpack",
    "weighted_means",
]
