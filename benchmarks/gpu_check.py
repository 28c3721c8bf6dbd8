"""GPU readiness check in one call: versions, vmap'd clients vs a per-client loop, one STL-SGD stage of Table 3
(ResNet18, IID) with the column's extrapolated wall time, torch.distributed (nccl) against the simulator, and two
identical network runs compared bit for bit.

    bash benchmarks/gpu_check.sh --out gpu_out [--data-dir D] [--dry-run] [--steps 1,2,3,4]

Steps (each recorded in ``OUT/gpu_check.json``, which is rewritten after every step; a failing step is
recorded with its error and the others still run; the exit status is 1 when any step failed):

0. versions: torch, CUDA, cuDNN, the NVIDIA driver (nvidia-smi, else /proc/driver/nvidia/version, else
   torch's CUDA driver API version), the GPU name(s), and the Python packages the CLI needs that are missing.
1. ``vmap_vs_loop``: images/s of :class:`stlsgd.problems.neural.NeuralNetProblem.local_steps` (all clients
   stacked, one vmap(grad) call per step) against a loop over one ``nn.Module`` + ``torch.optim.SGD`` per
   client on the same mini-batches, for ResNet18 (``make_model('resnet18', 3, 10, 32)``) and the small CNN
   (MNIST-shaped), 8 clients x 32 images each; warm-up calls first, ``torch.cuda.synchronize()`` around every
   timed call, median of the repeats. Also checks that one step of both gives the same update at full fp32
   (cuDNN's TF32 convolutions off; their difference is recorded beside it). Goal on GPU:
   vmap / loop >= 2x (reported under ``goals``; a missed goal does not fail the step). The loop is timed again
   with cuDNN's deterministic algorithms, the settings the simulator's own steps run with, so that vmap is also
   compared with a loop bound by the same reproducibility (``ratio_vmap_over_loop_deterministic``).
2. ``stage_run``: stage 1 (T_1 iterations) of the first STL-SGD row of
   ``configs/paper/table3_resnet18_iid.toml`` (the row's first grid setting, resolved by
   :func:`stlsgd.experiments.sweeps.load_sweep` as ``stlsgd sweep`` resolves it; T_1 by the plan's own rule),
   run through ``python -m stlsgd run`` and capped at ``--stage-iterations`` iterations and ``--stage-timeout``
   seconds. Data: the real CIFAR-10 when the data dir holds it; ``cifar10-png200`` when it fits the run's needs
   (at least one iteration of distinct images and, on GPU, the 50,000 images the budgets and T_1 are counted
   in); otherwise synthetic CIFAR-shaped images (3x32x32, 10 classes, random) written as CIFAR-10 pickle batches
   to ``WORK/synthetic-data`` (deleted after the run). Prints the time per epoch and the extrapolated wall time
   of the Table 3 column (formula printed with it): every run's images and evaluations at its budget come from
   replaying its plan under its own stop rule, as the simulator runs it.
3. ``dist_vs_sim``: ``torchrun --nproc_per_node=<GPUs> -m stlsgd run configs/examples/a9a_stl_sc.toml
   --backend dist --comm-backend nccl`` and the same config in the simulator, small iteration budget; compares
   the two ``summary.json`` (status, rounds, iterations, stages, rounds/iterations to target, bytes, final
   objective) and the ``final_params.npz`` arrays, which must be equal bit for bit (the average has one
   summation order on both sides). a9a from the data dir, else the bundled ``digits49``.
4. ``repeatable``: ``python -m stlsgd run`` of one network config twice (Local SGD; ResNet18 on the GPU, the
   small CNN in the dry run; synthetic CIFAR-shaped images): the same status, rounds, every evaluation's
   objective and ``final_params.npz``, bit for bit. On an H200 two such ResNet18 runs ended at objectives 0.758
   and 1.120 before the simulator asked cuDNN for its deterministic algorithms (``problems/neural.py``).

Without CUDA, or with ``--dry-run``, the same steps run at tiny sizes on the CPU (gloo with 2 ranks instead of
nccl; the column counted over each row's first grid setting) in well under a minute, so CI keeps the script
working (tests/benchmarks/test_gpu_check.py).

On a GPU machine the whole check is sized for well under 8 minutes (``--deadline`` caps the subprocesses).
The run directories go to ``--work-dir`` (default ``OUT/work``); everything that matters is in the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.util
import json
import math
import os
import pickle
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("stlsgd") is None:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO / "src"))

from stlsgd.files import read_jsonl, write_json_atomic  # noqa: E402 - standard library only, so step 0 still runs

if TYPE_CHECKING:  # the rest of the library is imported by the steps that use it (it needs torch, pydantic, ...)
    from stlsgd.experiments.config import Experiment
    from stlsgd.experiments.sweeps import RunSpec, Sweep
    from stlsgd.problems.nets import ModelName

DEFAULT_SWEEP = REPO / "configs" / "paper" / "table3_resnet18_iid.toml"
DEFAULT_DIST_CONFIG = REPO / "configs" / "examples" / "a9a_stl_sc.toml"
RESULT_FILE = "gpu_check.json"
# Training-set sizes of the image datasets a Table 3 sweep may name (budgets and T1_epochs count epochs of these).
IMAGE_SET_SIZES = {"cifar10": 50_000, "cifar10-png200": 200, "mnist10": 60_000}
# Modules `python -m stlsgd run` imports (pydantic, platformdirs: config and runner; numba: logistic).
CLI_MODULES = ("numpy", "torch", "pydantic", "platformdirs", "yaml", "numba", "tqdm", "PIL", "scipy", "sklearn")
PARAM_RTOL = 0.0  # dist vs sim: one summation order on both sides, so bit for bit
SUMMARY_KEYS = ("status", "rounds", "iterations", "stages", "rounds_to_target", "iterations_to_target", "bytes")
# What a torchrun job gives its ranks: a check started under torchrun must not hand it on to its own launches.
LAUNCHER_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"}
LAUNCHER_VARS |= {"ROLE_RANK", "TORCHELASTIC_RUN_ID"}


# ----------------------------------------------------------------------------------------------- sizes, state


@dataclass(frozen=True)
class BenchSize:
    shape: tuple[int, int, int]
    clients: int
    batch: int
    steps: int
    repeats: int
    warmup: int
    samples: int


def repeat_config(model: str, *, clients: int, batch: int, k: int, iterations: int) -> dict[str, Any]:
    """Step 4's run: Local SGD on a network, on the device the mode tests, evaluated every other round."""
    return {
        "name": "gpu_check_repeatable",
        "data": {"dataset": "cifar10", "num_clients": clients, "partition": "shared"},
        "problem": {"kind": "net", "model": model, "device": "auto"},
        "algorithm": {"method": "local_sgd", "lr": 0.08, "batch": batch, "k": k},
        "run": {"seed": 0, "max_iterations": iterations, "eval_every": 2},
    }


@dataclass(frozen=True)
class Sizes:
    bench: dict[ModelName, BenchSize]
    stage_iterations: int
    stage_timeout: float
    stage_overrides: dict[str, Any]
    dist_iterations: int
    dist_timeout: float
    deadline: float
    # Step 4's run (an experiment config; data: that many synthetic CIFAR-shaped images).
    repeat: dict[str, Any]
    repeat_images: int
    synthetic_images: int | None = None  # None: as many as the config's dataset has
    column_settings: int | None = None  # grid settings per row counted in the column (None: all)


SIZES = {
    "gpu": Sizes(
        bench={
            "resnet18": BenchSize((3, 32, 32), clients=8, batch=32, steps=10, repeats=5, warmup=2, samples=4096),
            "cnn": BenchSize((1, 28, 28), clients=8, batch=32, steps=20, repeats=5, warmup=2, samples=4096),
        },
        stage_iterations=400,
        stage_timeout=240,
        stage_overrides={"problem.device": "cuda"},
        dist_iterations=200_000,
        dist_timeout=180,
        deadline=450,
        repeat=repeat_config("resnet18", clients=8, batch=16, k=5, iterations=60),
        repeat_images=512,
    ),
    # Tiny: the figures are not the point, the code paths are. The stage: 2 clients x 2 images, period 1,
    # 8 images, an evaluation every iteration, CPU; the column: each row's first grid setting.
    "dry-run": Sizes(
        bench={
            "resnet18": BenchSize((3, 8, 8), clients=2, batch=2, steps=1, repeats=1, warmup=0, samples=16),
            "cnn": BenchSize((1, 28, 28), clients=2, batch=4, steps=2, repeats=2, warmup=1, samples=64),
        },
        stage_iterations=2,
        stage_timeout=120,
        stage_overrides={
            "data.num_clients": 2,
            "algorithm.batch": 2,
            "algorithm.k": 1,
            "data.max_samples": 8,
            "problem.eval_batch": 8,
            "problem.device": "cpu",
            "run.eval_every_iterations": 1,
        },
        dist_iterations=12_000,
        dist_timeout=120,
        deadline=300,
        repeat=repeat_config("cnn", clients=2, batch=4, k=2, iterations=6),
        repeat_images=32,
        synthetic_images=200,
        column_settings=1,
    ),
}


def say(*parts: Any) -> None:
    print(*parts, flush=True)


@dataclass(frozen=True)
class Launched:
    """A finished (or stopped) subprocess: its command line, exit status, wall time and output."""

    cmd: str
    rc: int | None
    timed_out: bool
    wall_s: float
    output_tail: str
    log: str

    def error(self, what: str) -> str:
        why = "timed out" if self.timed_out else f"exit status {self.rc}"
        lines = [ln for ln in self.output_tail.splitlines() if ln.strip()]
        return f"{what} {why}: " + (" | ".join(lines[-3:]) if lines else "(no output)")


Launch = Callable[..., Launched]  # (cmd, *, timeout, env, log) -> Launched; run_cmd, or a test's stand-in


def child_env(**extra: str) -> dict[str, str]:
    """Environment of the CLI subprocesses: the repo's sources importable, no inherited torchrun variables."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(REPO / "src")]))
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **extra}


def _kill_group(proc: subprocess.Popen) -> None:
    """End the process group this script started for ``proc`` (torchrun and its ranks), TERM then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
            return


def run_cmd(cmd: list[Any], *, timeout: float, env: dict[str, str], log: Path) -> Launched:
    """Run ``cmd`` from the repo root; stdout+stderr go to ``log``."""
    args = [str(c) for c in cmd]
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    timed_out = False
    with open(log, "w") as fh:
        # Its own process group (same session), so a timeout can end torchrun and all of its ranks at once.
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, process_group=0)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        except BaseException:  # interrupted or terminated: leave no rank behind
            _kill_group(proc)
            raise
    tail = log.read_text(errors="replace")[-2000:]
    return Launched(" ".join(args), proc.wait(), timed_out, round(time.perf_counter() - t0, 3), tail, str(log))


@dataclass(frozen=True)
class Deadline:
    end: float

    def timeout(self, wanted: float, floor: float = 20.0) -> float:
        """A subprocess timeout: ``wanted`` seconds, or what is left of the deadline (at least ``floor``)."""
        return max(floor, min(wanted, self.end - time.monotonic()))


@dataclass
class Check:
    """What every step may read: the mode and its sizes, the folders, the deadline, how to launch a command."""

    mode: str  # "gpu" or "dry-run"
    mode_reason: str
    sizes: Sizes
    data_dir: Path | None
    work: Path
    sweep: Path
    dist_config: Path
    deadline: Deadline
    thread_env: dict[str, str]
    launch: Launch = run_cmd
    goals: dict[str, bool] = field(default_factory=dict)

    @property
    def gpu(self) -> bool:
        return self.mode == "gpu"

    def env(self, **extra: str) -> dict[str, str]:
        return child_env(STLSGD_CACHE=str(self.work / "cache"), **self.thread_env, **extra)


def stlsgd_cmd(*args: Any) -> list[Any]:
    return [sys.executable, "-m", "stlsgd", *args]


def assignments(overrides: dict[str, Any]) -> list[str]:
    """``KEY=VALUE`` as ``--set`` takes them (the CLI reads TOML literals; JSON writes the same for scalars)."""
    return [f"{key}={json.dumps(value)}" for key, value in overrides.items()]


def set_args(items: list[str]) -> list[str]:
    return [x for item in items for x in ("--set", item)]


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


# ----------------------------------------------------------------------------------------------- step 0


def _smi_gpus() -> tuple[str | None, list[str]]:
    """(driver version, GPU names with memory) per nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None, []
    query = [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None, []
    rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not rows:
        return None, []
    return rows[0][1], [f"{r[0]} ({r[2]})" for r in rows]


def _proc_driver(path: Path = Path("/proc/driver/nvidia/version")) -> str | None:
    try:
        words = path.read_text().split() if path.is_file() else []
    except OSError:
        return None
    return next((w for w in words if "." in w and w.replace(".", "").isdigit()), None)


def nvidia_driver(torch: Any) -> tuple[str | None, str | None, list[str]]:
    """(driver version, where it came from, GPU names per nvidia-smi)."""
    driver, gpus = _smi_gpus()
    if driver:
        return driver, "nvidia-smi", gpus
    if driver := _proc_driver():
        return driver, "/proc/driver/nvidia/version", []
    if torch is not None and torch.cuda.is_available():
        with contextlib.suppress(Exception):  # a private API; absence is fine
            v = int(torch._C._cuda_getDriverVersion())  # the CUDA driver API version, e.g. 12040
            return f"CUDA driver API {v // 1000}.{(v % 1000) // 10}", "torch", []
    return None, None, []


def import_torch() -> tuple[Any, str | None]:
    """(torch, None), or (None, why it does not import)."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - still report the driver and the GPUs nvidia-smi sees
        return None, f"{type(exc).__name__}: {exc}"
    return torch, None


def git_commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    return None


def torch_facts(torch: Any) -> dict[str, Any]:
    if torch is None:
        keys = ("torch", "cuda", "cudnn", "torch_threads", "cudnn_benchmark", "cudnn_allow_tf32", "matmul_allow_tf32")
        return dict.fromkeys(keys) | {"gpus": [], "cuda_available": False}
    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "cuda_available": cuda,
        "torch_threads": torch.get_num_threads(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
    }


def host_facts() -> dict[str, Any]:
    import numpy as np

    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "git_commit": git_commit(),
        "missing_modules": [m for m in CLI_MODULES if importlib.util.find_spec(m) is None],
    }


def print_versions(info: dict[str, Any], check: Check) -> None:
    smi = info["gpus_nvidia_smi"]
    say(
        f"torch {info['torch']}  CUDA {info['cuda']}  cuDNN {info['cudnn']}  driver {info['driver']} "
        f"(from {info['driver_source']})"
    )
    say(f"GPUs: {', '.join(info['gpus']) or 'none'}{'  [' + '; '.join(smi) + ']' if smi else ''}")
    reason = f" ({check.mode_reason})" if check.mode_reason else ""
    say(
        f"python {info['python']} ({sys.executable}), numpy {info['numpy']}, {info['cpu_count']} CPUs, "
        f"mode: {check.mode}{reason}"
    )
    if info["missing_modules"]:
        say(
            f"missing Python modules: {', '.join(info['missing_modules'])} -- steps 2 and 3 run `python -m stlsgd` "
            "and need them (`pip install -e .` installs them; offline, bring their wheels)"
        )


def step_versions(check: Check) -> dict[str, Any]:
    torch, torch_error = import_torch()
    driver, source, smi_gpus = nvidia_driver(torch)
    info = {"torch_error": torch_error, **torch_facts(torch), "driver": driver, "driver_source": source}
    info |= {"gpus_nvidia_smi": smi_gpus, "gpu_count": len(info["gpus"]), **host_facts()}
    print_versions(info, check)
    problems = [f"torch does not import: {torch_error}"] if torch_error else []
    if info["missing_modules"]:
        problems.append(f"missing Python modules: {', '.join(info['missing_modules'])}")
    return {"passed": not problems, "error": "; ".join(problems) or None, **info}


# ----------------------------------------------------------------------------------------------- step 1


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_setup(name: ModelName, size: BenchSize, device: Any, lr: float) -> tuple[Any, dict[str, Any], list[Any]]:
    """The stacked problem and its state, and one (module, SGD) per client starting from the same weights."""
    import numpy as np
    import torch

    from stlsgd.problems.nets import make_model
    from stlsgd.problems.neural import NeuralNetProblem

    rng = np.random.default_rng(0)
    X = rng.standard_normal((size.samples, *size.shape), dtype=np.float32)
    y = rng.integers(0, 10, size.samples)
    torch.manual_seed(0)
    # make_model('resnet18', 3, 10, 32) as asked; the image side only matters for the CNN's linear layer.
    side = 32 if name == "resnet18" else size.shape[1]
    problem = NeuralNetProblem(make_model(name, size.shape[0], 10, side), X, y, device=str(device))
    state = problem.init_state(size.clients, seed=0)
    models = []
    for c in range(size.clients):
        m = make_model(name, size.shape[0], 10, side).to(device).train()
        m.load_state_dict({k: v[c] for k, v in state.items()})
        models.append((m, torch.optim.SGD(m.parameters(), lr=lr)))
    return problem, state, models


def loop_steps(models: list[Any], problem: Any, rows: Any, device: Any) -> None:
    """The per-client loop: every step, every client's module on its own rows, one SGD step each."""
    import torch
    import torch.nn.functional as F

    rows_t = torch.from_numpy(rows).to(device)
    for t in range(rows.shape[0]):
        for c, (m, opt) in enumerate(models):
            idx = rows_t[t, c]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(m(problem.X[idx]), problem.y[idx]).backward()
            opt.step()


def update_rel_diff(before: dict[str, Any], state: dict[str, Any], models: list[Any]) -> float:
    """The largest difference of the two updates from ``before``, relative to the loop's largest update."""
    import torch

    worst, loop_states = 0.0, [m.state_dict() for m, _ in models]
    for key, x0 in before.items():
        dv = state[key] - x0
        dl = torch.stack([s[key] for s in loop_states]) - x0
        scale = float(dl.abs().max())
        if scale > 0:
            worst = max(worst, float((dv - dl).abs().max()) / scale)
    return worst


def one_step_rel_diff(
    problem: Any, state: dict[str, Any], models: list[Any], size: BenchSize, device: Any, lr: float
) -> float:
    """:func:`update_rel_diff` of one step of the stacked clients and of the loop, from the same x_0 on the same rows."""
    import numpy as np

    before = {k: v.detach().clone() for k, v in state.items() if v.is_floating_point()}
    rows = np.random.default_rng(0).integers(0, size.samples, (1, size.clients, size.batch))
    problem.local_steps(state, rows, np.full(1, lr), None)
    loop_steps(models, problem, rows, device)
    return update_rel_diff(before, state, models)


def timed_calls(fn: Callable[[Any], None], size: BenchSize, rng: Any, device: Any) -> list[float]:
    """Seconds of each timed call of ``fn`` on fresh rows, after the warm-up calls, synchronised around each."""
    for _ in range(size.warmup):
        fn(rng.integers(0, size.samples, (size.steps, size.clients, size.batch)))
    times = []
    for _ in range(size.repeats):
        rows = rng.integers(0, size.samples, (size.steps, size.clients, size.batch))
        _sync(device)
        t0 = time.perf_counter()
        fn(rows)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def bench_model(name: ModelName, size: BenchSize, device: Any) -> dict[str, Any]:
    """images/s of the stacked vmap'd clients vs a loop over per-client modules, same mini-batches."""
    import numpy as np
    import torch

    from stlsgd.problems.neural import reproducible

    lr = 0.01
    problem, state, models = bench_setup(name, size, device, lr)

    def vmap(rows: Any) -> None:
        problem.local_steps(state, rows, np.full(rows.shape[0], lr), None)

    def loop(rows: Any) -> None:
        loop_steps(models, problem, rows, device)

    def loop_deterministic(rows: Any) -> None:
        # The loop under the cuDNN settings the simulator's steps run with (reproducible runs): vmap against it
        # compares the batching alone, where the loop at torch's defaults also gains cuDNN's faster algorithms.
        with reproducible(device):
            loop_steps(models, problem, rows, device)

    # Agreement: one step from the same x_0 on the same rows must give the same update. It is asserted at full
    # fp32: with cuDNN's default TF32 convolutions an H200 gave resnet18 updates 24 % apart (layer4's weights, whose
    # gradients behind batch norm are small differences of large terms), 0.7e-3 to 1.3e-3 with TF32 off (cuDNN picks
    # its algorithms per run); a wrong update (rows, lr, batch-norm statistics) is off by far more than the
    # tolerance. The TF32 difference is recorded beside it, since training on GPU runs with the default.
    res: dict[str, Any] = {"model": name, "image_shape": list(size.shape), "clients": size.clients}
    res |= {"batch": size.batch, "steps_per_call": size.steps, "repeats": size.repeats, "warmup_calls": size.warmup}
    images = res["images_per_call"] = size.clients * size.batch * size.steps
    if device.type == "cuda":
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=True):
            res["update_rel_diff_tf32"] = one_step_rel_diff(*bench_setup(name, size, device, lr), size, device, lr)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        res["update_rel_diff"] = one_step_rel_diff(problem, state, models, size, device, lr)
    res["update_rel_tol"] = 5e-3
    rng = np.random.default_rng(1)
    for label, fn in (("vmap", vmap), ("loop", loop), ("loop_deterministic", loop_deterministic)):
        times = timed_calls(fn, size, rng, device)
        res[f"{label}_times_s"] = [round(t, 6) for t in times]
        res[f"{label}_images_per_s"] = images / statistics.median(times)
        res[f"{label}_images_per_s_best"] = images / min(times)
    res["ratio_vmap_over_loop"] = res["vmap_images_per_s"] / res["loop_images_per_s"]
    res["ratio_vmap_over_loop_deterministic"] = res["vmap_images_per_s"] / res["loop_deterministic_images_per_s"]
    return res  # the models and the problem go with this frame; the caller empties the CUDA cache


def bench_line(name: ModelName, size: BenchSize, r: dict[str, Any]) -> str:
    return (
        f"  {name:>8} {size.clients} clients x {size.batch} images {size.shape}: "
        f"vmap {r['vmap_images_per_s']:9.0f} images/s, loop {r['loop_images_per_s']:9.0f} images/s, "
        f"vmap/loop {r['ratio_vmap_over_loop']:.2f}x, {r['ratio_vmap_over_loop_deterministic']:.2f}x against the loop "
        f"with the same deterministic cuDNN algorithms  (median of {size.repeats} x {size.steps} steps; "
        f"one-step update rel diff {r['update_rel_diff']:.1e}"
        + (f"; {r['update_rel_diff_tf32']:.1e} with TF32 convolutions)" if "update_rel_diff_tf32" in r else ")")
    )


def step_vmap_vs_loop(check: Check) -> dict[str, Any]:
    import torch

    device = torch.device("cuda" if check.gpu else "cpu")
    out: dict[str, Any] = {"device": str(device), "models": {}, "goal": ">= 2x on GPU" if check.gpu else None}
    errors = []
    for name, size in check.sizes.bench.items():
        try:
            r = out["models"][name] = bench_model(name, size, device)
        except Exception as exc:  # noqa: BLE001 - recorded, the other model still runs
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            out["models"][name] = {"error": traceback.format_exc()[-3000:]}
            say(f"  {name}: FAILED {type(exc).__name__}: {exc}")
            continue
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if r["update_rel_diff"] > r["update_rel_tol"]:
            errors.append(f"{name}: vmap and loop updates differ (max rel diff {r['update_rel_diff']:.2e})")
        say(bench_line(name, size, r))
        if check.gpu:
            check.goals[f"vmap_over_loop_{name}_>=2x"] = r["ratio_vmap_over_loop"] >= 2.0
    return {"passed": not errors, "error": "; ".join(errors) or None, **out}


# ----------------------------------------------------------------------------------------------- step 2


def stl_row(sweep: Sweep) -> RunSpec:
    """The first grid setting of the sweep's first STL-SGD row, resolved as ``stlsgd sweep`` resolves it."""
    spec = next((r for r in sweep.grid if r.method in ("stl_nc", "stl_sc")), None)
    if spec is None:
        raise ValueError(f"{sweep.source}: the sweep file has no stl_nc/stl_sc row")
    return spec


def run_usage(exp: Experiment, n: int) -> tuple[int, int, int]:
    """(images all clients process, iterations, evaluations) of a run that goes to its budget on ``n`` images:
    its plan replayed round by round, cut at the budget and evaluated by its stop rule, as the simulator does."""
    from stlsgd.algorithms.budget import within_budget
    from stlsgd.experiments.build import plan_context, stop_rule

    stop = stop_rule(exp, has_optimum=False)
    if stop.max_iterations is None and stop.max_rounds is None:
        raise ValueError(f"{exp.name}: no run.max_iterations budget to extrapolate from")
    samples = evaluations = last_eval = 0
    for rnd in exp.algorithm.plan(plan_context(exp, n, None)).rounds():
        rnd = within_budget(rnd, stop.max_iterations)
        samples += rnd.steps * rnd.batch
        rounds, iterations = rnd.index + 1, rnd.end_iteration
        spent = stop.spent(rounds, iterations)
        if spent or stop.due(rounds, iterations, last_eval):
            evaluations, last_eval = evaluations + 1, iterations
        if spent:
            return samples * exp.data.num_clients, iterations, evaluations
    raise AssertionError("a plan's rounds never end")  # pragma: no cover - Plan.rounds is endless


def column_budget(sweep: Sweep, n: int) -> dict[str, Any]:
    """Epochs (and evaluations) of every grid run and every extra-seed rerun of the column at its budget."""
    from stlsgd.experiments.config import Experiment

    rows: list[dict[str, Any]] = []
    extra_seeds = max(len(sweep.seeds) - 1, 0)
    for label in sweep.labels:
        usage = [run_usage(Experiment.model_validate(r.config), n) for r in sweep.grid if r.label == label]
        worst = max(usage, key=lambda u: u[0])
        rows.append(
            {
                "label": label,
                "grid_runs": len(usage),
                "seed_reruns": extra_seeds,
                "epochs": (sum(u[0] for u in usage) + extra_seeds * worst[0]) / n,
                "evaluations": sum(u[2] for u in usage) + extra_seeds * worst[2],
                "max_iterations": sorted({u[1] for u in usage}),
            }
        )
    total = {k: sum(r[k] for r in rows) for k in ("epochs", "evaluations")}
    return {"rows": rows, "runs": sum(r["grid_runs"] + r["seed_reruns"] for r in rows), **total}


def dataset_present(data_dir: Path | None, name: str) -> bool:
    from stlsgd.data.registry import DATASETS

    return data_dir is not None and all((data_dir / p).is_file() for p in DATASETS[name].paths)


def write_synthetic_cifar(root: Path, images: int, seed: int = 0) -> None:
    """Random 3x32x32 uint8 images and labels 0..9 as the five CIFAR-10 python pickle batches, where the
    dataset registry looks for ``cifar10``."""
    import numpy as np

    from stlsgd.data.registry import DATASETS

    rng = np.random.default_rng(seed)
    files = [root / p for p in DATASETS["cifar10"].paths]
    for i, path in enumerate(files):
        count = images // len(files) + (1 if i < images % len(files) else 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        batch = {b"data": rng.integers(0, 256, (count, 3072), dtype=np.uint8), b"batch_label": b"synthetic"}
        with open(path, "wb") as fh:  # protocol 2, as the real batches (the reader allows only that)
            pickle.dump({**batch, b"labels": rng.integers(0, 10, count).tolist()}, fh, protocol=2)


@dataclass(frozen=True)
class StageData:
    source: str  # cifar10, cifar10-png200 or synthetic
    dataset: str  # the name the run loads
    data_dir: Path
    images: int  # in the run (data.max_samples applied)
    why: str
    synthetic: bool = False


def stage_data(check: Check, dataset: str, per_iteration: int, limit: int | None) -> StageData:
    """Which data the stage runs on: the config's own dataset, cifar10-png200 when it fits, else synthetic."""
    n_config = IMAGE_SET_SIZES.get(dataset)
    if n_config is None:
        raise ValueError(f"data.dataset {dataset!r}: unknown training-set size (known: {', '.join(IMAGE_SET_SIZES)})")

    def cut(n: int) -> int:
        return min(n, limit) if limit else n

    data_dir = check.data_dir
    if dataset == "cifar10" and data_dir is not None and dataset_present(data_dir, "cifar10"):
        return StageData("cifar10", dataset, data_dir, cut(n_config), f"the config's own dataset, found in {data_dir}")
    # Budgets and T1_epochs count epochs of the config's dataset; at full scale the stand-in must have as many
    # images (else T1 and the evaluation cost shrink); at any scale one iteration's N x B distinct images.
    need = max(per_iteration, n_config) if check.gpu else per_iteration
    have = IMAGE_SET_SIZES["cifar10-png200"]
    if data_dir is not None and dataset_present(data_dir, "cifar10-png200"):
        fits = f"cifar10-png200 holds {have} images, the run needs {need} ({per_iteration} per iteration"
        if have >= need:
            return StageData("cifar10-png200", "cifar10-png200", data_dir, cut(have), f"{fits}): it fits")
        note = f"{fits}; budgets and T1 count epochs of {n_config:,} images)"
    else:
        note = f"no cifar10-png200 in {check.data_dir}" if check.data_dir else "no data dir"
    images = check.sizes.synthetic_images or n_config
    root = fresh_dir(check.work / "synthetic-data")
    write_synthetic_cifar(root, images)
    why = f"{note} -> synthetic CIFAR-shaped images (3x32x32, 10 classes, {images:,} random images as CIFAR-10 batches)"
    return StageData("synthetic", "cifar10", root, cut(images), why, synthetic=True)


def time_evaluation(model: ModelName, shape: tuple[int, ...], images: int, eval_batch: int, device: str) -> float:
    """Seconds of one evaluation of the averaged model on ``images`` training images (what the runner does)."""
    import numpy as np
    import torch

    from stlsgd.problems.nets import make_model
    from stlsgd.problems.neural import NeuralNetProblem

    rng = np.random.default_rng(1)
    X = rng.standard_normal((images, *shape), dtype=np.float32)
    problem = NeuralNetProblem(
        make_model(model, shape[0], 10, shape[1]), X, rng.integers(0, 10, images), device=device, eval_batch=eval_batch
    )
    state = problem.init_state(1, seed=0)
    problem.evaluate(state)  # warm-up
    best = math.inf
    for _ in range(2):
        t0 = time.perf_counter()
        problem.evaluate(state)  # ends with float(), which synchronises
        best = min(best, time.perf_counter() - t0)
    del problem, state, X
    if device == "cuda":
        torch.cuda.empty_cache()
    return best


@dataclass(frozen=True)
class Stage:
    """The stage run as the CLI will run it: the row's config file, the overrides, the data and T_1."""

    spec: RunSpec
    config_file: Path
    overrides: dict[str, Any]
    data: StageData
    exp: Experiment  # the row's config with the overrides, as `stlsgd run` reads it
    T1: int
    cap: int


def plan_stage(check: Check, spec: RunSpec, work: Path) -> Stage:
    """The row's config written for the CLI; the dry-run overrides, the data, T_1 by the plan's own rule."""
    from stlsgd.experiments.build import plan_context
    from stlsgd.experiments.config import Experiment, dump_config, load_config

    config_file = work / "stage_config.yaml"
    dump_config(Experiment.model_validate(spec.config), config_file)
    overrides = dict(check.sizes.stage_overrides)
    exp = load_config(config_file, assignments(overrides))
    data = stage_data(check, exp.data.dataset, exp.data.num_clients * exp.algorithm.batch, exp.data.max_samples)
    if data.dataset != exp.data.dataset:
        overrides["data.dataset"] = data.dataset
    T1 = exp.algorithm.plan(plan_context(exp, data.images, None)).describe().get("T1")
    if not isinstance(T1, int):
        raise ValueError(f"{spec.label}: its plan has no first stage length T1")
    overrides["run.max_iterations"] = cap = min(T1, check.sizes.stage_iterations)
    exp = load_config(config_file, assignments(overrides))
    return Stage(spec, config_file, overrides, data, exp, T1, cap)


def read_run(out: Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """A run directory's metrics lines and its summary (None: not written, as by a run stopped at its timeout),
    read through the library's own record of them."""
    from stlsgd.experiments.records import RunSummary
    from stlsgd.experiments.rundir import METRICS_FILE, SUMMARY_FILE

    summary = out / SUMMARY_FILE
    return read_jsonl(out / METRICS_FILE), RunSummary.read(summary).to_json() if summary.is_file() else None


def stage_timing(metrics: list[dict[str, Any]], summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """Seconds per iteration in the steady state: from the first evaluation line to the last (warm-up excluded,
    the evaluations the config schedules included); else over the whole run. None: no iterations recorded."""
    if len(metrics) >= 2 and metrics[-1]["iteration"] > metrics[0]["iteration"]:
        first, last = metrics[0], metrics[-1]
        span = last["iteration"] - first["iteration"]
        return {
            "iterations_run": last["iteration"],
            "timing_basis": f"evaluation lines {len(metrics)}: iterations {first['iteration']}..{last['iteration']}",
            "seconds_per_iteration": (last["wall_s"] - first["wall_s"]) / span,
            "evaluations_per_iteration": (len(metrics) - 1) / span,
        }
    if summary and summary.get("iterations"):
        return {
            "iterations_run": summary["iterations"],
            "timing_basis": "whole run (warm-up included)",
            "seconds_per_iteration": summary["wall_s"] / summary["iterations"],
            "evaluations_per_iteration": len(metrics) / summary["iterations"],
        }
    return None


def run_stage(check: Check, stage: Stage, work: Path) -> tuple[Launched, list[dict[str, Any]], dict | None]:
    """``python -m stlsgd run`` of the stage; its metrics lines and summary (None when it wrote none)."""
    out = work / "run"
    cmd = stlsgd_cmd("run", stage.config_file, "--out", out, "--quiet", "--data-dir", stage.data.data_dir)
    res = check.launch(
        cmd + set_args(assignments(stage.overrides)),
        timeout=check.deadline.timeout(check.sizes.stage_timeout),
        env=check.env(),
        log=work / "stage.log",
    )
    late = " (timed out: figures from the metrics so far)" if res.timed_out else ""
    say(f"  $ {res.cmd}\n  -> rc {res.rc}{late}, {res.wall_s:.1f} s")
    if stage.data.synthetic:
        shutil.rmtree(stage.data.data_dir, ignore_errors=True)
    return res, *read_run(out)


COLUMN_FORMULA = (
    "time_per_epoch_s x sum over the column's rows of the epochs every grid run and every extra-seed rerun takes "
    "at its budget run.max_iterations (each run's plan replayed to its budget: epochs = images all clients process "
    "/ n, CR-PSGD's growing batch included); no early stop, no pruning: an upper bound, which also assumes the STL "
    "row's time per image for every row (LB-SGD's and CR-PSGD's larger batches run faster per image on a GPU)"
)
COLUMN_FORMULA_EVAL = (
    "train_time_per_epoch_s x epochs + eval_time_s x evaluations, evaluations per run: those its stop rule "
    "(run.eval_every rounds, run.eval_every_iterations) schedules up to its budget, plus the last"
)


def column_estimate(timing: dict[str, Any], budget: dict[str, Any], n_config: int, per_iteration: int) -> dict:
    """The column's wall time from the stage's time per image: training and evaluation together (formula A)."""
    s_per_image = timing["seconds_per_iteration"] / per_iteration
    epoch_s = s_per_image * n_config
    return {
        "seconds_per_image": s_per_image,
        "time_per_epoch_s": epoch_s,
        "epoch_images": n_config,
        "column": budget,
        "column_time_s": epoch_s * budget["epochs"],
        "column_time_h": epoch_s * budget["epochs"] / 3600,
        "column_formula": COLUMN_FORMULA,
    }


def eval_aware_estimate(timing: dict[str, Any], budget: dict[str, Any], t_eval_run: float, stage: Stage) -> dict:
    """The column's wall time with training and the evaluation schedules apart (formula B)."""
    n_config, n_run = IMAGE_SET_SIZES[stage.spec.config["data"]["dataset"]], stage.data.images
    per_iteration = stage.exp.data.num_clients * stage.exp.algorithm.batch
    t_eval = t_eval_run * n_config / n_run  # an evaluation passes over the whole training set
    train_s = max(timing["seconds_per_iteration"] - timing["evaluations_per_iteration"] * t_eval_run, 0.0)
    train_epoch_s = train_s / per_iteration * n_config
    column_s = train_epoch_s * budget["epochs"] + t_eval * budget["evaluations"]
    return {
        "eval_time_s": t_eval,
        "eval_time_measured_s": t_eval_run,
        "train_time_per_epoch_s": train_epoch_s,
        "column_time_with_eval_schedule_s": column_s,
        "column_time_with_eval_schedule_h": column_s / 3600,
        "column_formula_with_eval_schedule": COLUMN_FORMULA_EVAL,
    }


def measured_eval(check: Check, stage: Stage) -> tuple[float | None, str | None]:
    """One evaluation of the row's model on the run's images, timed in this process; or the error."""
    problem, device = stage.exp.problem, "cuda" if check.gpu else "cpu"
    try:
        return time_evaluation(problem.model, (3, 32, 32), stage.data.images, problem.eval_batch, device), None
    except Exception as exc:  # noqa: BLE001 - the eval-aware figure is extra; formula A stands
        return None, f"{type(exc).__name__}: {exc}"


def print_stage_figures(r: dict[str, Any], sweep: Sweep, check: Check) -> None:
    budget, epoch_s = r["column"], r["time_per_epoch_s"]
    say(
        f"  {r['iterations_run']} iterations: {r['seconds_per_iteration'] * 1e3:.1f} ms/iteration "
        f"({r['timing_basis']}) -> time per epoch of {r['epoch_images']:,} images: {epoch_s:.2f} s; stage 1 "
        f"({r['T1']} iterations): {r['stage1_time_s']:.1f} s"
    )
    say(
        f"  Table 3 '{sweep.name}' column: {budget['runs']} runs, {budget['epochs']:,.0f} epochs at the budgets "
        f"-> {r['column_time_h']:,.1f} h  (= {epoch_s:.2f} s/epoch x {budget['epochs']:,.0f} epochs; upper bound: "
        "every grid run and seed rerun to its budget, no early stop or pruning)"
    )
    if "eval_time_s" in r:
        say(
            f"  with the evaluation schedules: {r['column_time_with_eval_schedule_h']:,.1f} h  (= "
            f"{r['train_time_per_epoch_s']:.2f} s/epoch training x {budget['epochs']:,.0f} epochs + "
            f"{r['eval_time_s']:.2f} s/evaluation x {budget['evaluations']:,} evaluations)"
        )
    if not check.gpu:
        say(
            "  (dry run: CPU figures at tiny sizes, the column counted over each row's first grid setting; the "
            "extrapolation only exercises the code)"
        )


def stage_record(check: Check, stage: Stage, res: Launched) -> dict[str, Any]:
    spec = stage.spec
    return {
        "sweep": str(check.sweep),
        "row": spec.label,
        "method": spec.method,
        "grid_setting": spec.settings,
        "config": spec.config,
        "overrides": stage.overrides,
        "command": res.cmd,
        "rc": res.rc,
        "timed_out": res.timed_out,
        "process_wall_s": res.wall_s,
        "data_source": stage.data.source,
        "data_why": stage.data.why,
        "images": stage.data.images,
        "T1": stage.T1,
        "iterations_cap": stage.cap,
        "clients": stage.exp.data.num_clients,
        "batch": stage.exp.algorithm.batch,
    }


def step_stage_run(check: Check) -> dict[str, Any]:
    from stlsgd.experiments.sweeps import load_sweep

    sweep = load_sweep(check.sweep, limit=check.sizes.column_settings)
    work = fresh_dir(check.work / "stage")
    stage = plan_stage(check, stl_row(sweep), work)
    spec, exp = stage.spec, stage.exp
    say(
        f"  row {spec.label!r} ({spec.method}, option {spec.config['algorithm'].get('option', 1)}), first grid "
        f"setting {spec.settings}; stage 1 = T1 = {stage.T1} iterations on {stage.data.images:,} images, running "
        f"{stage.cap}\n  data: {stage.data.source} -- {stage.data.why}"
    )
    res, metrics, summary = run_stage(check, stage, work)
    r = stage_record(check, stage, res) | {"summary": summary, "evaluations_logged": len(metrics)}
    if res.rc != 0 and not (res.timed_out and len(metrics) >= 2):
        return {"passed": False, "error": res.error("stlsgd run"), **r}
    timing = stage_timing(metrics, summary)
    if timing is None:
        return {"passed": False, "error": "no iterations recorded", **r}
    n_config = IMAGE_SET_SIZES[spec.config["data"]["dataset"]]
    budget = column_budget(sweep, n_config)
    r |= timing | column_estimate(timing, budget, n_config, exp.data.num_clients * exp.algorithm.batch)
    r["stage1_time_s"] = timing["seconds_per_iteration"] * stage.T1
    t_eval_run, r["eval_timing_error"] = measured_eval(check, stage)
    if t_eval_run is not None:
        r |= eval_aware_estimate(timing, budget, t_eval_run, stage)
    print_stage_figures(r, sweep, check)
    status_ok = summary is None or summary["status"] in ("budget", "reached")
    ok = r["seconds_per_iteration"] > 0 and math.isfinite(r["seconds_per_iteration"]) and status_ok
    return {"passed": ok, "error": None if ok else f"unexpected run status {summary and summary['status']}", **r}


# ----------------------------------------------------------------------------------------------- step 3


def max_rel_diff(a: Any, b: Any) -> float:
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf
    if a.size == 0:
        return 0.0
    return float(np.abs(a - b).max()) / max(float(np.abs(b).max()), 1e-300)


def dist_data(data_dir: Path | None, empty: Path) -> tuple[str, Path, list[str], str]:
    """(dataset, data dir, extra --set, why): a9a from the data dir, else the bundled digits49."""
    if dataset_present(data_dir, "a9a"):
        assert data_dir is not None
        return "a9a", data_dir, [], f"a9a from {data_dir}"
    why = f"a9a not in {data_dir or 'any data dir'}: the bundled digits49 instead"
    return "digits49", data_dir or empty, ["data.dataset=digits49"], why


def launch_pair(check: Check, work: Path, run_args: list[Any], nproc: int, comm: str) -> list[Launched]:
    """``stlsgd run RUN_ARGS`` in the simulator, then under torchrun --backend dist (one node, --standalone: its
    own rendezvous on a free local port)."""
    env = check.env(GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    env["OMP_NUM_THREADS"] = check.thread_env.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone"]
    dist = [*torchrun, "-m", "stlsgd", "run", *run_args, "--backend", "dist", "--comm-backend", comm]
    runs = []
    # The simulator first: it computes f* once into the shared cache, which the dist run then reads.
    for cmd, side in ((stlsgd_cmd("run", *run_args), "sim"), (dist, "dist")):
        timeout = check.deadline.timeout(check.sizes.dist_timeout)
        res = check.launch([*cmd, "--out", work / side], timeout=timeout, env=env, log=work / f"{side}.log")
        say(f"  $ {res.cmd}\n    -> rc {res.rc}, {res.wall_s:.1f} s")
        runs.append(res)
    return runs


def compare_runs(sim: Path, dist: Path, sides: tuple[str, str] = ("sim", "dist")) -> dict[str, Any]:
    """Two run directories of one config compared: summaries, every evaluation's objective, final_params; each
    side's figures under its name in ``sides``."""
    import numpy as np

    from stlsgd.experiments.rundir import FINAL_PARAMS_FILE

    (sm, s), (dm, d) = read_run(sim), read_run(dist)
    if s is None or d is None:
        raise ValueError(f"{sim if s is None else dist}: no summary.json written")
    obj_s, obj_d = (s.get("final") or {}).get("objective"), (d.get("final") or {}).get("objective")
    per_round = [abs(a["objective"] - b["objective"]) / max(abs(a["objective"]), 1e-300) for a, b in zip(sm, dm)]
    with np.load(sim / FINAL_PARAMS_FILE) as sp, np.load(dist / FINAL_PARAMS_FILE) as dp:
        same_keys = sorted(sp.files) == sorted(dp.files)
        per_array = {k: max_rel_diff(dp[k], sp[k]) for k in sp.files if k in dp.files}
    obj_rel = abs(obj_d - obj_s) / max(abs(obj_s), 1e-300) if obj_s is not None and obj_d is not None else None
    x, y = sides
    return {
        "compared": {k: {x: s.get(k), y: d.get(k), "equal": s.get(k) == d.get(k)} for k in SUMMARY_KEYS},
        "final_objective": {x: obj_s, y: obj_d, "rel_diff": obj_rel},
        "same_evaluation_rounds": [m["round"] for m in sm] == [m["round"] for m in dm],
        "first_evaluation_rel_diff": per_round[0] if per_round else None,
        "objective_rel_diff_per_evaluation": per_round,
        "first_round_beyond_rtol": next((m["round"] for m, r in zip(sm, per_round) if r > PARAM_RTOL), None),
        "params_same_keys": same_keys,
        "params_max_rel_diff": max(per_array.values(), default=math.inf),
        "params_rel_diff_per_array": per_array,
        "rtol": PARAM_RTOL,
        f"{x}_summary": s,
        f"{y}_summary": d,
    }


def _within_rtol(x: float | None) -> bool:
    return x is not None and x <= PARAM_RTOL


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def comparison_checks(c: dict[str, Any]) -> dict[str, bool]:
    """What must hold for two runs of one config: the same summary, evaluations and parameters, bit for bit."""
    return {f"{k} equal": v["equal"] for k, v in c["compared"].items()} | {
        "same evaluation rounds": c["same_evaluation_rounds"],
        "same param arrays": c["params_same_keys"],
        "every evaluation within rtol": c["first_round_beyond_rtol"] is None,
        "final objective within rtol": _within_rtol(c["final_objective"]["rel_diff"]),
        "params within rtol": _within_rtol(c["params_max_rel_diff"]),
    }


def print_comparison(c: dict[str, Any], failed: list[str], sides: tuple[str, str] = ("sim", "dist")) -> None:
    for side in sides:
        s = c[f"{side}_summary"]
        backend = f", backend {c['dist_backend']}" if side == "dist" else ""
        say(
            f"    {side:<6}: {s['status']} after {s['rounds']} rounds ({s['iterations']} iterations), objective "
            f"{c['final_objective'][side]}{backend}"
        )
    beyond = c["first_round_beyond_rtol"]
    say(
        f"    first evaluation rel diff {_fmt(c['first_evaluation_rel_diff'], '.1e')}; final objective rel diff "
        f"{_fmt(c['final_objective']['rel_diff'], '.2e')}, final_params max rel diff {c['params_max_rel_diff']:.2e} "
        f"({len(c['params_rel_diff_per_array'])} arrays)"
        + (f"; beyond {PARAM_RTOL:g} from round {beyond} on" if beyond is not None else "")
        + f": {'OK' if not failed else 'DIFFERENT: ' + ', '.join(failed)}"
    )


def step_dist_vs_sim(check: Check) -> dict[str, Any]:
    """torchrun --backend dist against the simulator on configs/examples/a9a_stl_sc.toml (a small budget):
    the same summary and the same final parameters bit for bit (the average has one summation order on both
    sides, and nccl's all-gather moves bytes without arithmetic). a9a from the data dir, else digits49."""
    import torch

    nproc, comm = (torch.cuda.device_count(), "nccl") if check.gpu else (2, "gloo")
    work = fresh_dir(check.work / "dist_vs_sim")
    name, data_dir, sets, why = dist_data(check.data_dir, fresh_dir(work / "no-data"))
    config = check.dist_config
    shown = config.relative_to(REPO) if config.is_relative_to(REPO) else config
    say(f"  config {shown}, data: {why}; {nproc} rank(s), {comm}")
    sets = [f"run.max_iterations={check.sizes.dist_iterations}", *sets]
    sim, dist = launch_pair(
        check, work / name, [config, "--data-dir", data_dir, "--quiet", *set_args(sets)], nproc, comm
    )
    r: dict[str, Any] = {
        "dataset": name,
        "data_why": why,
        "nproc": nproc,
        "comm_backend": comm,
        "config": str(config),
        "sets": sets,
    }
    r |= {"sim_command": sim.cmd, "dist_command": dist.cmd, "sim_rc": sim.rc, "dist_rc": dist.rc}
    r |= {"sim_wall_s": sim.wall_s, "dist_wall_s": dist.wall_s}
    errors = [res.error(what) for res, what in ((sim, "simulator run"), (dist, "torchrun dist run")) if res.rc != 0]
    if errors:
        return {"passed": False, "error": "; ".join(errors), **r}
    r |= compare_runs(work / name / "sim", work / name / "dist")
    backend = r["dist_backend"] = r["dist_summary"].get("backend") or {}
    r["checks"] = comparison_checks(r) | {
        "executor dist": backend.get("executor") == "dist",
        f"comm {comm}": backend.get("comm") == comm,
        f"world size {nproc}": backend.get("world_size") == nproc,
    }
    failed = [k for k, ok in r["checks"].items() if not ok]
    print_comparison(r, failed)
    return {"passed": not failed, "error": ("differs: " + ", ".join(failed)) if failed else None, **r}


# ----------------------------------------------------------------------------------------------- step 4


def step_repeatable(check: Check) -> dict[str, Any]:
    """The simulator's network run twice from the same config: the same summary, every evaluation's objective and
    ``final_params.npz`` bit for bit (runs, resumes and the torchrun executor rest on it). On a GPU: ResNet18,
    whose convolutions' backward cuDNN may otherwise sum in no fixed order; data: synthetic CIFAR-shaped images."""
    work = fresh_dir(check.work / "repeatable")
    write_synthetic_cifar(work / "data", check.sizes.repeat_images)
    config = work / "config.yaml"
    config.write_text(json.dumps(check.sizes.repeat, indent=1))  # YAML reads JSON
    r: dict[str, Any] = {"config": check.sizes.repeat, "images": check.sizes.repeat_images, "runs": {}}
    for name in ("first", "second"):
        args = ["run", config, "--data-dir", work / "data", "--quiet", "--out", work / name]
        timeout = check.deadline.timeout(check.sizes.stage_timeout)
        res = check.launch(stlsgd_cmd(*args), timeout=timeout, env=check.env(), log=work / f"{name}.log")
        say(f"  $ {res.cmd}\n    -> rc {res.rc}, {res.wall_s:.1f} s")
        r["runs"][name] = {"command": res.cmd, "rc": res.rc, "wall_s": res.wall_s}
        if res.rc != 0:
            return {"passed": False, "error": res.error(f"{name} run"), **r}
    r |= compare_runs(work / "first", work / "second", sides=("first", "second"))
    r["checks"] = comparison_checks(r)
    failed = [k for k, ok in r["checks"].items() if not ok]
    print_comparison(r, failed, sides=("first", "second"))
    return {"passed": not failed, "error": ("differs: " + ", ".join(failed)) if failed else None, **r}


# ----------------------------------------------------------------------------------------------- main


STEPS: dict[int, tuple[str, Callable[[Check], dict[str, Any]]]] = {
    0: ("versions", step_versions),
    1: ("vmap_vs_loop", step_vmap_vs_loop),
    2: ("stage_run", step_stage_run),
    3: ("dist_vs_sim", step_dist_vs_sim),
    4: ("repeatable", step_repeatable),
}


def step_list(text: str) -> list[int]:
    try:
        steps = [int(s) for s in text.replace(" ", "").split(",") if s]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected step numbers like 1,2,3, got {text!r}") from None
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown step {unknown[0]} (steps: 0-{max(STEPS)})")
    return steps


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    default_data = REPO.parent / "shared" / "data"
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, help="output folder: OUT/gpu_check.json")
    ap.add_argument(
        "--data-dir",
        default=str(default_data) if default_data.is_dir() else None,
        help="datasets (a9a, cifar10, cifar10-png200); default ../shared/data beside the repo when it "
        "exists, else none (synthetic images, the bundled digits49)",
    )
    ap.add_argument("--dry-run", action="store_true", help="tiny CPU run of the same steps (the default without CUDA)")
    ap.add_argument(
        "--steps", type=step_list, default=[1, 2, 3, 4], help="steps to run after the versions (step 0), e.g. 1,3"
    )
    ap.add_argument("--work-dir", help="run directories and logs (default OUT/work)")
    ap.add_argument("--sweep", default=str(DEFAULT_SWEEP), help="Table 3 sweep file of step 2")
    ap.add_argument("--dist-config", default=str(DEFAULT_DIST_CONFIG), help="config of step 3")
    ap.add_argument("--stage-iterations", type=int, help="cap of the stage run (GPU default 400)")
    ap.add_argument("--stage-timeout", type=float, help="seconds before the stage run is stopped (GPU default 240)")
    ap.add_argument("--dist-iterations", type=int, help="iteration budget of step 3 (GPU default 200000)")
    ap.add_argument(
        "--deadline", type=float, help="seconds for the whole check, subprocesses capped to fit (GPU default 450)"
    )
    return ap.parse_args(argv)


def mode_of(dry_run: bool, cuda: bool, torch_error: str | None) -> tuple[str, str]:
    """(mode, why): the GPU run, or the dry run (asked for, or no usable CUDA)."""
    if dry_run:
        return "dry-run", "--dry-run"
    if torch_error:
        return "dry-run", "torch does not import"
    return ("gpu", "") if cuda else ("dry-run", "no CUDA device")


def make_check(args: argparse.Namespace, mode: str, reason: str, launch: Launch) -> Check:
    asked = {k: getattr(args, k) for k in ("stage_iterations", "stage_timeout", "dist_iterations", "deadline")}
    sizes = dataclasses.replace(SIZES[mode], **{k: v for k, v in asked.items() if v is not None})
    data_dir = Path(args.data_dir).resolve() if args.data_dir else None
    work = Path(args.work_dir).resolve() if args.work_dir else Path(args.out).resolve() / "work"
    work.mkdir(parents=True, exist_ok=True)
    # The dry run is single-threaded: on a small shared CPU (CI) two threads per process contending with other
    # jobs can make torch's and numba's thread pools spin many times slower; the figures are not the point.
    thread_env = {} if mode == "gpu" else {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    return Check(
        mode=mode,
        mode_reason=reason,
        sizes=sizes,
        data_dir=data_dir if data_dir is not None and data_dir.is_dir() else None,
        work=work,
        sweep=Path(args.sweep).resolve(),
        dist_config=Path(args.dist_config).resolve(),
        deadline=Deadline(time.monotonic() + sizes.deadline),
        thread_env=thread_env,
        launch=launch,
    )


def run_step(index: int, check: Check, torch_error: str | None) -> dict[str, Any]:
    """One step's record: what it returned, or its error (the next step still runs)."""
    name, step = STEPS[index]
    say(f"\n== step {index}: {name}" if index else f"== step 0: {name}")
    t0 = time.perf_counter()
    if torch_error is not None and index != 0:
        rec = {"passed": False, "error": f"torch does not import: {torch_error}"}
    else:
        try:
            rec = step(check)
        except Exception as exc:  # noqa: BLE001 - recorded; the next step still runs
            rec = {
                "passed": False,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-4000:],
            }
    rec = {"step": index, "name": name, **rec, "wall_s": round(time.perf_counter() - t0, 3)}
    say(
        f"-- step {index} {name}: {'PASS' if rec['passed'] else 'FAIL'} ({rec['wall_s']:.1f} s)"
        + (f": {rec['error']}" if rec.get("error") else "")
    )
    return rec


def new_report(check: Check, argv: list[str]) -> dict[str, Any]:
    return {
        "tool": "benchmarks/gpu_check.py",
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "mode": check.mode,
        "mode_reason": check.mode_reason or None,
        "argv": argv,
        "data_dir": str(check.data_dir) if check.data_dir else None,
        "work_dir": str(check.work),
        "sizes": dataclasses.asdict(check.sizes),
        "thread_env": check.thread_env,
        "versions": None,
        "device": None,
        "steps": {},
        "goals": check.goals,
    }


def versions_summary(rec: dict[str, Any], mode: str) -> dict[str, Any]:
    """The report's ``versions`` and ``device`` from step 0's record."""
    keys = ("torch", "cuda", "cudnn", "driver", "driver_source", "python", "numpy", "git_commit")
    device = {"mode": mode} | {k: rec.get(k) for k in ("gpus", "gpu_count", "cpu_count", "platform")}
    return {"versions": {k: rec.get(k) for k in keys}, "device": device}


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through run_cmd, which ends the running subprocess group


@contextlib.contextmanager
def process_settings(torch: Any, single_thread: bool) -> Iterator[None]:
    """SIGTERM ends the check as an exception would (no rank left behind); the dry run is single-threaded.
    Both are put back afterwards, so that ``main`` can be called in a process that goes on (the tests)."""
    handler = signal.signal(signal.SIGTERM, _terminate)
    threads = torch.get_num_threads() if torch is not None else None
    if single_thread and torch is not None:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, handler)
        if threads is not None:
            torch.set_num_threads(threads)


def main(argv: list[str] | None = None, launch: Launch = run_cmd) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    torch, torch_error = import_torch()
    mode, reason = mode_of(args.dry_run, torch is not None and torch.cuda.is_available(), torch_error)
    check = make_check(args, mode, reason, launch)
    report, path = new_report(check, sys.argv[1:] if argv is None else argv), out / RESULT_FILE
    with process_settings(torch, single_thread=mode != "gpu"):
        for index in [0] + list(dict.fromkeys(s for s in args.steps if s != 0)):
            rec = report["steps"][STEPS[index][0]] = run_step(index, check, torch_error)
            if index == 0:
                report |= versions_summary(rec, mode)
            failed = [n for n, r in report["steps"].items() if not r.get("passed")]
            report |= {"failed_steps": failed, "passed": not failed, "wall_s": round(time.perf_counter() - started, 3)}
            write_json_atomic(path, report)
    verdict = "ALL STEPS PASSED" if report["passed"] else "FAILED: " + ", ".join(report["failed_steps"])
    say(f"\n{verdict} ({mode}, {report['wall_s']:.1f} s) -> {path}")
    for goal, met in check.goals.items():
        say(f"goal {goal}: {'met' if met else 'MISSED'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
