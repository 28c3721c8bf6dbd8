"""GPU readiness check in one call: versions, vmap'd clients vs a per-client loop, one STL-SGD stage of Table 3
(ResNet18, IID) with the column's extrapolated wall time, and torch.distributed (nccl) against the simulator.

    bash benchmarks/gpu_check.sh --out gpu_out [--data-dir D] [--dry-run] [--steps 1,2,3]

Steps (each recorded in ``OUT/gpu_check.json``, which is rewritten after every step; a failing step is
recorded with its error and the others still run; the exit status is 1 when any step failed):

0. versions: torch, CUDA, cuDNN, the NVIDIA driver (nvidia-smi, else /proc/driver/nvidia/version, else
   torch's CUDA driver API version), the GPU name(s), and the Python packages the CLI needs that are missing.
1. ``vmap_vs_loop``: images/s of :class:`stlsgd.problems.neural.NeuralNetProblem.local_steps` (all clients
   stacked, one vmap(grad) call per step) against a loop over one ``nn.Module`` + ``torch.optim.SGD`` per
   client on the same mini-batches, for ResNet18 (``make_model('resnet18', 3, 10, 32)``) and the small CNN
   (MNIST-shaped), 8 clients x 32 images each; warm-up calls first, ``torch.cuda.synchronize()`` around every
   timed call, median of the repeats. Also checks that one step of both gives the same update. Goal on GPU:
   vmap / loop >= 2x (reported under ``goals``; a missed goal does not fail the step).
2. ``stage_run``: stage 1 (T_1 iterations) of the first STL-SGD row of
   ``configs/paper/table3_resnet18_iid.toml`` (base + the row's first grid setting + its fixed fields, resolved
   by :func:`stlsgd.experiments.sweeps.load_sweep` as ``stlsgd sweep`` resolves it; T_1 by the plan's own rule), run through ``python -m stlsgd run`` and capped at
   ``--stage-iterations`` iterations and ``--stage-timeout`` seconds. Data: the real CIFAR-10 when the data dir
   holds it; ``cifar10-png200`` when it fits the run's needs (at least one iteration of distinct images and,
   on GPU, the 50,000 images the budgets and T_1 are counted in); otherwise synthetic CIFAR-shaped images
   (3x32x32, 10 classes, random) written as CIFAR-10 pickle batches to ``WORK/synthetic-data`` (deleted after
   the run). Prints the time per epoch and the extrapolated wall time of the Table 3 column (formula printed
   with it).
3. ``dist_vs_sim``: ``torchrun --nproc_per_node=<GPUs> -m stlsgd run configs/examples/a9a_stl_sc.toml
   --backend dist --comm-backend nccl`` and the same config in the simulator, small iteration budget; compares
   the two ``summary.json`` (status, rounds, iterations, stages, rounds/iterations to target, bytes, final
   objective) and the ``final_params.npz`` arrays, which must be equal bit for bit (the average has one
   summation order on both sides). a9a from the data dir, else the bundled ``digits49``.

Without CUDA, or with ``--dry-run``, the same steps run at tiny sizes on the CPU (gloo with 2 ranks instead of
nccl) in well under a minute, so CI keeps the script working (tests/benchmarks/test_gpu_check.py).

On a GPU machine the whole check is sized for well under 8 minutes (``--deadline`` caps the subprocesses).
The run directories go to ``--work-dir`` (default ``OUT/work``); everything that matters is in the JSON.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import importlib.util
import json
import math
import os
import pickle
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the library is imported by the steps that use it, so step 0 runs even when it cannot be
    from stlsgd.experiments.sweeps import RunSpec, Sweep

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SWEEP = REPO / "configs" / "paper" / "table3_resnet18_iid.toml"
DEFAULT_DIST_CONFIG = REPO / "configs" / "examples" / "a9a_stl_sc.toml"
RESULT_FILE = "gpu_check.json"
STEP_NAMES = {0: "versions", 1: "vmap_vs_loop", 2: "stage_run", 3: "dist_vs_sim"}
# Training-set sizes of the image datasets a Table 3 sweep may name (budgets and T1_epochs count epochs of these).
IMAGE_SET_SIZES = {"cifar10": 50_000, "cifar10-png200": 200, "mnist10": 60_000}
CIFAR_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
PNG200_LABELS = Path("cifar10") / "train_first200_kaggle" / "trainLabels.csv"
CIFAR_DIR = Path("cifar10") / "cifar-10-batches-py"
# Modules `python -m stlsgd run` imports (pydantic, platformdirs: config and runner; numba: logistic).
CLI_MODULES = ("numpy", "torch", "pydantic", "platformdirs", "yaml", "numba", "tqdm", "PIL", "scipy", "sklearn")
PARAM_RTOL = 0.0  # dist vs sim: one summation order on both sides, so bit for bit

SIZES: dict[str, dict[str, Any]] = {
    "gpu": {
        "bench": {
            "resnet18": dict(shape=(3, 32, 32), clients=8, batch=32, steps=10, repeats=5, warmup=2, samples=4096),
            "cnn": dict(shape=(1, 28, 28), clients=8, batch=32, steps=20, repeats=5, warmup=2, samples=4096),
        },
        "stage_iterations": 400,
        "stage_timeout": 240,
        "stage_overrides": {"problem.device": "cuda"},
        "dist_iterations": 200_000,
        "dist_timeout": 180,
        "synthetic_images": None,  # None: as many as the config's dataset has
        "deadline": 450,
    },
    "dry-run": {
        "bench": {
            "resnet18": dict(shape=(3, 8, 8), clients=2, batch=4, steps=1, repeats=2, warmup=1, samples=64),
            "cnn": dict(shape=(1, 28, 28), clients=2, batch=8, steps=3, repeats=2, warmup=1, samples=128),
        },
        "stage_iterations": 4,
        "stage_timeout": 120,
        # Tiny: 2 clients x 2 images, period 2, 32 images, an evaluation every 2 iterations, CPU.
        "stage_overrides": {
            "data.num_clients": 2,
            "algorithm.batch": 2,
            "algorithm.k": 2,
            "data.max_samples": 32,
            "problem.eval_batch": 32,
            "problem.device": "cpu",
            "run.eval_every_iterations": 2,
        },
        "dist_iterations": 12_000,
        "dist_timeout": 120,
        "synthetic_images": 200,
        "deadline": 300,
    },
}


def say(*parts: Any) -> None:
    print(*parts, flush=True)


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def timeout(self, wanted: float, floor: float = 20.0) -> float:
        """A subprocess timeout: ``wanted`` seconds, or what is left of the deadline (at least ``floor``)."""
        return max(floor, min(wanted, self.left()))


# ----------------------------------------------------------------------------------------------- helpers


def ensure_stlsgd_importable() -> None:
    try:
        import stlsgd  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO / "src"))


def child_env(**extra: str) -> dict[str, str]:
    """Environment of the CLI subprocesses: the repo's sources importable, no inherited torchrun variables."""
    env = dict(os.environ)
    for key in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GROUP_RANK",
        "ROLE_RANK",
        "TORCHELASTIC_RUN_ID",
    ):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(REPO / "src")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_cmd(cmd: list[Any], *, timeout: float, env: dict[str, str], log: Path) -> dict[str, Any]:
    """Run ``cmd`` from the repo root; stdout+stderr go to ``log``. Returns rc, wall time and the output's tail."""
    cmd = [str(c) for c in cmd]
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        # Its own process group (same session), so a timeout can end torchrun and all of its ranks at once.
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, process_group=0)
        try:
            rc: int | None = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            rc = proc.wait()
        except BaseException:  # interrupted or terminated: leave no rank behind
            _kill_group(proc)
            raise
    tail = log.read_text(errors="replace")[-2000:]
    return {
        "cmd": " ".join(cmd),
        "rc": rc,
        "timed_out": timed_out,
        "wall_s": round(time.perf_counter() - t0, 3),
        "output_tail": tail,
        "log": str(log),
    }


def _kill_group(proc: subprocess.Popen) -> None:
    """End the process group this script started for ``proc`` (torchrun and its ranks), TERM then KILL."""
    import signal

    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def cmd_error(res: dict[str, Any], what: str) -> str:
    why = "timed out" if res["timed_out"] else f"exit status {res['rc']}"
    lines = [ln for ln in res["output_tail"].splitlines() if ln.strip()]
    return f"{what} {why}: " + (" | ".join(lines[-3:]) if lines else "(no output)")


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def toml_literal(value: Any) -> str:
    """A ``--set`` value the CLI parses back (it reads TOML literals)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def off(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "off"))


# ----------------------------------------------------------------------------------------------- step 0


def nvidia_driver() -> tuple[str | None, str | None, list[str]]:
    """(driver version, where it came from, GPU names per nvidia-smi)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]
            if out.returncode == 0 and rows:
                return rows[0][1], "nvidia-smi", [f"{r[0]} ({r[2]})" for r in rows]
        except (OSError, subprocess.SubprocessError):
            pass
    proc = Path("/proc/driver/nvidia/version")
    if proc.is_file():
        try:
            text = proc.read_text()
            for word in text.split():
                if word.count(".") >= 1 and word.replace(".", "").isdigit():
                    return word, str(proc), []
        except OSError:
            pass
    return None, None, []


def step_versions(ctx: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - still report the driver and the GPUs nvidia-smi sees
        torch, torch_error = None, f"{type(exc).__name__}: {exc}"
    else:
        torch_error = None
    cuda = torch is not None and torch.cuda.is_available()
    driver, driver_source, smi_gpus = nvidia_driver()
    if driver is None and cuda:
        try:
            v = int(torch._C._cuda_getDriverVersion())  # the CUDA driver API version, e.g. 12040
            driver, driver_source = f"CUDA driver API {v // 1000}.{(v % 1000) // 10}", "torch"
        except Exception:  # noqa: BLE001 - a private API; absence is fine
            pass
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    missing = [m for m in CLI_MODULES if importlib.util.find_spec(m) is None]
    commit = None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        commit = out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    info = {
        "torch": torch.__version__ if torch else None,
        "torch_error": torch_error,
        "cuda": torch.version.cuda if torch else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "driver": driver,
        "driver_source": driver_source,
        "gpus": gpus,
        "gpus_nvidia_smi": smi_gpus,
        "gpu_count": len(gpus),
        "cuda_available": cuda,
        "python": platform.python_version(),
        "executable": sys.executable,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads() if torch else None,
        "cudnn_benchmark": torch.backends.cudnn.benchmark if torch else None,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32 if torch else None,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32 if torch else None,
        "git_commit": commit,
        "missing_modules": missing,
    }
    say(f"torch {info['torch']}  CUDA {info['cuda']}  cuDNN {info['cudnn']}  driver {driver} (from {driver_source})")
    say(f"GPUs: {', '.join(gpus) if gpus else 'none'}{'  [' + '; '.join(smi_gpus) + ']' if smi_gpus else ''}")
    say(
        f"python {info['python']} ({sys.executable}), numpy {info['numpy']}, {info['cpu_count']} CPUs, "
        f"mode: {ctx['mode']}{' (' + ctx['mode_reason'] + ')' if ctx['mode_reason'] else ''}"
    )
    if missing:
        say(
            f"missing Python modules: {', '.join(missing)} -- steps 2 and 3 run `python -m stlsgd` and need them "
            "(`pip install -e .` installs them; offline, bring their wheels)"
        )
    ctx["versions"] = info
    problems = ([f"torch does not import: {torch_error}"] if torch_error else []) + (
        [f"missing Python modules: {', '.join(missing)}"] if missing else []
    )
    return {"passed": not problems, "error": "; ".join(problems) or None, **info}


# ----------------------------------------------------------------------------------------------- step 1


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_model(name: str, size: dict[str, Any], device: Any) -> dict[str, Any]:
    """images/s of the stacked vmap'd clients vs a loop over per-client modules, same mini-batches."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from stlsgd.problems.nets import make_model
    from stlsgd.problems.neural import NeuralNetProblem

    shape, clients, batch, steps = size["shape"], size["clients"], size["batch"], size["steps"]
    rng = np.random.default_rng(0)
    X = rng.standard_normal((size["samples"], *shape), dtype=np.float32)
    y = rng.integers(0, 10, size["samples"])
    torch.manual_seed(0)
    # make_model('resnet18', 3, 10, 32) as asked; the image side only matters for the CNN's linear layer.
    side = 32 if name == "resnet18" else shape[1]
    problem = NeuralNetProblem(make_model(name, shape[0], 10, side), X, y, device=str(device))
    state = problem.init_state(clients, seed=0)
    lr = 0.01
    models = []
    for c in range(clients):
        m = make_model(name, shape[0], 10, side).to(device).train()
        m.load_state_dict({k: v[c] for k, v in state.items()})
        models.append((m, torch.optim.SGD(m.parameters(), lr=lr)))
    Xd, yd = problem.X, problem.y

    def loop(rows: np.ndarray) -> None:
        rows_t = torch.from_numpy(rows).to(device)
        for t in range(rows.shape[0]):
            for c, (m, opt) in enumerate(models):
                idx = rows_t[t, c]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(m(Xd[idx]), yd[idx]).backward()
                opt.step()

    def vectorised(rows: np.ndarray) -> None:
        problem.local_steps(state, rows, np.full(rows.shape[0], lr), None)

    # Agreement: one step from the same x_0 on the same rows must give the same update.
    before = {k: v.detach().clone() for k, v in state.items() if v.is_floating_point()}
    rows = rng.integers(0, size["samples"], (1, clients, batch))
    vectorised(rows)
    loop(rows)
    worst = 0.0
    for key, x0 in before.items():
        dv = state[key] - x0
        dl = torch.stack([dict(m.state_dict())[key] for m, _ in models]) - x0
        scale = float(dl.abs().max())
        if scale > 0:
            worst = max(worst, float((dv - dl).abs().max()) / scale)
    agree_tol = 5e-2 if device.type == "cuda" else 1e-3  # TF32 convolutions on GPU

    times: dict[str, list[float]] = {}
    for label, fn in (("vmap", vectorised), ("loop", loop)):
        for _ in range(size["warmup"]):
            fn(rng.integers(0, size["samples"], (steps, clients, batch)))
        _sync(device)
        times[label] = []
        for _ in range(size["repeats"]):
            rows = rng.integers(0, size["samples"], (steps, clients, batch))
            _sync(device)
            t0 = time.perf_counter()
            fn(rows)
            _sync(device)
            times[label].append(time.perf_counter() - t0)
    images = clients * batch * steps
    res: dict[str, Any] = {
        "model": name,
        "image_shape": list(shape),
        "clients": clients,
        "batch": batch,
        "steps_per_call": steps,
        "repeats": size["repeats"],
        "warmup_calls": size["warmup"],
        "images_per_call": images,
        "update_rel_diff": worst,
        "update_rel_tol": agree_tol,
    }
    for label in ("vmap", "loop"):
        res[f"{label}_times_s"] = [round(t, 6) for t in times[label]]
        res[f"{label}_images_per_s"] = images / statistics.median(times[label])
        res[f"{label}_images_per_s_best"] = images / min(times[label])
    res["ratio_vmap_over_loop"] = res["vmap_images_per_s"] / res["loop_images_per_s"]
    return res  # the models and the problem go with this frame; the caller empties the CUDA cache


def step_vmap_vs_loop(ctx: dict[str, Any]) -> dict[str, Any]:
    import torch

    ensure_stlsgd_importable()
    device = torch.device("cuda" if ctx["mode"] == "gpu" else "cpu")
    out: dict[str, Any] = {
        "device": str(device),
        "models": {},
        "goal": ">= 2x on GPU" if ctx["mode"] == "gpu" else None,
    }
    errors = []
    for name, size in ctx["sizes"]["bench"].items():
        try:
            r = bench_model(name, size, device)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001 - recorded, the other model still runs
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            out["models"][name] = {"error": traceback.format_exc()[-3000:]}
            say(f"  {name}: FAILED {type(exc).__name__}: {exc}")
            continue
        out["models"][name] = r
        if r["update_rel_diff"] > r["update_rel_tol"]:
            errors.append(f"{name}: vmap and loop updates differ (max rel diff {r['update_rel_diff']:.2e})")
        say(
            f"  {name:>8} {size['clients']} clients x {size['batch']} images {tuple(size['shape'])}: "
            f"vmap {r['vmap_images_per_s']:9.0f} images/s, loop {r['loop_images_per_s']:9.0f} images/s, "
            f"vmap/loop {r['ratio_vmap_over_loop']:.2f}x  (median of {size['repeats']} x {size['steps']} steps; "
            f"one-step update rel diff {r['update_rel_diff']:.1e})"
        )
        if ctx["mode"] == "gpu":
            ctx["goals"][f"vmap_over_loop_{name}_>=2x"] = r["ratio_vmap_over_loop"] >= 2.0
    return {"passed": not errors, "error": "; ".join(errors) or None, **out}


# ----------------------------------------------------------------------------------------------- step 2


def stl_row(sweep: Sweep) -> RunSpec:
    """The first grid setting of the sweep's first STL-SGD row, resolved as ``stlsgd sweep`` resolves it."""
    spec = next((r for r in sweep.grid if r.method in ("stl_nc", "stl_sc")), None)
    if spec is None:
        raise ValueError(f"{sweep.source}: the sweep file has no stl_nc/stl_sc row")
    return spec


def first_stage(config: dict[str, Any], n: int) -> int | None:
    """T_1 of ``config`` on ``n`` images (the plan's own rule: T1, or T1_epochs of n images over N x B)."""
    from stlsgd.algorithms.registry import PlanContext, first_stage_iterations

    alg = config["algorithm"]
    ctx = PlanContext(num_samples=n, num_clients=int(config["data"]["num_clients"]), lam=None, iid=True)
    return first_stage_iterations(alg.get("T1"), alg.get("T1_epochs"), int(alg.get("batch", 1)), ctx)


def images_at_budget(config: dict[str, Any], n: int) -> tuple[int, int, int]:
    """(images processed by all clients, iterations, evaluations) of one run that goes to its budget."""
    alg, run, N = config.get("algorithm", {}), config.get("run", {}), config["data"].get("num_clients", 32)
    iters = run.get("max_iterations")
    if off(iters):
        raise ValueError(f"{config['name']}: no run.max_iterations budget to extrapolate from")
    iters = int(iters)
    method, B = alg["method"], int(alg.get("batch", 1))
    if method == "cr_psgd":
        # CR-PSGD: the per-client batch grows by rho every step ("step") or every epoch ("epoch"), capped.
        rho, cap, grow = float(alg.get("rho", 1.01)), int(alg.get("max_batch", 512)), alg.get("grow", "step")
        size, samples = float(B), 0
        for t in range(iters):
            if grow == "step":
                b = min(int(math.floor(B * rho ** min(t, 10_000) + 1e-9)), cap)
            else:
                b = min(int(math.floor(size + 1e-9)), cap)
                if (samples + b) * N // n > samples * N // n and size <= cap:
                    size *= rho
            samples += max(b, 1)
        images = samples * N
    else:
        images = iters * N * B
    period = float(alg.get("k", 1)) if method in ("local_sgd", "stl_sc", "stl_nc") else 1.0
    rounds = math.ceil(iters / period)
    every_it, every_r = run.get("eval_every_iterations"), int(run.get("eval_every", 1))
    evals = max(math.ceil(iters / int(every_it)) if not off(every_it) else 0, rounds // every_r)
    return images, iters, evals


def column_budget(sweep: Sweep, n: int) -> dict[str, Any]:
    """Epochs (and evaluations) of every grid run and every extra-seed rerun of the column at its budget."""
    per_row = []
    extra_seeds = max(len(sweep.seeds) - 1, 0)
    for label in sweep.labels:
        costs = [images_at_budget(r.config, n) for r in sweep.grid if r.label == label]
        worst = max(costs, key=lambda c: c[0])
        epochs = sum(c[0] for c in costs) / n + extra_seeds * worst[0] / n
        evals = sum(c[2] for c in costs) + extra_seeds * worst[2]
        per_row.append(
            {
                "label": label,
                "grid_runs": len(costs),
                "seed_reruns": extra_seeds,
                "epochs": epochs,
                "evaluations": evals,
                "max_iterations": sorted({c[1] for c in costs}),
            }
        )
    return {
        "rows": per_row,
        "runs": sum(r["grid_runs"] + r["seed_reruns"] for r in per_row),
        "epochs": sum(r["epochs"] for r in per_row),
        "evaluations": sum(r["evaluations"] for r in per_row),
    }


def write_synthetic_cifar(root: Path, images: int, seed: int = 0) -> None:
    """Random 3x32x32 uint8 images and labels 0..9 as the five CIFAR-10 python pickle batches."""
    import numpy as np

    rng = np.random.default_rng(seed)
    folder = root / CIFAR_DIR
    folder.mkdir(parents=True, exist_ok=True)
    per = [images // 5 + (1 if i < images % 5 else 0) for i in range(5)]
    for name, count in zip(CIFAR_BATCHES, per):
        data = rng.integers(0, 256, (count, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, count).tolist()
        with open(folder / name, "wb") as fh:  # protocol 2, as the real batches (the reader allows only that)
            pickle.dump({b"data": data, b"labels": labels, b"batch_label": b"synthetic"}, fh, protocol=2)


def choose_stage_data(ctx: dict[str, Any], config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Which data the stage runs on: the config's own dataset, cifar10-png200 when it fits, else synthetic."""
    data_dir: Path | None = ctx["data_dir"]
    dataset = config["data"]["dataset"]
    n_config = IMAGE_SET_SIZES.get(dataset)
    if n_config is None:
        raise ValueError(f"data.dataset {dataset!r}: unknown training-set size (known: {', '.join(IMAGE_SET_SIZES)})")
    N = int(overrides.get("data.num_clients", config["data"].get("num_clients", 32)))
    B = int(overrides.get("algorithm.batch", config["algorithm"].get("batch", 1)))
    limit = overrides.get("data.max_samples", config["data"].get("max_samples"))
    dry = ctx["mode"] != "gpu"
    # Budgets and T1_epochs count epochs of the config's dataset; at full scale the stand-in must have as many
    # images (else T1 and the evaluation cost shrink); at any scale one iteration's N x B distinct images.
    need = N * B if dry else max(N * B, n_config)
    real = data_dir is not None and all((data_dir / CIFAR_DIR / b).is_file() for b in CIFAR_BATCHES)
    if dataset == "cifar10" and real:
        return {
            "source": "cifar10",
            "dataset": dataset,
            "data_dir": data_dir,
            "images": n_config,
            "why": f"the config's own dataset, found in {data_dir}",
        }
    notes = []
    if data_dir is not None and (data_dir / PNG200_LABELS).is_file():
        have = IMAGE_SET_SIZES["cifar10-png200"]
        if have >= need:
            used = min(have, int(limit)) if limit else have
            return {
                "source": "cifar10-png200",
                "dataset": "cifar10-png200",
                "data_dir": data_dir,
                "images": used,
                "why": f"cifar10-png200 ({have} images) fits: the run needs {need} ({N} clients x {B} images per "
                "iteration)",
            }
        notes.append(
            f"cifar10-png200 holds {have} images, the run needs {need} (budgets and T1 in epochs of "
            f"{n_config:,} images; {N} clients x {B} images per iteration)"
        )
    else:
        notes.append(f"no cifar10-png200 in {data_dir}" if data_dir else "no data dir")
    images = ctx["sizes"]["synthetic_images"] or n_config
    root = ctx["work"] / "synthetic-data"
    shutil.rmtree(root, ignore_errors=True)
    write_synthetic_cifar(root, images)
    used = min(images, int(limit)) if limit else images
    return {
        "source": "synthetic",
        "dataset": "cifar10",
        "data_dir": root,
        "images": used,
        "synthetic_root": root,
        "why": "; ".join(notes) + f" -> synthetic CIFAR-shaped images (3x32x32, 10 classes, {images:,} random "
        "images written as CIFAR-10 pickle batches)",
    }


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut short by a kill
    return lines


def time_evaluation(model: str, shape: tuple[int, ...], images: int, eval_batch: int, device: str) -> float:
    """Seconds of one evaluation of the averaged model on ``images`` training images (what the runner does)."""
    import numpy as np
    import torch

    from stlsgd.problems.nets import make_model
    from stlsgd.problems.neural import NeuralNetProblem

    rng = np.random.default_rng(1)
    X = rng.standard_normal((images, *shape), dtype=np.float32)
    y = rng.integers(0, 10, images)
    problem = NeuralNetProblem(make_model(model, shape[0], 10, shape[1]), X, y, device=device, eval_batch=eval_batch)
    state = problem.init_state(1, seed=0)
    problem.evaluate(state)  # warm-up
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        problem.evaluate(state)  # ends with float(), which synchronises
        best = min(best, time.perf_counter() - t0)
    del problem, state, X
    if device == "cuda":
        torch.cuda.empty_cache()
    return best


def step_stage_run(ctx: dict[str, Any]) -> dict[str, Any]:
    ensure_stlsgd_importable()
    sweep_path: Path = ctx["sweep"]
    from stlsgd.experiments.sweeps import load_sweep

    sweep = load_sweep(sweep_path)
    spec = stl_row(sweep)
    config, settings = spec.config, spec.settings
    sizes = ctx["sizes"]
    overrides: dict[str, Any] = dict(sizes["stage_overrides"])
    data = choose_stage_data(ctx, config, overrides)
    if data["dataset"] != config["data"]["dataset"]:
        overrides["data.dataset"] = data["dataset"]
    N = int(overrides.get("data.num_clients", config["data"]["num_clients"]))
    B = int(overrides.get("algorithm.batch", config["algorithm"]["batch"]))
    n_run = data["images"]
    n_config = IMAGE_SET_SIZES[config["data"]["dataset"]]
    T1 = first_stage(
        {**config, "data": {**config["data"], "num_clients": N}, "algorithm": {**config["algorithm"], "batch": B}},
        n_run,
    )
    cap = min(T1 or sizes["stage_iterations"], sizes["stage_iterations"])
    overrides["run.max_iterations"] = cap
    say(
        f"  row {spec.label!r} ({spec.method}, option {config['algorithm'].get('option', 1)}), first grid "
        f"setting {settings}; stage 1 = T1 = {T1} iterations on {n_run:,} images, running {cap}"
    )
    say(f"  data: {data['source']} -- {data['why']}")

    work = ctx["work"] / "stage"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    import yaml

    cfg_path = work / "stage_config.yaml"
    cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
    out = work / "run"
    cmd = [sys.executable, "-m", "stlsgd", "run", cfg_path, "--out", out, "--quiet", "--data-dir", data["data_dir"]]
    for key, value in overrides.items():
        cmd += ["--set", f"{key}={toml_literal(value)}"]
    env = child_env(STLSGD_CACHE=str(ctx["work"] / "cache"), **ctx["thread_env"])
    res = run_cmd(cmd, timeout=ctx["deadline"].timeout(sizes["stage_timeout"]), env=env, log=work / "stage.log")
    late = " (timed out: figures from the metrics so far)" if res["timed_out"] else ""
    say(f"  $ {res['cmd']}\n  -> rc {res['rc']}{late}, {res['wall_s']:.1f} s")
    result: dict[str, Any] = {
        "sweep": str(sweep_path),
        "row": spec.label,
        "method": spec.method,
        "grid_setting": settings,
        "config": config,
        "overrides": overrides,
        "command": res["cmd"],
        "rc": res["rc"],
        "timed_out": res["timed_out"],
        "process_wall_s": res["wall_s"],
        "data_source": data["source"],
        "data_why": data["why"],
        "images": n_run,
        "T1": T1,
        "iterations_cap": cap,
        "clients": N,
        "batch": B,
    }
    if data.get("synthetic_root"):
        shutil.rmtree(data["synthetic_root"], ignore_errors=True)
    metrics = read_metrics(out / "metrics.jsonl")
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else None
    result["summary"] = summary
    result["evaluations_logged"] = len(metrics)
    if res["rc"] != 0 and not (res["timed_out"] and len(metrics) >= 2):
        return {"passed": False, "error": cmd_error(res, "stlsgd run"), **result}

    # Steady state: from the first evaluation line to the last (warm-up excluded, the evaluations the config
    # schedules included); else the whole run.
    if len(metrics) >= 2 and metrics[-1]["iteration"] > metrics[0]["iteration"]:
        span_it = metrics[-1]["iteration"] - metrics[0]["iteration"]
        s_per_it = (metrics[-1]["wall_s"] - metrics[0]["wall_s"]) / span_it
        evals_per_it = (len(metrics) - 1) / span_it
        basis = f"evaluation lines {len(metrics)}: iterations {metrics[0]['iteration']}..{metrics[-1]['iteration']}"
    elif summary and summary.get("iterations"):
        s_per_it = summary["wall_s"] / summary["iterations"]
        evals_per_it = len(metrics) / summary["iterations"]
        basis = "whole run (warm-up included)"
    else:
        return {"passed": False, "error": "no iterations recorded", **result}
    iterations_done = metrics[-1]["iteration"] if metrics else (summary or {}).get("iterations", 0)
    s_per_image = s_per_it / (N * B)
    epoch_s = s_per_image * n_config
    result.update(
        {
            "iterations_run": iterations_done,
            "timing_basis": basis,
            "seconds_per_iteration": s_per_it,
            "seconds_per_image": s_per_image,
            "time_per_epoch_s": epoch_s,
            "epoch_images": n_config,
            "stage1_time_s": s_per_it * T1 if T1 else None,
        }
    )

    # Evaluation cost: one evaluation of the averaged model on the run's training images, timed in-process.
    model = config["problem"].get("model", "cnn")
    eval_batch = int(overrides.get("problem.eval_batch", config["problem"].get("eval_batch", 1024)))
    device = "cuda" if ctx["mode"] == "gpu" else "cpu"
    try:
        t_eval_run = time_evaluation(model, (3, 32, 32), n_run, eval_batch, device)
    except Exception as exc:  # noqa: BLE001 - the eval-aware figure is extra; the formula-A figure stands
        t_eval_run = None
        result["eval_timing_error"] = f"{type(exc).__name__}: {exc}"
    budget = column_budget(sweep, n_config)
    column_a = epoch_s * budget["epochs"]
    result.update(
        {
            "column": budget,
            "column_time_s": column_a,
            "column_time_h": column_a / 3600,
            "column_formula": "time_per_epoch_s x sum over the column's rows of the epochs every grid run "
            "and every extra-seed rerun takes at its budget run.max_iterations "
            "(epochs = iterations x clients x per-client batch / n; CR-PSGD's growing "
            "batch followed step by step); no early stop, no pruning: an upper "
            "bound, which also assumes the STL row's time per image for every row "
            "(LB-SGD's and CR-PSGD's larger batches run faster per image on a GPU)",
        }
    )
    if t_eval_run is not None:
        t_eval = t_eval_run * n_config / n_run  # an evaluation passes over the whole training set
        train_s_per_image = max(s_per_it - evals_per_it * t_eval_run, 0.0) / (N * B)
        column_b = train_s_per_image * n_config * budget["epochs"] + t_eval * budget["evaluations"]
        result.update(
            {
                "eval_time_s": t_eval,
                "eval_time_measured_s": t_eval_run,
                "train_time_per_epoch_s": train_s_per_image * n_config,
                "column_time_with_eval_schedule_s": column_b,
                "column_time_with_eval_schedule_h": column_b / 3600,
                "column_formula_with_eval_schedule": "train_time_per_epoch_s x epochs + eval_time_s x evaluations, evaluations per run = "
                "max(iterations / run.eval_every_iterations, rounds / run.eval_every) at the budget "
                "(LB-SGD evaluates every iteration)",
            }
        )
    say(
        f"  {iterations_done} iterations: {s_per_it * 1e3:.1f} ms/iteration ({basis}) -> time per epoch of "
        f"{n_config:,} images: {epoch_s:.2f} s; stage 1 ({T1} iterations): {result['stage1_time_s'] or 0:.1f} s"
    )
    say(
        f"  Table 3 '{sweep.name}' column: {budget['runs']} runs, {budget['epochs']:,.0f} epochs at the budgets "
        f"-> {column_a / 3600:,.1f} h  (= {epoch_s:.2f} s/epoch x {budget['epochs']:,.0f} epochs; upper bound: every "
        "grid run and seed rerun to its budget, no early stop or pruning)"
    )
    if t_eval_run is not None:
        say(
            f"  with the evaluation schedules: {result['column_time_with_eval_schedule_h']:,.1f} h  (= "
            f"{result['train_time_per_epoch_s']:.2f} s/epoch training x {budget['epochs']:,.0f} epochs + "
            f"{result['eval_time_s']:.2f} s/evaluation x {budget['evaluations']:,} evaluations)"
        )
    if ctx["mode"] != "gpu":
        say("  (dry run: CPU figures at tiny sizes; the extrapolation only exercises the code)")
    status_ok = summary is None or summary["status"] in ("budget", "reached")
    ok = bool(s_per_it > 0 and math.isfinite(s_per_it) and status_ok)
    return {
        "passed": ok,
        "error": None if ok else f"unexpected run status {summary and summary.get('status')}",
        **result,
    }


# ----------------------------------------------------------------------------------------------- step 3


def max_rel_diff(a: Any, b: Any) -> float:
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf
    if a.size == 0:
        return 0.0
    scale = max(float(np.abs(b).max()), 1e-300)
    return float(np.abs(a - b).max()) / scale


def compare_pair(ctx: dict[str, Any], name: str, sets: list[str], data_dir: Path, *, exact: bool) -> dict[str, Any]:
    """The dist-vs-sim config run both ways into ``work/dist_vs_sim/<name>``; their summaries compared.

    Always required: the same status, rounds, iterations, stages, rounds/iterations to target, bytes and
    evaluation rounds, the dist backend asked for, and the first evaluation (the first average) equal to
    ``PARAM_RTOL``. With ``exact`` also the final objective and every final_params array to ``PARAM_RTOL``;
    without it those are reported only.
    """
    import numpy as np

    sizes, nproc, comm = ctx["sizes"], ctx["nproc"], ctx["comm"]
    work = ctx["work"] / "dist_vs_sim" / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    config = ctx["dist_config"]
    common = ["--data-dir", data_dir, "--quiet"] + [x for s in sets for x in ("--set", s)]
    env = child_env(
        STLSGD_CACHE=str(ctx["work"] / "cache"),
        GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
        **{"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc)), **ctx["thread_env"]},
    )
    # The simulator first: it computes f* once into the shared cache, which the dist run then reads.
    sim = run_cmd(
        [sys.executable, "-m", "stlsgd", "run", config, "--out", work / "sim"] + common,
        timeout=ctx["deadline"].timeout(sizes["dist_timeout"]),
        env=env,
        log=work / "sim.log",
    )
    say(f"  $ {sim['cmd']}\n    -> rc {sim['rc']}, {sim['wall_s']:.1f} s")
    dist = run_cmd(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={nproc}",
            "--standalone",  # one node: torchrun's own rendezvous on a free local port
            "-m",
            "stlsgd",
            "run",
            config,
            "--backend",
            "dist",
            "--comm-backend",
            comm,
            "--out",
            work / "dist",
        ]
        + common,
        timeout=ctx["deadline"].timeout(sizes["dist_timeout"]),
        env=env,
        log=work / "dist.log",
    )
    say(f"  $ {dist['cmd']}\n    -> rc {dist['rc']}, {dist['wall_s']:.1f} s")
    result: dict[str, Any] = {
        "sets": sets,
        "exact": exact,
        "sim_command": sim["cmd"],
        "dist_command": dist["cmd"],
        "sim_rc": sim["rc"],
        "dist_rc": dist["rc"],
        "sim_wall_s": sim["wall_s"],
        "dist_wall_s": dist["wall_s"],
    }
    errors = [cmd_error(r, what) for r, what in ((sim, "simulator run"), (dist, "torchrun dist run")) if r["rc"] != 0]
    if errors:
        return {"passed": False, "error": "; ".join(errors), **result}
    s = json.loads((work / "sim" / "summary.json").read_text())
    d = json.loads((work / "dist" / "summary.json").read_text())
    keys = ("status", "rounds", "iterations", "stages", "rounds_to_target", "iterations_to_target", "bytes")
    compared = {k: {"sim": s.get(k), "dist": d.get(k), "equal": s.get(k) == d.get(k)} for k in keys}
    obj_s, obj_d = (s.get("final") or {}).get("objective"), (d.get("final") or {}).get("objective")
    obj_rel = abs(obj_d - obj_s) / max(abs(obj_s), 1e-300) if obj_s is not None and obj_d is not None else None
    sm, dm = read_metrics(work / "sim" / "metrics.jsonl"), read_metrics(work / "dist" / "metrics.jsonl")
    same_eval_rounds = [m["round"] for m in sm] == [m["round"] for m in dm]
    per_round = [abs(a["objective"] - b["objective"]) / max(abs(a["objective"]), 1e-300) for a, b in zip(sm, dm)]
    first_rel = per_round[0] if per_round else None
    diverged_at = next((m["round"] for m, r in zip(sm, per_round) if r > PARAM_RTOL), None)
    with np.load(work / "sim" / "final_params.npz") as sp, np.load(work / "dist" / "final_params.npz") as dp:
        same_keys = sorted(sp.files) == sorted(dp.files)
        per_array = {k: max_rel_diff(dp[k], sp[k]) for k in sp.files if k in dp.files}
    params_rel = max(per_array.values(), default=math.inf)
    backend = d.get("backend") or {}
    result.update(
        {
            "compared": compared,
            "final_objective": {"sim": obj_s, "dist": obj_d, "rel_diff": obj_rel},
            "same_evaluation_rounds": same_eval_rounds,
            "first_evaluation_rel_diff": first_rel,
            "objective_rel_diff_per_evaluation": per_round,
            "first_round_beyond_rtol": diverged_at,
            "params_same_keys": same_keys,
            "params_max_rel_diff": params_rel,
            "params_rel_diff_per_array": per_array,
            "rtol": PARAM_RTOL,
            "dist_backend": backend,
            "sim_summary": s,
            "dist_summary": d,
        }
    )
    checks = {f"{k} equal": v["equal"] for k, v in compared.items()}
    checks.update(
        {
            "same evaluation rounds": same_eval_rounds,
            "same param arrays": same_keys,
            "first evaluation within rtol": first_rel is not None and first_rel <= PARAM_RTOL,
            "executor dist": backend.get("executor") == "dist",
            f"comm {comm}": backend.get("comm") == comm,
            f"world size {nproc}": backend.get("world_size") == nproc,
        }
    )
    if exact:
        checks.update(
            {
                "final objective within rtol": obj_rel is not None and obj_rel <= PARAM_RTOL,
                "params within rtol": params_rel <= PARAM_RTOL,
            }
        )
    failed = [k for k, ok in checks.items() if not ok]
    result["checks"] = checks
    say(f"    sim : {s['status']} after {s['rounds']} rounds ({s['iterations']} iterations), objective {obj_s}")
    say(
        f"    dist: {d['status']} after {d['rounds']} rounds ({d['iterations']} iterations), objective {obj_d}, "
        f"backend {backend}"
    )
    say(
        f"    first evaluation rel diff {first_rel:.1e}; final objective rel diff {obj_rel:.2e}, final_params max rel "
        f"diff {params_rel:.2e} ({len(per_array)} arrays)"
        + (f"; beyond {PARAM_RTOL:g} from round {diverged_at} on" if diverged_at is not None else "")
        + f": {'OK' if not failed else 'DIFFERENT: ' + ', '.join(failed)}"
    )
    return {"passed": not failed, "error": ("differs: " + ", ".join(failed)) if failed else None, **result}


def step_dist_vs_sim(ctx: dict[str, Any]) -> dict[str, Any]:
    """torchrun --backend dist against the simulator on configs/examples/a9a_stl_sc.toml (a small budget):
    the same summary and the same final parameters bit for bit (the average has one summation order on both
    sides, and nccl's all-gather moves bytes without arithmetic). a9a from the data dir, else digits49."""
    import torch

    gpu = ctx["mode"] == "gpu"
    ctx["nproc"] = torch.cuda.device_count() if gpu else 2
    ctx["comm"] = "nccl" if gpu else "gloo"
    data_dir: Path | None = ctx["data_dir"]
    budget = f"run.max_iterations={ctx['sizes']['dist_iterations']}"
    empty = ctx["work"] / "dist_vs_sim" / "no-data"
    empty.mkdir(parents=True, exist_ok=True)
    has_a9a = data_dir is not None and (data_dir / "a9a" / "a9a.gz").is_file()
    why = (
        f"a9a from {data_dir}" if has_a9a else f"a9a not in {data_dir or 'any data dir'}: the bundled digits49 instead"
    )
    config = ctx["dist_config"]
    say(
        f"  config {config.relative_to(REPO) if config.is_relative_to(REPO) else config}, data: {why}; "
        f"{ctx['nproc']} rank(s), {ctx['comm']}"
    )
    name = "a9a" if has_a9a else "digits49"
    sets = [budget] if has_a9a else [budget, "data.dataset=digits49"]
    main = compare_pair(ctx, name, sets, data_dir if has_a9a else (data_dir or empty), exact=True)
    return {
        "passed": main["passed"],
        "error": main.get("error"),
        "dataset": name,
        "data_why": why,
        "nproc": ctx["nproc"],
        "comm_backend": ctx["comm"],
        "config": str(config),
        "compared": main.get("compared"),
        "final_objective": main.get("final_objective"),
        "params_max_rel_diff": main.get("params_max_rel_diff"),
        "runs": {name: main},
    }


# ----------------------------------------------------------------------------------------------- main


STEPS = {0: step_versions, 1: step_vmap_vs_loop, 2: step_stage_run, 3: step_dist_vs_sim}


def step_list(text: str) -> list[int]:
    try:
        steps = [int(s) for s in text.replace(" ", "").split(",") if s]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected step numbers like 1,2,3, got {text!r}") from None
    unknown = [s for s in steps if s not in STEP_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown step {unknown[0]} (steps: 0-{max(STEP_NAMES)})")
    return steps


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    default_data = REPO.parent / "shared" / "data"
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
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
        "--steps",
        type=step_list,
        default=[1, 2, 3],
        help="steps to run after the versions (step 0), in this order, e.g. 1,3",
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


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through run_cmd, which ends the running subprocess group


def main(argv: list[str] | None = None) -> int:
    import signal

    started = time.perf_counter()
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    try:
        import torch

        cuda = torch.cuda.is_available()
    except Exception as exc:  # noqa: BLE001 - recorded; nothing else can run
        cuda = False
        torch_error = f"{type(exc).__name__}: {exc}"
    else:
        torch_error = None
    mode = "dry-run" if args.dry_run or not cuda else "gpu"
    reason = (
        "--dry-run"
        if args.dry_run
        else ("torch does not import" if torch_error else "no CUDA device" if not cuda else "")
    )
    sizes = copy.deepcopy(SIZES[mode])
    for key in ("stage_iterations", "stage_timeout", "dist_iterations", "deadline"):
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    data_dir = Path(args.data_dir).resolve() if args.data_dir else None
    if data_dir is not None and not data_dir.is_dir():
        data_dir = None
    # The dry run is single-threaded: on a small shared CPU (CI) two threads per process contending with other
    # jobs can make torch's and numba's thread pools spin many times slower; the figures are not the point.
    thread_env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"} if mode != "gpu" else {}
    if thread_env and torch_error is None:
        torch.set_num_threads(1)
    work = Path(args.work_dir).resolve() if args.work_dir else out / "work"
    work.mkdir(parents=True, exist_ok=True)
    wanted = [0] + list(dict.fromkeys(s for s in args.steps if s != 0))
    ctx: dict[str, Any] = {
        "mode": mode,
        "mode_reason": reason,
        "sizes": sizes,
        "data_dir": data_dir,
        "work": work,
        "sweep": Path(args.sweep).resolve(),
        "dist_config": Path(args.dist_config).resolve(),
        "deadline": Deadline(sizes["deadline"]),
        "goals": {},
        "thread_env": thread_env,
    }
    report: dict[str, Any] = {
        "tool": "benchmarks/gpu_check.py",
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "mode": mode,
        "mode_reason": reason or None,
        "argv": sys.argv[1:],
        "data_dir": str(data_dir) if data_dir else None,
        "work_dir": str(work),
        "sizes": sizes,
        "thread_env": thread_env,
        "versions": None,
        "device": None,
        "steps": {},
        "goals": ctx["goals"],
    }
    path = out / RESULT_FILE
    for index in wanted:
        name = STEP_NAMES[index]
        say(f"\n== step {index}: {name}" if index else f"== step 0: {name}")
        t0 = time.perf_counter()
        if torch_error is not None and index != 0:
            rec = {"passed": False, "error": f"torch does not import: {torch_error}"}
        else:
            try:
                rec = STEPS[index](ctx)
            except Exception as exc:  # noqa: BLE001 - recorded; the next step still runs
                rec = {
                    "passed": False,
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-4000:],
                }
        rec = {"step": index, "name": name, **rec, "wall_s": round(time.perf_counter() - t0, 3)}
        report["steps"][name] = rec
        if index == 0:
            v = ctx.get("versions") or {}
            report["versions"] = {
                k: v.get(k)
                for k in ("torch", "cuda", "cudnn", "driver", "driver_source", "python", "numpy", "git_commit")
            }
            report["device"] = {
                "mode": mode,
                "gpus": v.get("gpus"),
                "gpu_count": v.get("gpu_count"),
                "cpu_count": v.get("cpu_count"),
                "platform": v.get("platform"),
            }
        say(
            f"-- step {index} {name}: {'PASS' if rec['passed'] else 'FAIL'} ({rec['wall_s']:.1f} s)"
            + (f": {rec['error']}" if rec.get("error") else "")
        )
        failed = [n for n, r in report["steps"].items() if not r.get("passed")]
        report.update({"failed_steps": failed, "passed": not failed, "wall_s": round(time.perf_counter() - started, 3)})
        write_json(path, report)
    say(
        f"\n{'ALL STEPS PASSED' if report['passed'] else 'FAILED: ' + ', '.join(report['failed_steps'])} "
        f"({mode}, {report['wall_s']:.1f} s) -> {path}"
    )
    for goal, met in ctx["goals"].items():
        say(f"goal {goal}: {'met' if met else 'MISSED'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
