"""StlsgdFedAvg + StlsgdClient: an stlsgd plan as a Flower run (Flower's own server loop, two clients in this
process, no ray), and the client's proximal term against a hand computation."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.client import NumPyClient
from flwr.common import Code, FitRes, Parameters, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import SimpleClientManager
from torch import nn

from stlsgd.algorithms import STLSGD, AdaComm, LocalSGD
from stlsgd.algorithms.budget import within_budget
from stlsgd.algorithms.plan import InverseTime
from stlsgd.data import make_partition
from stlsgd.errors import StlsgdError
from stlsgd.executors.sampling import Sampler
from stlsgd.executors.simulator import RoundRule, StopRule, init_run_state, run
from stlsgd.integrations.flower import (
    InProcessClientProxy,
    StlsgdClient,
    StlsgdFedAvg,
    get_weights,
    pack,
    run_in_process,
    run_local_steps,
    unpack,
)
from stlsgd.problems.logistic import LogisticRegression


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


class RecordingClient(StlsgdClient):
    """Records, per round, the config, the parameters received and returned, and the forward passes made."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        batches = [(torch.randn(8, 3, generator=g) + seed, torch.randint(0, 2, (8,), generator=g)) for _ in range(3)]
        torch.manual_seed(seed)
        super().__init__(_net(), batches)
        self.forwards = 0
        self.model.register_forward_hook(lambda *_: setattr(self, "forwards", self.forwards + 1))
        self.log: list[dict] = []

    def fit(self, parameters, config):
        before = self.forwards
        arrays, n, metrics = super().fit(parameters, config)
        self.log.append(
            {
                "config": dict(config),
                "received": copy.deepcopy(parameters),
                "returned": arrays,
                "forwards": self.forwards - before,
                "n": n,
                "metrics": metrics,
            }
        )
        return arrays, n, metrics


def test_rounds_follow_the_plan_and_fedavg_averages_parameters_and_bn_buffers() -> None:
    # STL-SGD^nc, T1 = 2, k1 = 1, lr 0.1, gamma 0.5, a budget of 14 local steps. By hand: stage 1 = 2 rounds of 1
    # step (lr 0.1); stage 2 (T 4, k 2, lr 0.05) = 2 rounds of 2; stage 3 (T 8, k 4, lr 0.025) = 2 rounds of 4:
    # 14 steps in 6 rounds. Flower is asked for 8 rounds: the last 2 train nothing.
    plan = STLSGD(lr=0.1, T1=2, k1=1.0, gamma=0.5)
    torch.manual_seed(0)
    initial = get_weights(_net())
    strategy = StlsgdFedAvg(
        plan,
        max_iterations=14,
        initial_parameters=ndarrays_to_parameters(initial),
        fraction_evaluate=0.0,
        min_fit_clients=2,
        min_available_clients=2,
    )
    assert strategy.planned_rounds() == 6
    clients = [RecordingClient(1), RecordingClient(2)]
    run_in_process(strategy, clients, num_rounds=8)
    assert strategy.averages == 6 and strategy.cursor.iteration == 14
    assert [r.steps for r in strategy.completed] == [1, 1, 2, 2, 4, 4]
    keys = [k for k, v in clients[0].model.state_dict().items() if v.is_floating_point()]
    bn = [i for i, k in enumerate(keys) if "running" in k]
    assert bn  # BatchNorm statistics travel with the weights
    for c in clients:
        assert len(c.log) == 6
        cfg = [e["config"] for e in c.log]
        assert [x["stlsgd_steps"] for x in cfg] == [1, 1, 2, 2, 4, 4]
        assert [x["stlsgd_stage"] for x in cfg] == [1, 1, 2, 2, 3, 3]
        assert [x["stlsgd_period"] for x in cfg] == [1, 1, 2, 2, 4, 4]
        assert [x["stlsgd_lr"] for x in cfg] == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
        assert all(x["stlsgd_gamma"] == 0.5 and "stlsgd_lrs" not in x for x in cfg)
        assert ["stlsgd_anchor" in x for x in cfg] == [False, True, False, True, False, True]
        assert [e["forwards"] for e in c.log] == [1, 1, 2, 2, 4, 4]  # exactly the round's local steps
        for r in (1, 3, 5):  # x_s: the global model sent in the stage's first round, as sent
            anchor = unpack(cfg[r]["stlsgd_anchor"])
            assert len(anchor) == len(keys)
            for sent, received in zip(anchor, c.log[r - 1]["received"]):
                np.testing.assert_array_equal(sent, received)
    a, b = clients
    np.testing.assert_array_equal(a.log[0]["received"][0], initial[0])
    for r in range(6):
        for x, y in zip(a.log[r]["received"], b.log[r]["received"]):
            np.testing.assert_array_equal(x, y)  # both clients start each round from one global model
        if r == 5:
            break
        # right after each average: the mean of the two clients' models, parameters AND BN buffers
        for i, (x, y) in enumerate(zip(a.log[r]["returned"], b.log[r]["returned"])):
            mean = (x.astype(np.float64) + y.astype(np.float64)) / 2
            np.testing.assert_allclose(a.log[r + 1]["received"][i], mean.astype(x.dtype), rtol=1e-6, atol=1e-7)
        assert any(not np.array_equal(a.log[r]["returned"][i], b.log[r]["returned"][i]) for i in bn)
    # the clients' first-batch losses are fed back (weighted mean), for adaptive plans
    last = [c.log[-1]["metrics"]["stlsgd_loss"] for c in clients]
    assert strategy.objective == pytest.approx(sum(last) / 2)


def _linear(w: list[float]) -> nn.Module:
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([w]))
    return model


def _half_squared(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((out.squeeze(1) - y) ** 2).sum()


BATCH = [(torch.tensor([[1.0, 2.0]]), torch.tensor([0.5]))]


def test_the_proximal_term_against_a_hand_computation() -> None:
    # f(w) = 1/2 (w.x - y)^2 with x = (1, 2), y = 0.5; w = (1, -2); x_s = (0.5, 0.5) sent by the server;
    # gamma = 0.25, lr = 0.1. grad f = (1 - 4 - 0.5) x = (-3.5, -7); prox = (w - x_s)/gamma = (0.5, -2.5)/0.25 =
    # (2, -10); w' = w - 0.1 (-1.5, -17) = (1.15, -0.3).
    # (FedProx's bugs would give: anchor = the live parameters -> prox 0 -> (1.35, -1.3) [flwr #1654]; the norm
    # without the square -> prox (w - x_s)/(2 gamma ||w - x_s||) -> (1.3108, -1.1039) [flwr #2210].)
    model = _linear([1.0, -2.0])
    config = {
        "stlsgd_steps": 1,
        "stlsgd_lr": 0.1,
        "stlsgd_gamma": 0.25,
        "stlsgd_anchor": pack([np.array([[0.5, 0.5]], dtype=np.float32)]),
    }
    out = run_local_steps(model, BATCH, config, loss_fn=_half_squared)
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[1.15, -0.3]]))
    assert out == {"steps": 1, "num_examples": 1, "loss": pytest.approx(0.5 * 3.5**2), "last_loss": out["loss"]}


def test_in_a_stages_first_round_the_anchor_is_a_copy_of_the_received_model() -> None:
    # No anchor sent: x_s = the model received, w0 = (1, -2). Step 1: prox 0 -> w1 = w0 - 0.1 (-3.5, -7) =
    # (1.35, -1.3). Step 2: w1.x - y = -1.75 -> grad f = (-1.75, -3.5); prox = (w1 - w0)/0.25 = (1.4, 2.8) -- not
    # 0, as it would be if x_s were the live parameters -> w2 = w1 - 0.1 (-0.35, -0.7) = (1.385, -1.23).
    model = _linear([1.0, -2.0])
    run_local_steps(model, BATCH, {"stlsgd_steps": 2, "stlsgd_lr": 0.1, "stlsgd_gamma": 0.25}, loss_fn=_half_squared)
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[1.385, -1.23]]))


def test_a_learning_rate_that_decays_within_a_round_is_sent_per_step() -> None:
    strategy = StlsgdFedAvg(LocalSGD(lr=0.1, k=3, lr_decay=0.5))
    config = strategy.round_config(ndarrays_to_parameters([np.zeros((1, 2), np.float32)]))
    lrs = np.frombuffer(config["stlsgd_lrs"], dtype=np.float64)
    np.testing.assert_allclose(lrs, [0.1, 0.1 / 1.5, 0.1 / 2.0])
    assert config["stlsgd_lr"] == 0.1 and config["stlsgd_steps"] == 3 and "stlsgd_gamma" not in config
    model = _linear([0.0, 0.0])
    run_local_steps(model, BATCH, config, loss_fn=lambda out, y: model.weight.sum())  # gradient 1 per weight
    torch.testing.assert_close(model.weight.detach(), -torch.full((1, 2), float(lrs.sum())))


def test_a_plan_without_an_lr_sends_none_and_uses_the_clients_optimizer() -> None:
    strategy = StlsgdFedAvg(LocalSGD(k=2))
    config = strategy.round_config(ndarrays_to_parameters([np.zeros((1, 2), np.float32)]))
    assert "stlsgd_lr" not in config and config["stlsgd_steps"] == 2
    model = _linear([0.0, 0.0])
    with pytest.raises(StlsgdError, match="^run_local_steps: the plan has no learning rate of its own"):
        run_local_steps(model, BATCH, config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.25)
    run_local_steps(model, BATCH, config, optimizer=optimizer, loss_fn=lambda out, y: model.weight.sum())
    torch.testing.assert_close(model.weight.detach(), torch.full((1, 2), -0.5))


# --------------------------------------------------------------------------- untrusted clients


class _Idle(NumPyClient):
    """A client the server never calls: the tests hand aggregate_fit the results themselves."""


GLOBAL = [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)]


def _configured(plan=None, clients: int = 4, **options) -> tuple[StlsgdFedAvg, list[InProcessClientProxy]]:
    """A strategy that has configured round 1 of ``plan`` (Local SGD, k = 2) for ``clients`` clients."""
    options = {"min_fit_clients": clients, "min_available_clients": clients, "fraction_evaluate": 0.0, **options}
    strategy = StlsgdFedAvg(plan or LocalSGD(lr=0.1, k=2), initial_parameters=ndarrays_to_parameters(GLOBAL), **options)
    manager = SimpleClientManager()
    proxies = [InProcessClientProxy(str(i), _Idle()) for i in range(clients)]
    for p in proxies:
        manager.register(p)
    pairs = strategy.configure_fit(1, ndarrays_to_parameters(GLOBAL), manager)
    assert len(pairs) == options["min_fit_clients"]
    return strategy, proxies


def _res(arrays, n=10, loss=0.5, code=Code.OK, message="", **metrics) -> FitRes:
    params = arrays if isinstance(arrays, Parameters) else ndarrays_to_parameters(arrays)
    return FitRes(Status(code, message), params, n, {"stlsgd_loss": loss, **metrics})


def _honest(value: float) -> list[np.ndarray]:
    return [np.full(a.shape, value, a.dtype) for a in GLOBAL]


HONEST = [_honest(v) for v in (1.0, 1.5, 2.0)]  # their mean: 1.5 everywhere


def _bad_updates() -> dict[str, tuple[FitRes, str]]:
    """A malformed update of each kind and the reason the server must give."""
    nan = _honest(1.0)
    nan[0][1, 2] = np.nan
    inf = _honest(1.0)
    inf[1][0] = -np.inf
    return {
        "nan": (_res(nan), "parameters: array 0 holds NaN or infinite values"),
        "inf": (_res(inf), "parameters: array 1 holds NaN or infinite values"),
        "broadcastable (1,)": (_res([np.ones(1, np.float32), np.ones(3, np.float32)]), "array 0 is float32[1]"),
        "transposed": (_res([np.ones((3, 2), np.float32), np.ones(3, np.float32)]), "array 0 is float32[3, 2]"),
        "float64": (_res([a.astype(np.float64) for a in _honest(1.0)]), "array 0 is float64[2, 3]"),
        "too few arrays": (_res(_honest(1.0)[:1]), "parameters: 1 arrays, the global model has 2"),
        "too many arrays": (_res([*_honest(1.0), np.ones(3, np.float32)]), "3 arrays, the global model has 2"),
        "unreadable": (_res(Parameters(tensors=[b"junk", b"junk"], tensor_type="numpy.ndarray")), "unreadable"),
        "num_examples 0": (_res(_honest(1.0), n=0), "num_examples must be an integer from 1 to 2^53, got 0"),
        "num_examples -5": (_res(_honest(1.0), n=-5), "got -5"),
        "num_examples 1e30": (_res(_honest(1.0), n=10**30), "got 1000000000000000000000000000000"),
        "num_examples float": (_res(_honest(1.0), n=2.5), "got 2.5"),
        "num_examples bool": (_res(_honest(1.0), n=True), "got True"),
        "loss nan": (_res(_honest(1.0), loss=float("nan")), "stlsgd_loss must be a finite number"),
        "loss inf": (_res(_honest(1.0), loss=float("inf")), "got inf"),
        "loss 1e308": (_res(_honest(1.0), loss=1e308), "got 1e+308"),
        "loss text": (_res(_honest(1.0), loss="low"), "got 'low'"),
        "loss 10^400": (_res(_honest(1.0), loss=10**400), "stlsgd_loss must be a finite number within 1e100"),
        "failed status": (
            _res(_honest(1.0), code=Code.FIT_NOT_IMPLEMENTED, message="no\nfit " + "x" * 500),
            "status FIT_NOT_IMPLEMENTED: no fit xxx",  # the client's text on one bounded line
        ),
    }


@pytest.mark.parametrize("kind", list(_bad_updates()))
def test_a_malformed_update_is_rejected_and_reported_and_the_rest_averaged(kind, caplog) -> None:
    bad, reason = _bad_updates()[kind]
    strategy, proxies = _configured()
    results = [(proxies[i], _res(HONEST[i])) for i in range(3)] + [(proxies[3], bad)]
    with caplog.at_level(logging.WARNING, logger="stlsgd"):
        parameters, metrics = strategy.aggregate_fit(1, results, [])
    assert parameters is not None
    for got in parameters_to_ndarrays(parameters):
        np.testing.assert_array_equal(got, np.full(got.shape, 1.5, np.float32))  # the three honest ones only
    assert metrics["stlsgd_rejected"] == 1
    assert metrics["stlsgd_rejections"].startswith("client 3: ") and reason in metrics["stlsgd_rejections"]
    assert "\n" not in metrics["stlsgd_rejections"] and len(metrics["stlsgd_rejections"]) < 250
    assert [(r.cid, r.server_round) for r in strategy.rejected] == [("3", 1)]
    assert any("client 3: " in m and reason in m for m in caplog.messages)
    assert strategy.averages == 1 and strategy.cursor.index == 1  # the round counted once
    assert strategy.objective == pytest.approx(0.5)


def test_counts_summing_to_zero_average_nothing_and_the_plan_does_not_move(caplog) -> None:
    strategy, proxies = _configured()
    results = [(p, _res(HONEST[i % 3], n=0)) for i, p in enumerate(proxies)]
    with caplog.at_level(logging.WARNING, logger="stlsgd"):
        parameters, metrics = strategy.aggregate_fit(1, results, [])
    assert parameters is None and metrics["stlsgd_rejected"] == 4
    assert strategy.averages == 0 and strategy.cursor.index == 0
    assert "nothing averaged (4 updates, 4 rejected, 0 failures); the plan's round 0 runs again" in caplog.text
    manager = SimpleClientManager()
    for p in proxies:
        manager.register(p)
    again = strategy.configure_fit(2, ndarrays_to_parameters(GLOBAL), manager)
    assert again[0][1].config["stlsgd_round"] == 0  # the same round of the plan is sent again


def test_a_count_that_lies_is_capped_at_the_rounds_median() -> None:
    # counts 10, 10, 10 and 10^9: the liar weighs as much as the median client, not 10^8 times more
    strategy, proxies = _configured()
    results = [(proxies[i], _res(HONEST[i])) for i in range(3)] + [(proxies[3], _res(_honest(3.5), n=10**9))]
    parameters, metrics = strategy.aggregate_fit(1, results, [])
    for got in parameters_to_ndarrays(parameters):
        np.testing.assert_array_equal(got, np.full(got.shape, 2.0, np.float32))  # (1 + 1.5 + 2 + 3.5) / 4
    assert metrics["stlsgd_rejected"] == 0
    # FedAvg's raw counts when asked (example_cap=None): the liar is the model
    strategy, proxies = _configured(example_cap=None)
    parameters, _ = strategy.aggregate_fit(1, results, [])
    np.testing.assert_allclose(parameters_to_ndarrays(parameters)[0], 3.5, rtol=1e-6)


@pytest.mark.parametrize("scale", [1e30, -20.0], ids=["huge", "sign-flipped x20"])
def test_an_update_far_beyond_the_rounds_median_is_rejected(scale: float) -> None:
    strategy, proxies = _configured()
    results = [(proxies[i], _res(HONEST[i])) for i in range(3)] + [(proxies[3], _res(_honest(scale)))]
    parameters, metrics = strategy.aggregate_fit(1, results, [])
    np.testing.assert_array_equal(parameters_to_ndarrays(parameters)[1], np.full(3, 1.5, np.float32))
    assert metrics["stlsgd_rejections"].startswith("client 3: update norm ")
    assert "over 10x the round's median" in metrics["stlsgd_rejections"]


def test_a_clients_huge_loss_does_not_crash_an_adaptive_server() -> None:
    # AdaComm's period is k0 sqrt(F / F_0), F_0 the loss fed back before round 2: a later fed-back 1e308 (or the
    # weighted sum's overflow n * 1e308) used to make the next configure_fit raise.
    strategy, proxies = _configured(AdaComm(lrs=InverseTime(0.1), k0=2))
    manager = SimpleClientManager()
    for p in proxies:
        manager.register(p)
    for server_round, liar in ((1, 0.5), (2, 1e308), (3, float("inf")), (4, float("nan"))):
        if server_round > 1:
            strategy.configure_fit(server_round, ndarrays_to_parameters(GLOBAL), manager)
        results = [(proxies[i], _res(HONEST[i], loss=0.5)) for i in range(3)] + [
            (proxies[3], _res(HONEST[0], loss=liar))
        ]
        strategy.aggregate_fit(server_round, results, [])
    config = strategy.configure_fit(5, ndarrays_to_parameters(GLOBAL), manager)[0][1].config
    assert strategy.objective == pytest.approx(0.5) and config["stlsgd_round"] == 4 and config["stlsgd_steps"] == 2
    assert [r.server_round for r in strategy.rejected] == [2, 3, 4]


def test_every_update_rejected_leaves_the_model_and_the_plan_where_they_were() -> None:
    strategy, proxies = _configured()
    bad = _honest(1.0)
    bad[0][0, 0] = np.nan
    parameters, metrics = strategy.aggregate_fit(1, [(p, _res(bad)) for p in proxies], [])
    assert parameters is None and metrics["stlsgd_rejected"] == 4 and strategy.cursor.index == 0


def test_a_round_of_failed_clients_says_why_and_does_not_move_the_plan(caplog) -> None:
    strategy, proxies = _configured()
    with caplog.at_level(logging.WARNING, logger="stlsgd"):
        parameters, _ = strategy.aggregate_fit(1, [], [NameError("name 'x' is not defined")] * 4)
    assert parameters is None and strategy.cursor.index == 0
    assert "(0 updates, 0 rejected, 4 failures, the first: NameError: name 'x' is not defined)" in caplog.text


def test_without_accept_failures_one_rejection_averages_nothing() -> None:
    strategy, proxies = _configured(accept_failures=False)
    results = [(proxies[i], _res(HONEST[i])) for i in range(3)] + [(proxies[3], _res(HONEST[0], n=-1))]
    parameters, metrics = strategy.aggregate_fit(1, results, [])
    assert parameters is None and metrics["stlsgd_rejected"] == 1 and strategy.cursor.index == 0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"stlsgd_lr": float("nan")}, "run_local_steps: stlsgd_lr: must be a finite number >= 0, got nan"),
        ({"stlsgd_lr": float("inf")}, "stlsgd_lr: must be a finite number >= 0, got inf"),
        ({"stlsgd_lr": -0.1}, "stlsgd_lr: must be a finite number >= 0, got -0.1"),
        ({"stlsgd_lr": 0.1, "stlsgd_lrs": np.array([0.1, np.nan]).tobytes()}, "stlsgd_lrs: each must be a finite"),
        ({"stlsgd_lr": 10**400}, "stlsgd_lr: must be a finite number >= 0, got 1000"),
        ({"stlsgd_lr": 0.1, "stlsgd_lrs": np.array([0.1]).tobytes()}, "stlsgd_lrs: must be 2 float64"),
        ({"stlsgd_lr": 0.1, "stlsgd_steps": -3}, "stlsgd_steps: must be an integer >= 1, got -3"),
        ({"stlsgd_lr": 0.1, "stlsgd_gamma": 0.25, "stlsgd_anchor": pack([np.zeros(1, np.float32)])}, "has shape"),
        ({"stlsgd_lr": 0.1, "stlsgd_gamma": 0.25, "stlsgd_anchor": b"junk"}, "stlsgd_anchor: unreadable"),
        ({"stlsgd_lr": 0.1, "stlsgd_gamma": float("nan")}, "stlsgd_gamma: must be a finite number > 0"),
        ({"stlsgd_lr": 0.1, "stlsgd_control": pack([np.ones((1, 1), np.float32)])}, "stlsgd_control: weight has"),
    ],
)
def test_a_malformed_round_is_refused_by_the_client_in_one_line(config, message) -> None:
    model = _linear([1.0, -2.0])
    with pytest.raises(StlsgdError) as err:
        run_local_steps(model, BATCH, {"stlsgd_steps": 2, **config}, loss_fn=_half_squared)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("run_local_steps: ")
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[1.0, -2.0]]))  # nothing was run


# --------------------------------------------------------------------------- the logistic problem as Flower clients


class LogisticClient(StlsgdClient):
    """Eq. 8's logistic regression (float64, no bias) as a torch client; its t-th local step uses ``rows(t)``,
    the training-set rows of its mini-batch."""

    def __init__(self, problem: LogisticRegression, rows) -> None:
        X = torch.as_tensor(problem.X.toarray())
        y = torch.as_tensor(problem.y)
        model = nn.Linear(problem.dim, 1, bias=False, dtype=torch.float64)
        with torch.no_grad():
            model.weight.zero_()  # the simulator's x_0
        lam = problem.lam

        def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return F.softplus(-target * out.squeeze(1)).mean() + 0.5 * lam * (model.weight**2).sum()

        self.step = 0

        def batch(_: int) -> tuple[torch.Tensor, torch.Tensor]:
            r = torch.as_tensor(rows(self.step))
            self.step += 1
            return X[r], y[r]

        super().__init__(model, batch, loss_fn=loss_fn)


def _strategy_for(plan, clients: int, max_iterations: int, **options) -> StlsgdFedAvg:
    return StlsgdFedAvg(
        plan,
        max_iterations=max_iterations,
        initial_parameters=ndarrays_to_parameters([np.zeros((1, 64))]),
        min_fit_clients=clients,
        min_available_clients=clients,
        fraction_evaluate=0.0,
        **options,
    )


class Poisoner(NumPyClient):
    """Sends, in turn: NaN weights, weights 10^30 times the global model plus one, the global model sign-flipped and
    scaled by 20, a count of 10^30, and a count of 10^9 with weights that undo its honest neighbour's round."""

    def __init__(self, honest: LogisticClient) -> None:
        self.honest, self.round = honest, 0

    def fit(self, parameters, config):
        self.round += 1
        x = parameters[0]
        y = self.honest.model.weight.detach().numpy().copy()  # the last model its honest neighbour returned
        kind = self.round % 5
        if kind == 0:
            return [np.full_like(x, np.nan)], 10, {"stlsgd_loss": 0.1}
        if kind == 1:
            return [1e30 * (x + 1.0)], 10, {"stlsgd_loss": 0.1}
        if kind == 2:
            return [-20.0 * (x + 0.1)], 10, {"stlsgd_loss": 0.1}
        if kind == 3:
            return [x], 10**30, {"stlsgd_loss": 0.1}
        return [x - (y - x)], 10**9, {"stlsgd_loss": 0.1}


def test_one_poisoning_client_of_four_does_not_stop_the_three_honest_ones(digits) -> None:
    ds, problem = digits
    partition = make_partition(ds.y, 3, "split", seed=0)
    rng = [np.random.default_rng(c) for c in range(3)]
    draws = [partition.client_rows(c)[rng[c].integers(len(partition.client_rows(c)), size=(100, 1))] for c in range(3)]
    plan = STLSGD(lr=0.5, T1=10, k1=2)  # 70 local steps: 15 rounds of 2, 4 and 8 steps
    accuracy = {}
    for poisoned in (False, True):
        honest = [LogisticClient(problem, lambda t, c=c: draws[c][t]) for c in range(3)]
        clients = [*honest, Poisoner(honest[0])] if poisoned else honest
        strategy = _strategy_for(plan, len(clients), 70)
        run_in_process(strategy, clients, num_rounds=strategy.planned_rounds() + 20)
        assert (
            strategy.averages == 15 and strategy.cursor.iteration == 70
        )  # every round of the plan was averaged, none skipped
        accuracy[poisoned] = problem.evaluate({"w": strategy.weights[0]}).accuracy
        if poisoned:
            assert len(strategy.rejected) == 12  # NaN, huge, sign-flipped, 10^30; the 10^9 liar weighs 1/4
    assert accuracy[False] > 0.95
    assert accuracy[True] >= accuracy[False] - 0.01


@pytest.mark.parametrize(
    ("plan", "window", "share"),
    [
        (STLSGD(lr=0.5, T1=8, k1=2.0), None, None),
        (LocalSGD(lr=0.5, k=5, lr_decay=0.05), None, None),
        (STLSGD(lr=0.5, T1=8, k1=2.0), 3, None),  # rounds of 2 (whole), then 4 and 8 steps (their first 3)
        (STLSGD(lr=0.5, T1=8, k1=2.0), None, 0.5),  # their first 1, 2 and 4: the window the server sends grows
    ],
    ids=["stl_sc", "local_sgd, lr decaying within rounds", "stl_sc, drift window", "stl_sc, drift share"],
)
def test_drift_correction_in_flower_is_the_simulators(digits, plan, window, share) -> None:
    # Four clients, each with one class only (s = 0): the drift the control variates exist for. The same plan,
    # the same samples (the simulator's sampler, drawn round by round as it draws them), the same x_0 = 0.
    ds, problem = digits
    partition = make_partition(ds.y, 4, "noniid", seed=0, s=0)
    budget = 56  # stl_sc: 3 stages of 4 rounds (2, 4 and 8 steps, lr 0.5, 0.25, 0.125); local_sgd: 12 of 5
    sim = run(
        plan,
        problem,
        Sampler(partition, 7),
        StopRule(max_iterations=budget),
        init_run_state(problem, Sampler(partition, 7), 4, 7),
        progress=False,
        rule=RoundRule(drift=True, drift_window=window, drift_share=share),
    )
    sampler = Sampler(partition, 7)
    draws = []
    for rnd in plan.rounds():
        if rnd.start_iteration >= budget:
            break
        draws.append(sampler.draw(within_budget(rnd, budget).steps, rnd.batch))  # both cut the last round
    rows = np.concatenate(draws)
    clients = [LogisticClient(problem, lambda t, c=c: rows[t, c]) for c in range(4)]
    strategy = _strategy_for(plan, 4, budget, drift=True, drift_window=window, drift_share=share)
    run_in_process(strategy, clients, num_rounds=strategy.planned_rounds())
    assert strategy.averages == sim.round == 12 and strategy.cursor.iteration == sim.iteration == budget
    assert strategy.rejected == []
    # Not bit for bit: the simulator's kernel keeps the L2 shrink as a running scale (w = scale * v + beta * delta)
    # where torch steps w directly, and FedAvg sums count-weighted shares where the simulator takes a mean: the
    # rounding differs in the last bits (measured: 1e-15 at most, on entries up to 0.8).
    np.testing.assert_allclose(strategy.weights[0][0], sim.clients["w"][0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(strategy.control[0][0], sim.control_mean["w"][0], rtol=1e-12, atol=1e-14)
    for c, client in enumerate(clients):
        np.testing.assert_allclose(client.control[0][0], sim.control["w"][c], rtol=1e-12, atol=1e-14)
    assert np.abs(sim.control["w"]).max() > 1e-2  # the control variates are doing something
    # and they matter: the same Flower run without drift correction ends elsewhere
    plain = [LogisticClient(problem, lambda t, c=c: rows[t, c]) for c in range(4)]
    without = _strategy_for(plan, 4, budget)
    run_in_process(without, plain, num_rounds=without.planned_rounds())
    assert np.abs(without.weights[0][0] - strategy.weights[0][0]).max() > 1e-2


def test_a_drift_corrected_server_and_its_clients_resume_bit_for_bit(digits) -> None:
    ds, problem = digits
    partition = make_partition(ds.y, 4, "noniid", seed=0, s=0)
    plan = LocalSGD(lr=0.5, k=5, lr_decay=0.05)
    rows = Sampler(partition, 3).draw(60, 1)

    def clients() -> list[LogisticClient]:
        return [LogisticClient(problem, lambda t, c=c: rows[t, c]) for c in range(4)]

    whole = _strategy_for(plan, 4, 60, drift=True)
    run_in_process(whole, clients())
    first, cut = _strategy_for(plan, 4, 60, drift=True), clients()
    run_in_process(first, cut, num_rounds=5)
    saved = copy.deepcopy(first.state_dict())
    assert saved["control"] is not None and np.abs(saved["control"][0]).max() > 0
    second = _strategy_for(plan, 4, 60, drift=True)
    second.initial_parameters = ndarrays_to_parameters(first.weights)
    second.load_state_dict(saved)
    resumed = clients()
    for old, new in zip(cut, resumed):  # each client keeps its c_i and its place in its data
        new.control, new.step = copy.deepcopy(old.control), old.step
    run_in_process(second, resumed)
    assert second.averages == whole.averages == 12 and second.cursor == whole.cursor
    assert np.array_equal(second.weights[0], whole.weights[0])
    assert np.array_equal(second.control[0], whole.control[0])
    with pytest.raises(StlsgdError, match="the state has a control variate, and this strategy's drift=False"):
        _strategy_for(plan, 4, 60).load_state_dict(saved)


def test_a_server_state_is_checked_when_loaded() -> None:
    strategy, proxies = _configured()
    strategy.aggregate_fit(1, [(proxies[i], _res(HONEST[i])) for i in range(3)], [])
    saved = strategy.state_dict()
    assert saved["driver"]["cursor"]["index"] == 1 and saved["driver"]["plan"]["name"] == "local_sgd"
    with pytest.raises(StlsgdError, match=r"^StlsgdFedAvg.load_state_dict: the state was taken with plan .*local_sgd"):
        StlsgdFedAvg(LocalSGD(lr=0.1, k=3)).load_state_dict(saved)
    with pytest.raises(StlsgdError, match="^StlsgdFedAvg.load_state_dict: not a state StlsgdFedAvg.state_dict"):
        StlsgdFedAvg(LocalSGD(lr=0.1, k=2)).load_state_dict({"cursor": {}})
    bad = copy.deepcopy(saved)
    bad["driver"]["step"] = -1
    with pytest.raises(StlsgdError, match="step must be a whole number >= 0, got -1"):
        StlsgdFedAvg(LocalSGD(lr=0.1, k=2)).load_state_dict(bad)
    again = StlsgdFedAvg(LocalSGD(lr=0.1, k=2))
    again.load_state_dict(saved)
    assert again.cursor == strategy.cursor and again.averages == 1


def test_scaffold_server_step_counts_every_available_client() -> None:
    # SCAFFOLD's server step c <- c + (1/N) sum over the round's clients of (c_i^+ - c_i), N the clients available:
    # two of four clients answer (fraction_fit 0.5), with updates of c_i 4 and 8 -> c = 0 + (4 + 8) / 4 = 3.
    strategy, proxies = _configured(drift=True, fraction_fit=0.5, min_fit_clients=2)
    assert len(strategy.control) == 2 and all(not c.any() for c in strategy.control)
    results = [
        (proxies[i], _res(HONEST[i], stlsgd_control_delta=pack([np.full(a.shape, d, a.dtype) for a in GLOBAL])))
        for i, d in ((0, 4.0), (1, 8.0))
    ]
    parameters, metrics = strategy.aggregate_fit(1, results, [])
    assert parameters is not None and metrics["stlsgd_rejected"] == 0
    for c in strategy.control:
        np.testing.assert_array_equal(c, np.full(c.shape, 3.0, np.float32))
    # a client without its control-variate update is rejected, not averaged
    assert unpack(strategy.round_config(parameters)["stlsgd_control"])[0][0, 0] == 3.0  # c goes out with round 2
    _, metrics = strategy.aggregate_fit(2, [(proxies[2], _res(HONEST[2]))], [])
    assert "client 2: no stlsgd_control_delta" in metrics["stlsgd_rejections"]


def test_drift_correction_leaves_batchnorm_statistics_without_a_control_variate() -> None:
    torch.manual_seed(0)
    strategy = StlsgdFedAvg(
        LocalSGD(lr=0.1, k=2),
        max_iterations=6,
        drift=True,
        initial_parameters=ndarrays_to_parameters(get_weights(_net())),
        fraction_evaluate=0.0,
        min_fit_clients=2,
        min_available_clients=2,
    )
    clients = [RecordingClient(1), RecordingClient(2)]
    run_in_process(strategy, clients)
    assert strategy.averages == 3 and strategy.rejected == []
    keys = [k for k, v in clients[0].model.state_dict().items() if v.is_floating_point()]
    for k, c, mine in zip(keys, strategy.control, clients[0].control):
        if "running" in k:  # a buffer: no gradient, no control variate
            assert not c.any() and not mine.any()
        elif k == "0.bias":  # feeds the batch norm, which subtracts the batch mean: a zero gradient but for rounding
            assert np.abs(c).max() < 1e-6 and np.abs(mine).max() < 1e-6
        else:
            assert np.abs(c).max() > 0 and np.abs(mine).max() > 0


def test_a_drift_window_without_drift_is_refused_by_the_strategy_and_the_drop_in() -> None:
    from stlsgd.dropin import PlanAverager

    with pytest.raises(StlsgdError, match=r"drift_window: needs drift=True and at least 1 step, got 3"):
        StlsgdFedAvg(LocalSGD(lr=0.5, k=4), drift_window=3)
    model = nn.Linear(2, 1)
    with pytest.raises(StlsgdError, match=r"drift_window: needs drift=True and at least 1 step, got 0"):
        PlanAverager(
            model, torch.optim.SGD(model.parameters(), lr=0.1), LocalSGD(lr=0.5, k=4), drift=True, drift_window=0
        )
