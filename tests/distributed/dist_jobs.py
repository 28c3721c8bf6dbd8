"""The runs of the shared launches (one per world size, session-scoped: tests/distributed/conftest.py)
that the distributed tests compare with the simulator. A test names its job and reads its directory.

Each launch costs a process group and the imports on every rank; one launch per world size
serves every comparison at that size (tests/distributed/dist_worker.py runs them in turn).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from launch import REPO

A9A = REPO / "configs" / "examples" / "a9a_stl_sc.toml"
# eta_1 = 32 (ten times the example's), k_1 = 100: T_1 = ceil(n / eta_1) = 1018, so stages of 11 rounds,
# four stages in 15,000 iterations; with so large an lr a different summation order shows in the first round.
A9A_SET = ["algorithm.lr=32", "algorithm.k=100", "run.target_gap=none", "run.max_iterations=15000"]


def _on_digits49(algorithm: str, max_rounds: int = 25) -> str:
    """A schedule that adapts to what is fed back (``algorithm``: the lines of its [algorithm] section) on 4
    label-sorted digits49 clients, evaluated every 2 rounds, for ``max_rounds`` rounds."""
    return f"""
        name = "s"
        [data]
        dataset = "digits49"
        num_clients = 4
        partition = "noniid"
        [algorithm]
        {algorithm}
        [run]
        target_gap = "none"
        max_rounds = {max_rounds}
        eval_every = 2
    """


CONFIGS = {
    # 6 clients on 4 ranks (2, 2, 1, 1); Algorithm 3 with its anchor reset every stage; a budget stop.
    "nc_uneven": """
        name = "nc_uneven"
        [data]
        dataset = "digits49"
        num_clients = 6
        [algorithm]
        method = "stl_nc"
        lr = 0.5
        k = 2
        T1 = 40
        gamma = 5.0
        [run]
        seed = 3
        target_gap = 1e-3
        max_rounds = 60
    """,
    # Algorithm 2 reaching its target: both executors must stop after the same round.
    "sc_target": """
        name = "sc_target"
        [data]
        dataset = "digits49"
        num_clients = 8
        [algorithm]
        method = "stl_sc"
        lr = 0.8
        k = 4
        [run]
        seed = 1
        target_gap = 1e-3
        max_rounds = 400
    """,
    # Local SGD on a Non-IID split with mini-batches, lr decay and evaluations every 4 rounds or 50 steps.
    "local_noniid": """
        name = "local_noniid"
        [data]
        dataset = "digits49"
        num_clients = 5
        partition = "noniid"
        [algorithm]
        method = "local_sgd"
        lr = 0.5
        lr_decay = 0.01
        k = 5
        batch = 4
        [run]
        seed = 2
        target_gap = 1e-6
        max_iterations = 600
        eval_every = 4
        eval_every_iterations = 50
    """,
    # 5 clients on 2 ranks (3 + 2): the control variates are per client, gathered for the checkpoints; each
    # from its round's first 3 of 4 steps (the window cuts the round's draw). Option II over whole rounds runs
    # on ranks in the stl_auto job (auto's plan has drift correction on this Non-IID data).
    "drift": """
        name = "d"
        [data]
        dataset = "digits49"
        num_clients = 5
        partition = "noniid"
        [algorithm]
        method = "local_sgd"
        lr = 0.5
        lr_decay = 0.02
        k = 4
        drift = true
        drift_window = 3
        outer_lr = 0.7
        [run]
        target_gap = "none"
        max_rounds = 15
    """,
    # AdaComm reads the loss rank 0 evaluates (broadcast with the verdict); QSR's period follows its own lr.
    "adacomm": _on_digits49('method = "adacomm"\nlr = 0.5\nlr_decay = 0.05\nk = 8'),
    # auto in Non-IID data: STL-SGD^sc + drift whose stages end on the objectives rank 0 evaluates.
    "stl_auto": _on_digits49('method = "stl_sc"\nauto = true', max_rounds=40),
    "qsr": _on_digits49('method = "qsr"\nlr = 0.5\nlr_decay = 0.05\nalpha = 2.0\nh_base = 2'),
}


@dataclass(frozen=True)
class Job:
    name: str
    mode: str  # "run": the CLI into the job's directory; "trace": every round's models (dist_worker.py)
    config: str  # a key of CONFIGS, or "a9a"
    sets: list[str] = field(default_factory=list)


# world size -> the jobs of its launch
JOBS: dict[int, list[Job]] = {
    1: [Job("a9a", "trace", "a9a", A9A_SET)],
    2: [
        Job("a9a", "trace", "a9a", A9A_SET),
        Job("drift", "trace", "drift"),
        Job("adacomm", "run", "adacomm"),
        Job("qsr", "run", "qsr"),
        Job("stl_auto", "run", "stl_auto"),
    ],
    4: [
        Job("nc_uneven", "run", "nc_uneven"),
        Job("sc_target", "run", "sc_target"),
        Job("local_noniid", "run", "local_noniid"),
        Job("a9a", "trace", "a9a", A9A_SET),
    ],
}


def write_config(folder: Path, name: str) -> Path:
    """CONFIGS[name] as a file in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text("\n".join(line.strip() for line in CONFIGS[name].splitlines()) + "\n")
    return path


def config_of(job: Job, folder: Path) -> Path:
    return A9A if job.config == "a9a" else write_config(folder, job.config)


def sets_of(job: Job, shared_data: Path) -> list[str]:
    return [*job.sets, f"data.data_dir={shared_data}"] if job.config == "a9a" else list(job.sets)
