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

Each Flower round is one round of the plan: ``configure_fit`` asks ``plan.next_round(cursor, feedback)`` and sends,
in the fit config,

==================== =====================================================================================
``stlsgd_steps``     the number of local steps (k_s, or fewer in a stage's last round) -- run exactly these
``stlsgd_lr``        the learning rate of the round's first step (absent when the plan has no lr of its own:
                     the client's optimizer keeps its lr)
``stlsgd_lrs``       float64 bytes, one lr per step, only when the lr changes within the round (lr decay)
``stlsgd_gamma``     STL-SGD^nc's gamma: each step adds the gradient (x - x_s)/gamma of 1/(2 gamma)||x - x_s||^2
``stlsgd_anchor``    x_s, the global model at the start of the stage (npz bytes, :func:`get_weights` order), sent
                     in every round of the stage but its first, where x_s is the model the round sends
``stlsgd_batch``     the plan's per-client mini-batch size (CR-PSGD grows it)
``stlsgd_round``,    the round's index (0-based), stage and nominal period, for logs
``stlsgd_stage``,
``stlsgd_period``
==================== =====================================================================================

``aggregate_fit`` averages as FedAvg does (weighted by the clients' example counts, equal here when the clients
share the batch size) and then advances the plan; the clients' ``stlsgd_loss`` (the loss of the received global
model on each client's first batch) is fed back to adaptive plans (AdaComm). Parameters travel as
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
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stlsgd.algorithms.plan import Cursor, Feedback, Plan, Round
from stlsgd.errors import StlsgdError
from stlsgd.integrations import missing

try:
    from flwr.client import Client, NumPyClient
    from flwr.common import (
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
        parameters_to_ndarrays,
    )
    from flwr.server import History, Server, SimpleClientManager
    from flwr.server.client_manager import ClientManager
    from flwr.server.client_proxy import ClientProxy
    from flwr.server.strategy import FedAvg
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise missing("flwr", "flower", exc) from exc

PREFIX = "stlsgd_"


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
    ``fit_metrics_aggregation_fn``: the round's ``stlsgd_loss``)."""
    total = sum(n for n, _ in metrics)
    keys = {k for _, m in metrics for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if total <= 0:
        return {}
    return {k: sum(n * float(m[k]) for n, m in metrics if k in m) / total for k in sorted(keys)}


class StlsgdFedAvg(FedAvg):
    """FedAvg whose rounds are the rounds of ``plan`` (see the module docstring).

    ``max_iterations``: stop configuring training once the plan reaches this many local steps (rounds are never
    cut); :meth:`planned_rounds` counts the rounds that takes. Other keyword arguments are FedAvg's; a user's
    ``on_fit_config_fn`` config is sent too (the ``stlsgd_`` keys win).
    """

    def __init__(self, plan: Plan, *, max_iterations: int | None = None, **fedavg_options: Any) -> None:
        fedavg_options.setdefault("fit_metrics_aggregation_fn", weighted_means)
        super().__init__(**fedavg_options)
        if max_iterations is not None and max_iterations < 1:
            raise StlsgdError(f"max_iterations: must be >= 1 local step, got {max_iterations}")
        self.plan = plan
        self.max_iterations = max_iterations
        self.cursor = Cursor()
        self.averages = 0
        self.completed: list[Round] = []  # the rounds averaged so far
        self.objective: float | None = None
        self.anchor: list[np.ndarray] | None = None
        self._round: Round | None = None
        self._feedback = Feedback()

    def __repr__(self) -> str:
        return f"StlsgdFedAvg(plan={type(self.plan).__name__}, accept_failures={self.accept_failures})"

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

    def round_config(self, parameters: Parameters) -> dict[str, Scalar]:
        """Settle the next round of the plan and the config that tells the clients how to run it."""
        self._feedback = Feedback(objective=self.objective)
        rnd = self.plan.next_round(self.cursor, self._feedback)
        self._round = rnd
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
                self.anchor = [a.copy() for a in parameters_to_ndarrays(parameters)]  # x_s: this round's model
            else:
                config[PREFIX + "anchor"] = pack(self.anchor)
        return config

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        if self.max_iterations is not None and self.cursor.iteration >= self.max_iterations:
            return []  # the budget is spent: Flower's remaining rounds train nothing
        pairs = super().configure_fit(server_round, parameters, client_manager)
        if not pairs:
            return pairs
        config = {**pairs[0][1].config, **self.round_config(parameters)}
        fit_ins = FitIns(parameters, config)
        return [(client, fit_ins) for client, _ in pairs]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        parameters, metrics = super().aggregate_fit(server_round, results, failures)
        if parameters is None or self._round is None:
            return parameters, metrics  # no average: the same round of the plan is configured again
        losses = [
            (res.num_examples, res.metrics[PREFIX + "loss"]) for _, res in results if PREFIX + "loss" in res.metrics
        ]
        weight = sum(n for n, _ in losses)
        if losses and weight > 0:
            self.objective = float(sum(n * float(v) for n, v in losses) / weight)
        self.averages += 1
        self.completed.append(self._round)
        self.cursor = self.plan.advance(self.cursor, self._round, self._feedback)
        self._round = None
        return parameters, metrics

    def state_dict(self) -> dict[str, Any]:
        """The plan's position (save it with the global parameters to restart the server)."""
        return {
            "cursor": self.cursor.to_dict(),
            "averages": self.averages,
            "objective": self.objective,
            "anchor": None if self.anchor is None else [a.copy() for a in self.anchor],
            "plan": {"name": type(self.plan).__name__, **self.plan.describe()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        plan = {"name": type(self.plan).__name__, **self.plan.describe()}
        if state.get("plan") != plan:
            raise StlsgdError(
                f"StlsgdFedAvg.load_state_dict: the state was taken with plan {state.get('plan')}, not {plan}"
            )
        self.cursor = Cursor.from_dict(state["cursor"])
        self.averages = int(state["averages"])
        self.objective = state["objective"]
        self.anchor = None if state["anchor"] is None else [np.asarray(a).copy() for a in state["anchor"]]
        self._round = None


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


def _anchor(model: nn.Module, config: dict[str, Scalar]) -> dict[str, torch.Tensor]:
    """x_s per parameter name: the stage's first global model as sent, else (a stage's first round) a DETACHED
    COPY of the model as received -- never the live parameters, whose difference to themselves is always 0."""
    params = dict(model.named_parameters())
    if PREFIX + "anchor" in config:
        arrays = unpack(config[PREFIX + "anchor"])  # type: ignore[arg-type]
        names = list(_floating(model).keys())
        if len(arrays) != len(names):
            raise StlsgdError(
                f"run_local_steps: the anchor holds {len(arrays)} arrays, the model has {len(names)} "
                "floating parameters and buffers (exchange get_weights(model))"
            )
        sent = dict(zip(names, arrays))
        return {n: torch.as_tensor(sent[n]).to(p.device, p.dtype) for n, p in params.items()}
    return {n: p.detach().clone() for n, p in params.items()}


def run_local_steps(
    model: nn.Module,
    batches: Batches,
    config: dict[str, Scalar],
    *,
    optimizer: torch.optim.Optimizer | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
) -> dict[str, Any]:
    """Run exactly the round's ``stlsgd_steps`` local steps on ``model``, which must hold the global model just
    received (:func:`set_weights`).

    ``batches``: ``(x, y)`` pairs (a DataLoader, restarted when it runs out) or a function of the plan's batch
    size returning one pair. ``optimizer``: default plain SGD at the config's lr (a plan without an lr needs
    yours; its lr is then left alone). Each step: ``loss_fn(model(x), y)``, backward, then for STL-SGD^nc the
    proximal gradient (x - x_s)/gamma added to every parameter's gradient, then the optimizer's step at the
    round's lr. Returns ``steps``, ``num_examples`` (samples seen), ``loss`` (the first batch's loss, i.e. the
    received global model's) and ``last_loss``.
    """
    if PREFIX + "steps" not in config:
        raise StlsgdError(
            "run_local_steps: the fit config has no stlsgd_steps (is the server's strategy StlsgdFedAvg?)"
        )
    steps = int(config[PREFIX + "steps"])
    batch = int(config.get(PREFIX + "batch", 1))
    if PREFIX + "lrs" in config:
        lrs: list[float] | None = np.frombuffer(config[PREFIX + "lrs"], dtype=np.float64).tolist()  # type: ignore[arg-type]
    elif PREFIX + "lr" in config:
        lrs = [float(config[PREFIX + "lr"])] * steps
    else:
        lrs = None
    if lrs is not None and len(lrs) != steps:
        raise StlsgdError(f"run_local_steps: stlsgd_lrs holds {len(lrs)} learning rates for {steps} steps")
    if optimizer is None:
        if lrs is None:
            raise StlsgdError("run_local_steps: the plan has no learning rate of its own: pass your optimizer")
        optimizer = torch.optim.SGD(model.parameters(), lr=lrs[0])
    gamma = float(config[PREFIX + "gamma"]) if PREFIX + "gamma" in config else None
    anchor = _anchor(model, config) if gamma is not None else {}
    params = [(p, anchor[n]) for n, p in model.named_parameters()] if gamma is not None else []
    next_batch = _batch_source(batches)
    model.train()
    first = last = float("nan")
    seen = 0
    for step in range(steps):
        x, y = next_batch(batch)
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        if gamma is not None:
            with torch.no_grad():
                for p, a in params:
                    if p.grad is not None:
                        p.grad.add_(p.detach() - a, alpha=1.0 / gamma)  # d/dx 1/(2 gamma)||x - x_s||^2
        if lrs is not None:
            for group in optimizer.param_groups:
                group["lr"] = lrs[step]
        optimizer.step()
        last = float(loss.detach())
        if step == 0:
            first = last
        seen += len(y)
    return {"steps": steps, "num_examples": seen, "loss": first, "last_loss": last}


class StlsgdClient(NumPyClient):
    """A NumPyClient that runs the rounds :class:`StlsgdFedAvg` sends: ``fit`` loads the global model, runs
    :func:`run_local_steps` and returns :func:`get_weights`; ``evaluate`` reports the mean loss and accuracy over
    ``eval_batches`` (required for federated evaluation)."""

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

    def get_parameters(self, config: dict[str, Scalar]) -> list[np.ndarray]:
        return get_weights(self.model)

    def fit(
        self, parameters: list[np.ndarray], config: dict[str, Scalar]
    ) -> tuple[list[np.ndarray], int, dict[str, Scalar]]:
        set_weights(self.model, parameters)
        out = run_local_steps(self.model, self.batches, config, optimizer=self.optimizer, loss_fn=self.loss_fn)
        return (
            get_weights(self.model),
            out["num_examples"],
            {PREFIX + "loss": out["loss"], PREFIX + "steps": out["steps"]},
        )

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
    """Flower's own server loop (``flwr.server.Server.fit``) over ``clients`` called in this process: no ray, no
    sockets. ``num_rounds`` defaults to ``strategy.planned_rounds()`` for a :class:`StlsgdFedAvg`."""
    if num_rounds is None:
        if not isinstance(strategy, StlsgdFedAvg):
            raise StlsgdError("run_in_process: give num_rounds")
        num_rounds = strategy.planned_rounds()
    manager = SimpleClientManager()
    for i, client in enumerate(clients):
        manager.register(InProcessClientProxy(str(i), client))
    server = Server(client_manager=manager, strategy=strategy)
    history, _ = server.fit(num_rounds=num_rounds, timeout=None)
    return history


__all__ = [
    "InProcessClientProxy",
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
