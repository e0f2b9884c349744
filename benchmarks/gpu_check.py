"""GPU check: drive the modelling core (probes -> predictors -> policies) on one device, in
this process, and record what works.

    PYTHONPATH=. python3 benchmarks/gpu_check.py [--device cuda|cpu] [--out PATH] [--quick]
    make gpu-check                       # the same, device chosen by the script

Written for a lent machine with one H100/H200, no network and a bare `python3` (PyTorch + CUDA,
NumPy, SciPy, scikit-learn, pandas, PyYAML; no Ray, MLflow or fbgemm-gpu, the project not
installed): nothing here imports Ray or MLflow (`imported_ray` / `imported_mlflow` in the JSON
say so), and a step whose dependency is missing is *skipped* with the reason, not failed.

Steps (each in its own try/except: a failure is recorded with the traceback's last lines and the
rest still run):
  1. device_info      torch / CUDA / NCCL versions, device, memory, capability, TF32 settings,
                      the hardware fingerprint (orchestrator/cluster.py imports no Ray)
  2. probe_*          GEMM (float32, bfloat16, float16; mm/addmm/bmm/baddbmm), element-wise and
                      norm ops, memcpy (every direction the device allows), FBGEMM TBE
  3. collectives      a world-1 process group (NCCL on cuda, gloo on cpu; FileStore): all five
                      collectives at a few sizes; the NCCL choice probe (forced algorithm and
                      protocol over fresh communicators; NCCL only); overlap pairs (they need
                      world >= 2: skipped)
  4. training_*       the transformer and DLRM training probes at world 1, as calibration runs
                      them (`probes.training.run_training_probe`)
  5. calibration      a short GEMM / element-wise / memcpy sweep in a time budget, fitted with
                      `fit_performance_model`; held-out GMAE per op
  6. timing           `time_callable` vs torch.profiler on a ~5 us and a ~5 ms kernel (CUDA:
                      kernel device time, pass within 15%; CPU: reported only)
  7. fusion           fusion widths 1, 2, 4 of the PointNet workload, the fitted width model and
                      the width policy's choice

Writes benchmarks/results/gpu_check_<device-slug>.json (after every step, so a run cut short
still leaves what it did; the step under way is marked "running"). Exit code 0 when no step
failed, 1 otherwise (skipped is not failed).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import faulthandler
import inspect
import json
import math
import os
import platform
import re
import socket
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from orchestrator.cluster import cpu_model, total_memory_bytes  # noqa: E402  (stdlib only: no Ray on a GPU check box)

PASSED, FAILED, SKIPPED, RUNNING = "passed", "failed", "skipped", "running"
TRACEBACK_LINES = 12
US, MS = 1e-6, 1e-3


class StepSkipped(Exception):
    """Raised by a step that cannot run here (a missing dependency, an unsupported setup)."""


# --- small helpers ---------------------------------------------------------------------------


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia_h100_80gb_hbm3'."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "device"


def fbgemm_status() -> tuple[bool, str]:
    """(importable, version or the import error)."""
    try:
        import fbgemm_gpu  # noqa: F401
    except Exception as exc:  # ImportError, or an OSError from a library that does not load
        return False, f"import fbgemm_gpu failed: {type(exc).__name__}: {exc}"
    return True, str(getattr(sys.modules["fbgemm_gpu"], "__version__", "unknown"))


def ensure_psutil() -> bool:
    """probes/fusion.py imports psutil (its CPU memory watch); a bare python3 may lack it.
    Install a /proc-based stand-in for `psutil.Process().memory_info().rss` in that case (the
    CUDA path never calls it). Returns whether the stand-in was installed."""
    try:
        import psutil  # noqa: F401

        return False
    except ImportError:
        pass
    shim = types.ModuleType("psutil")

    class _MemoryInfo:
        def __init__(self, rss: int) -> None:
            self.rss = rss

    class Process:
        def memory_info(self) -> _MemoryInfo:
            pages = int(Path("/proc/self/statm").read_text().split()[1])
            return _MemoryInfo(pages * os.sysconf("SC_PAGE_SIZE"))

    shim.Process = Process  # type: ignore[attr-defined]
    shim.__gpu_check_shim__ = True  # type: ignore[attr-defined]
    sys.modules["psutil"] = shim
    return True


def call_supported(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call `fn` with only the keyword arguments its signature accepts (probe signatures move)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(*args, **kwargs)
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return fn(*args, **kwargs)
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _round(value: Any, digits: int = 4) -> Any:
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: _round(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_round(v, digits) for v in value]
    return value


# --- the step runner -------------------------------------------------------------------------


class Check:
    def __init__(self, args: argparse.Namespace, device: torch.device, out: Path) -> None:
        self.args, self.device, self.out = args, device, out
        self.steps: list[dict[str, Any]] = []
        self.device_info: dict[str, Any] = {}
        self.started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")

    def run(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        record: dict[str, Any] = {"name": name, "status": RUNNING, "seconds": 0.0, "figures": {}, "error": None}
        self.steps.append(record)
        self.write()  # a run killed inside this step still says which step it was
        t0 = time.perf_counter()
        if self.args.step_timeout_s > 0:  # a hung step (an NCCL wait) at least says where it hangs
            faulthandler.dump_traceback_later(self.args.step_timeout_s, repeat=True)
        try:
            record["figures"] = _round(fn() or {})
            record["status"] = PASSED
        except StepSkipped as exc:
            record["status"], record["error"] = SKIPPED, str(exc)
        except Exception as exc:  # noqa: BLE001 - a failed step is recorded, the rest still run
            lines = traceback.format_exc().rstrip().splitlines()
            record["status"] = FAILED
            record["error"] = "\n".join(lines[-TRACEBACK_LINES:]) if lines else f"{type(exc).__name__}: {exc}"
            partial = getattr(exc, "figures", None)
            if isinstance(partial, dict):
                record["figures"] = _round(partial)
        finally:
            faulthandler.cancel_dump_traceback_later()
        record["seconds"] = round(time.perf_counter() - t0, 2)
        self.write()
        print(f"[gpu-check] {name:<22} {record['status']:<8} {record['seconds']:7.1f} s  {summary(record)}", flush=True)
        return record

    def failed(self) -> list[str]:
        return [s["name"] for s in self.steps if s["status"] == FAILED]

    def document(self) -> dict[str, Any]:
        counts = {k: sum(s["status"] == k for s in self.steps) for k in (PASSED, FAILED, SKIPPED, RUNNING)}
        return {
            "script": "benchmarks/gpu_check.py",
            "timestamp": self.started,
            "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "args": {"device": self.device.type, "quick": bool(self.args.quick), "budget_s": self.args.budget_s},
            "device": self.device_info,
            "steps": self.steps,
            "summary": counts,
            # a None entry is a blocked import (a test does that), not a loaded module
            "imported_ray": sys.modules.get("ray") is not None,
            "imported_mlflow": sys.modules.get("mlflow") is not None,
            "imported_orchestrator": sorted(
                m
                for m, mod in sys.modules.items()
                if mod is not None and (m == "orchestrator" or m.startswith("orchestrator."))
            ),
        }

    def write(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_name(self.out.name + ".tmp")
        tmp.write_text(json.dumps(self.document(), indent=1, sort_keys=False, default=str))
        tmp.replace(self.out)


def summary(record: dict[str, Any]) -> str:
    if record["status"] in (FAILED, SKIPPED):
        lines = (record["error"] or "").strip().splitlines()
        return (lines[-1] if lines else "")[:110]
    return str(record["figures"].get("summary", ""))[:110]


# --- 1. device info --------------------------------------------------------------------------


def step_device_info(check: Check) -> dict[str, Any]:
    device = check.device
    info: dict[str, Any] = {
        "kind": device.type,
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cpu_count": os.cpu_count(),
        "distributed": dist.is_available(),
        "gloo": dist.is_available() and dist.is_gloo_available(),
        "nccl_available": dist.is_available() and dist.is_nccl_available(),
        # collective ops the probes call; a PyTorch without them fails the collective step
        "has_all_gather_single": hasattr(dist, "all_gather_single"),
        "has_reduce_scatter_single": hasattr(dist, "reduce_scatter_single"),
    }
    ok, fb = fbgemm_status()
    info["fbgemm_gpu"] = fb if ok else None
    if not ok:
        info["fbgemm_gpu_error"] = fb
    tf32: dict[str, Any] = {}
    for label, getter in (
        ("float32_matmul_precision", lambda: torch.get_float32_matmul_precision()),
        ("cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
        ("cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32),
        ("cuda.matmul.fp32_precision", lambda: torch.backends.cuda.matmul.fp32_precision),
        ("cudnn.fp32_precision", lambda: torch.backends.cudnn.fp32_precision),
    ):
        try:
            with _quiet_warnings():
                tf32[label] = getter()
        except Exception as exc:  # noqa: BLE001 - an attribute a PyTorch version lacks
            tf32[label] = f"n/a ({type(exc).__name__})"
    info["tf32"] = tf32
    if device.type == "cuda":
        if not torch.cuda.is_available():
            check.device_info = info
            raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
        torch.cuda.set_device(device)
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        info.update(
            {
                "name": props.name,
                "slug": device_slug(props.name),
                "memory_bytes": int(props.total_memory),
                "memory_free_bytes": int(free),
                "capability": f"{props.major}.{props.minor}",
                "multiprocessors": int(props.multi_processor_count),
                "device_count": torch.cuda.device_count(),
                "cudnn": torch.backends.cudnn.version(),
            }
        )
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as exc:  # noqa: BLE001
            info["nccl"] = f"n/a ({type(exc).__name__}: {exc})"
    else:
        info.update(
            {
                "name": "cpu",
                "slug": "cpu",
                "memory_bytes": total_memory_bytes(),
                "cpu_model": cpu_model(),
                "threads": torch.get_num_threads(),
            }
        )
    # The project's fingerprint: orchestrator/cluster.py imports Ray only inside
    # cluster_fingerprint(), so the local node's fingerprint is Ray-free (pynvml optional).
    try:
        from orchestrator.cluster import HardwareFingerprint, local_node_fingerprint

        node = local_node_fingerprint()
        info["fingerprint_devices"] = [f"{d.kind}:{d.name}" for d in node.devices][:8]
        info["software"] = node.software
        fp_kind = node.device_kind
        if fp_kind == device.type:
            info["hardware_id"] = HardwareFingerprint([node]).hardware_id
        else:  # e.g. no pynvml on a GPU machine: NVML saw no GPU, so the fingerprint lists CPUs
            info["hardware_id"] = f"{info['slug']}-gpucheck"
            info["fingerprint_note"] = f"fingerprint saw {fp_kind} devices (pynvml missing?); hardware_id from torch"
    except Exception as exc:  # noqa: BLE001
        info["hardware_id"] = f"{info['slug']}-gpucheck"
        info["fingerprint_error"] = f"{type(exc).__name__}: {exc}"
    check.device_info = info
    mem = info.get("memory_bytes") or 0
    return {
        **info,
        "summary": f"{info['name']} {mem / 2**30:.0f} GiB, torch {info['torch']}, "
        f"cuda {info['cuda_runtime']}, nccl {info.get('nccl', '-')}",
    }


@contextlib.contextmanager
def _quiet_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# --- 2. probe families -----------------------------------------------------------------------


def step_probe_gemm(check: Check) -> dict[str, Any]:
    from probes.gemm import measure_gemm
    from probes.vocabulary.ops import GEMM_VARIANTS

    cuda = check.device.type == "cuda"
    secs = 0.2 if check.args.quick else 0.5
    out: dict[str, Any] = {}
    errors: list[str] = []
    for dtype in ("float32", "bfloat16", "float16"):
        # CPUs emulate reduced precision (~50x below float32): keep those shapes small there
        size = 2048 if cuda else (256 if dtype == "float32" else 96)
        for variant in GEMM_VARIANTS:
            batch = 8 if variant in ("bmm", "baddbmm") else 1
            try:
                m = measure_gemm(
                    size, size, size, dtype, device=check.device, max_seconds=secs, variant=variant, batch=batch
                )
                out[f"{variant}.{dtype}"] = {
                    "shape": f"{batch}x{size}^3",
                    "us": m.median_s / US,
                    "tflops": m.params["flops"] / m.median_s / 1e12,
                    "repeats": m.repeats,
                }
            except Exception as exc:  # noqa: BLE001 - one dtype/variant failing is reported with the rest
                errors.append(f"{variant}.{dtype}: {type(exc).__name__}: {exc}")
    # a linear layer's products, labelled as the job sweep labels them
    from probes.vocabulary.ops import PRODUCTS, linear_layer_gemms

    for product, (m_, n_, k_) in zip(
        PRODUCTS, linear_layer_gemms(512 if cuda else 64, 1024 if cuda else 128, 1024 if cuda else 128)
    ):
        m = measure_gemm(m_, n_, k_, "float32", device=check.device, max_seconds=secs, product=product)
        out[f"linear.{product}"] = {"shape": f"{m_}x{n_}x{k_}", "us": m.median_s / US}
    figures = {"points": out, "errors": errors}
    if errors:
        raise _with_figures(RuntimeError(f"{len(errors)} GEMM point(s) failed: {errors[0]}"), figures)
    best = {
        d: max(v["tflops"] for k, v in out.items() if k.endswith("." + d)) for d in ("float32", "bfloat16", "float16")
    }
    figures["summary"] = "peak TFLOP/s " + ", ".join(f"{d} {t:.3g}" for d, t in best.items())
    return figures


def _with_figures(exc: Exception, figures: dict[str, Any]) -> Exception:
    exc.figures = figures  # type: ignore[attr-defined]
    return exc


def step_probe_elementwise(check: Check) -> dict[str, Any]:
    from probes.elementwise import measure_elementwise
    from probes.vocabulary.ops import ELEMENTWISE_OPS

    cuda = check.device.type == "cuda"
    rows, cols = (8192, 1024) if cuda else (256, 256)
    secs = 0.2 if check.args.quick else 0.5
    out = {}
    for op in ELEMENTWISE_OPS:
        m = measure_elementwise(op, rows, cols, device=check.device, max_seconds=secs)
        out[op] = {"us": m.median_s / US, "gb_s": m.params["bytes"] / m.median_s / 1e9}
    best = max(out.items(), key=lambda kv: kv[1]["gb_s"])
    return {
        "shape": f"{rows}x{cols}",
        "points": out,
        "summary": f"{len(out)} ops at {rows}x{cols}; best {best[0]} {best[1]['gb_s']:.3g} GB/s",
    }


def step_probe_memcpy(check: Check) -> dict[str, Any]:
    from probes.memcpy import measure_memcpy
    from probes.vocabulary.ops import memcpy_directions

    cuda = check.device.type == "cuda"
    sizes = (64 * 2**10, 64 * 2**20) if cuda else (64 * 2**10, 4 * 2**20)
    secs = 0.2 if check.args.quick else 0.5
    out = {}
    for direction in memcpy_directions(check.device.type):
        for nbytes in sizes:
            m = measure_memcpy(direction, nbytes, device=check.device, max_seconds=secs)
            out[f"{direction}.{nbytes}"] = {"us": m.median_s / US, "gb_s": nbytes / m.median_s / 1e9}
    big = {d: out[f"{d}.{sizes[-1]}"]["gb_s"] for d in memcpy_directions(check.device.type)}
    return {
        "points": out,
        "directions": list(memcpy_directions(check.device.type)),
        "summary": f"{sizes[-1] >> 20} MiB: " + ", ".join(f"{d} {g:.3g} GB/s" for d, g in big.items()),
    }


def step_probe_embedding(check: Check) -> dict[str, Any]:
    ok, why = fbgemm_status()
    if not ok:
        raise StepSkipped(f"FBGEMM TBE needs fbgemm-gpu: {why}")
    from probes.embedding import measure_tbe
    from probes.vocabulary.indices import Distribution
    from probes.vocabulary.jobspec import TableShape

    cuda = check.device.type == "cuda"
    zipf = Distribution.parse({"zipf": 1.05})
    if cuda:
        sets = {
            "uniform_2x100k_d64": ([TableShape(100_000, 64, 8), TableShape(100_000, 64, 8)], 2048),
            "zipf_4x50k_d128": ([TableShape(50_000, 128, 16, zipf) for _ in range(4)], 4096),
        }
    else:
        sets = {
            "uniform_2x10k_d16": ([TableShape(10_000, 16, 4), TableShape(10_000, 16, 4)], 256),
            "zipf_2x5k_d32": ([TableShape(5_000, 32, 4, zipf) for _ in range(2)], 256),
        }
    secs = 0.3 if check.args.quick else 0.8
    out = {}
    for name, (tables, batch) in sets.items():
        rows = measure_tbe(tables, batch, device=check.device, max_seconds=secs)
        out[name] = {r.op: r.median_s / US for r in rows}
    first = next(iter(out.values()))
    return {
        "points_us": out,
        "fbgemm_gpu": why,
        "summary": f"{len(out)} table sets; fwd {first['embedding_fwd']:.0f} us, bwd {first['embedding_bwd']:.0f} us",
    }


# --- 3./4. the world-1 process group ---------------------------------------------------------


class ProcessGroup:
    """A world-of-one default group (NCCL on cuda, gloo on cpu) over a FileStore."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        self.tmp: tempfile.TemporaryDirectory | None = None
        self.error: str | None = None

    def start(self) -> None:
        if dist.is_initialized():
            return
        self.tmp = tempfile.TemporaryDirectory(prefix="gpu-check-pg-")
        store = dist.FileStore(os.path.join(self.tmp.name, "store"), 1)
        kwargs: dict[str, Any] = {"store": store, "rank": 0, "world_size": 1}
        if self.device.type == "cuda":
            kwargs["device_id"] = torch.device("cuda", torch.cuda.current_device())
        try:
            dist.init_process_group(self.backend, **kwargs)
        except TypeError:  # a PyTorch without device_id
            kwargs.pop("device_id", None)
            dist.init_process_group(self.backend, **kwargs)

    def stop(self) -> dict[str, Any]:
        from probes.collective import forget_groups

        if dist.is_initialized():
            forget_groups()
            dist.destroy_process_group()
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None
        return {"initialized_after": dist.is_initialized()}


def step_collectives(check: Check, pg: ProcessGroup) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        pg.start()
    except Exception as exc:
        pg.error = f"{type(exc).__name__}: {exc}"
        raise
    init_s = time.perf_counter() - t0
    from probes.collective import CollectivePoint, measure_collectives
    from probes.vocabulary.ops import COLLECTIVE_OPS

    cuda = check.device.type == "cuda"
    sizes = [4 * 2**10, 2**20, 64 * 2**20] if cuda else [4 * 2**10, 256 * 2**10, 4 * 2**20]
    if check.args.quick:
        sizes = sizes[:2] + ([sizes[2] // 4] if cuda else [])
    points = [CollectivePoint(op, size) for op in COLLECTIVE_OPS for size in sizes]
    points.append(CollectivePoint("all_to_all", sizes[1], uneven=True))
    target = 0.02 if check.args.quick else 0.05
    rows = measure_collectives(points, device=check.device, target_s=target, windows=3)
    if len(rows) != len(points):
        raise RuntimeError(f"measure_collectives returned {len(rows)} rows for {len(points)} points")
    out = {}
    for r in rows:
        key = f"{r.op}{'-uneven' if r.params.get('uneven') else ''}.{r.params['bytes']}"
        out[key] = {"us": r.median_s / US, "alg_gb_s": r.extra["alg_bw"] / 1e9, "world": r.world_size}
    ops = sorted({r.op for r in rows})
    missing = sorted(set(COLLECTIVE_OPS) - set(ops))
    if missing:
        raise RuntimeError(f"no rows for {missing}")
    return {
        "backend": pg.backend,
        "world_size": dist.get_world_size(),
        "init_s": init_s,
        "points": out,
        "summary": f"{pg.backend} world 1: {len(rows)} points, ops {', '.join(ops)}",
    }


def step_nccl_choice(check: Check, pg: ProcessGroup) -> dict[str, Any]:
    """The NCCL choice probe at world 1: each pair's batch over a fresh communicator created
    with NCCL_ALGO / NCCL_PROTO set, the variables restored after. (At one rank NCCL runs a
    copy whatever the pair: this checks the path, not a choice; run with NCCL_DEBUG=INFO
    NCCL_DEBUG_SUBSYS=ENV to see each communicator read the forced pair.)"""
    _need_group(pg)
    if pg.backend != "nccl":
        raise StepSkipped("NCCL choices need an NCCL group (a CUDA device)")
    from probes.nccl_choice import ENV_KEYS, PROBE, nccl_choice_specs
    from probes.vocabulary.placement import RankPlacement

    before = {k: os.environ.get(k) for k in ENV_KEYS}
    specs = nccl_choice_specs([(0,)], max_bytes=64 * 2**10, step=64)
    pairs = {("auto", "auto"), ("ring", "ll"), ("tree", "simple")}
    specs = [PROBE.placed(s, RankPlacement((0,))) for s in specs if s.params["op"] == "all_reduce"]
    specs = [s for s in specs if (s.params["algo"], s.params["proto"]) in pairs]
    out: dict[str, Any] = {}
    for pair in sorted(pairs):
        batch = [s for s in specs if (s.params["algo"], s.params["proto"]) == pair]
        rows = PROBE.run(batch, str(check.device), {"target_s": 0.02, "windows": 3})
        if len(rows) != len(batch) or any(r.family != "nccl_choice" for r in rows):
            raise RuntimeError(f"{pair}: {len(rows)} nccl_choice rows for {len(batch)} points")
        out["/".join(pair)] = {str(r.params["bytes"]): r.median_s / US for r in rows}
    after = {k: os.environ.get(k) for k in ENV_KEYS}
    if after != before:
        raise RuntimeError(f"NCCL variables not restored: {before} -> {after}")
    return {
        "points_us": out,
        "env_restored": True,
        "summary": f"{len(out)} pairs x {len(next(iter(out.values())))} sizes over fresh communicators",
    }


def _need_group(pg: ProcessGroup) -> None:
    if not dist.is_initialized():
        raise RuntimeError(f"no process group ({pg.backend}): {pg.error or 'not initialised'}")


def step_overlap(check: Check, pg: ProcessGroup) -> dict[str, Any]:
    _need_group(pg)
    from probes.overlap import measure_pair
    from probes.vocabulary.pairs import PairPoint

    world = dist.get_world_size()
    try:
        point = PairPoint("gemm_all_reduce", 256, 256, 256, world=world)
    except ValueError as exc:
        raise StepSkipped(f"overlap pairs at world {world}: {exc}") from None
    rows = call_supported(measure_pair, point, slices=(2, 4), rounds=3, repeats=3, group=None, device=check.device)
    out = {f"{r.op}.k{r.params.get('k')}": r.median_s / US for r in rows}
    return {"points_us": out, "summary": f"{len(rows)} forms of gemm_all_reduce at world {world}"}


def step_training_transformer(check: Check, pg: ProcessGroup) -> dict[str, Any]:
    _need_group(pg)
    from probes.probe import ProbeSpec
    from probes.training import run_training_probe

    cuda = check.device.type == "cuda"
    spec = {
        "layers": 2,
        "hidden": 512 if cuda else 64,
        "heads": 8 if cuda else 4,
        "seq_len": 256 if cuda else 32,
        "batch_size": 8 if cuda else 2,
        "world_size": dist.get_world_size(),
        "tensor_parallel": 1,
        "dropout": 0.1,
        "seed": 0,
        "name": "gpu-check-transformer",
    }
    iterations = 4 if check.args.quick else 10
    rows = run_training_probe(
        ProbeSpec("training", {"transformer": spec}, "gpu-check"), str(check.device), iterations=iterations, warmup=2
    )
    return _training_figures(rows, "transformer_step", spec)


def step_training_dlrm(check: Check, pg: ProcessGroup) -> dict[str, Any]:
    ok, why = fbgemm_status()
    if not ok:
        raise StepSkipped(f"the DLRM workload's TBEs need fbgemm-gpu: {why}")
    _need_group(pg)
    from probes.probe import ProbeSpec
    from probes.training import run_training_probe, training_specs

    world = dist.get_world_size()
    spec = training_specs(1, seed=0, world=world)[0]  # the small random DLRM the calibration starts with
    if check.device.type == "cuda":  # a production-ish batch, so the GPU does some work
        spec = ProbeSpec(spec.family, {**spec.params, "job": {**spec.params["job"], "batch_size": 2048}}, spec.key)
    iterations = 4 if check.args.quick else 10
    rows = run_training_probe(spec, str(check.device), iterations=iterations, warmup=2)
    return _training_figures(
        rows, "dlrm_step", {"tables": len(spec.params["job"]["tables"]), "batch_size": spec.params["job"]["batch_size"]}
    )


def _training_figures(rows: list, step_op: str, spec: dict[str, Any]) -> dict[str, Any]:
    steps = [r for r in rows if r.op == step_op]
    if not steps:
        raise RuntimeError(f"no {step_op} row among {sorted({r.op for r in rows})}")
    by_op: dict[str, int] = {}
    for r in rows:
        by_op[r.op] = by_op.get(r.op, 0) + 1
    step = steps[0]
    return {
        "step_ms": step.median_s / MS,
        "iqr_ms": step.spread_s / MS,
        "iterations": step.repeats,
        "rows_per_op": by_op,
        "spec": spec,
        "summary": f"{step_op} {step.median_s / MS:.2f} ms/iter; rows {sum(by_op.values())} "
        f"({by_op.get('cpu_overhead', 0)} overhead, {by_op.get('in_context', 0)} in-context)",
    }


# --- 5. calibration --------------------------------------------------------------------------


CALIBRATION_ELEMENTWISE = ("add", "gelu", "layer_norm", "softmax")


def step_calibration(check: Check) -> dict[str, Any]:
    from predictors.fit import fit_performance_model
    from probes.elementwise import elementwise_specs
    from probes.gemm import gemm_specs
    from probes.memcpy import memcpy_specs
    from probes.sweep import interleave, run_local_probe

    cuda = check.device.type == "cuda"
    kind = check.device.type
    budget = check.args.budget_s if check.args.budget_s is not None else (30.0 if check.args.quick else 120.0)
    max_points = 150
    seed = 7
    gemm = gemm_specs(60, seed, max_dim=2048 if cuda else 384, device_kind=kind)
    # four element-wise ops (streaming, row op, backward-free) so each gets enough rows to fit
    ew = [
        s
        for s in elementwise_specs(
            60 * 13 // len(CALIBRATION_ELEMENTWISE) + 13, seed, max_numel=(16 if cuda else 1) * 2**20
        )
        if s.params["op"] in CALIBRATION_ELEMENTWISE
    ][:60]
    mem = memcpy_specs(30, seed, device_kind=kind, max_bytes=(256 if cuda else 16) * 2**20)
    specs = interleave(gemm, ew, mem)[:max_points]
    rows, failures = [], []
    t0 = time.perf_counter()
    for spec in specs:
        if time.perf_counter() - t0 > budget:
            break
        try:
            rows.extend(run_local_probe(spec, device=str(check.device)))
        except Exception as exc:  # noqa: BLE001 - a failed point is recorded, as calibration does
            failures.append(f"{spec.key}: {type(exc).__name__}: {exc}")
    measure_s = time.perf_counter() - t0
    if not rows:
        raise RuntimeError(f"no point measured; failures: {failures[:3]}")
    hardware_id = str(check.device_info.get("hardware_id") or f"{check.device_info.get('slug', kind)}-gpucheck")
    t1 = time.perf_counter()
    model, held_out = fit_performance_model(rows, hardware_id, seed=0)
    fit_s = time.perf_counter() - t1
    per_op = {}
    for op, m in sorted(model.metrics.items()):
        per_op[op] = {
            "gmae": m.get("gmae"),
            "mape": m.get("mape"),
            "n_test": m.get("n"),
            "n_train": m.get("n_train"),
            "baseline_gmae": m.get("baseline_gmae"),
        }
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.op] = counts.get(r.op, 0) + 1
    figures = {
        "budget_s": budget,
        "measure_s": measure_s,
        "fit_s": fit_s,
        "points": len(rows),
        "rows_per_op": counts,
        "failed_points": failures[:10],
        "n_failed": len(failures),
        "held_out": per_op,
        "unfitted": model.meta.get("unfitted", {}),
        "hardware_id": hardware_id,
        "n_held_out": len(held_out),
    }
    if not model.models:
        raise _with_figures(RuntimeError(f"no op could be fitted: {model.meta.get('unfitted')}"), figures)
    scored = {op: v["gmae"] for op, v in per_op.items() if v["gmae"] is not None and math.isfinite(v["gmae"])}
    figures["summary"] = f"{len(rows)} points in {measure_s:.0f} s; GMAE " + ", ".join(
        f"{op} {100 * g:.0f}%" for op, g in sorted(scored.items())
    )
    return figures


# --- 6. timing vs the profiler ---------------------------------------------------------------


TIMING_TOLERANCE = 0.15


def profiled_per_call(fn: Callable[[], object], device: torch.device, calls: int = 30) -> dict[str, float]:
    """Median per-call time of `fn` under torch.profiler: on CUDA the device time of the kernels
    each call launched (kernels in start order, split evenly over the calls); on CPU the
    duration of each call's top-level ops (their total and self CPU time)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    for _ in range(3):
        fn()
    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        if cuda:  # the calls queue behind a spin and run back to back, as time_callable's do
            from probes.timing import CudaClock

            CudaClock(device).hide_launch(calls * 100e-6)
        for _ in range(calls):
            fn()
        sync(device)
    events = list(prof.events())
    if cuda:
        kernels = sorted(
            (e for e in events if e.device_type == DeviceType.CUDA and "spin_kernel" not in e.name),
            key=lambda e: e.time_range.start,
        )
        if not kernels:
            raise RuntimeError("the profiler recorded no CUDA kernel")
        durations = np.array([e.time_range.elapsed_us() for e in kernels], dtype=np.float64)
        if len(kernels) % calls == 0:
            per_call = durations.reshape(calls, -1).sum(axis=1)
            median = float(np.median(per_call))
        else:  # an odd kernel (a one-off workspace memset): fall back to the mean per call
            median = float(durations.sum() / calls)
        return {"median_s": median * US, "kernels_per_call": len(kernels) / calls, "kernel": kernels[0].name[:80]}
    top = [
        e for e in events if e.device_type == DeviceType.CPU and e.cpu_parent is None and e.name.startswith("aten::")
    ]
    if len(top) < calls:
        raise RuntimeError(f"the profiler recorded {len(top)} top-level ops for {calls} calls")
    per = len(top) // calls
    top = sorted(top, key=lambda e: e.time_range.start)[: per * calls]
    total = np.array([e.cpu_time_total for e in top], dtype=np.float64).reshape(calls, per).sum(axis=1)
    self_ = np.array([e.self_cpu_time_total for e in top], dtype=np.float64).reshape(calls, per).sum(axis=1)
    return {
        "median_s": float(np.median(total)) * US,
        "self_median_s": float(np.median(self_)) * US,
        "ops_per_call": per,
        "op": top[0].name,
    }


def _sized_add(numel: int, device: torch.device) -> Callable[[], object]:
    x, y = torch.randn(numel, device=device), torch.randn(numel, device=device)
    out = torch.empty_like(x)
    return lambda: torch.add(x, y, out=out)


def _sized_mm(n: int, device: torch.device) -> Callable[[], object]:
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    out = torch.empty(n, n, device=device)
    return lambda: torch.mm(a, b, out=out)


def _closest(sizing: list[tuple[int, float]], target: float) -> int:
    """The measured size whose time was closest to `target` (in log terms)."""
    return min(sizing, key=lambda st: abs(math.log(max(st[1], 1e-12) / target)))[0]


def _timing_details(t: Any) -> dict[str, Any]:
    """The optional fields a `Timing` carries in this version (method, L2 flush, ...)."""
    return {k: getattr(t, k) for k in ("method", "calls_per_sample", "l2_flushed", "exposed") if hasattr(t, k)}


def step_timing(check: Check) -> dict[str, Any]:
    from probes.timing import time_callable

    device = check.device
    cuda = device.type == "cuda"

    # The profiler sees calls back to back (operands warm in L2); a time_callable that flushes L2
    # before every sample (`flush_l2`, where this version has it) is compared with it unflushed,
    # like for like, and its default (flushed) figure is reported beside.
    has_flush = "flush_l2" in inspect.signature(time_callable).parameters
    warm = {"flush_l2": False} if has_flush else {}

    def quick_time(fn: Callable[[], object]) -> float:
        return time_callable(
            fn, device=device, warmup=2, min_repeats=5, max_repeats=9, max_seconds=0.3, **warm
        ).median_s

    # ~5 us: sized by what the device reports (on CUDA the kernel's own time: time_callable's
    # clock is what is being checked, so it must not pick the size)
    small_target, numel = 5 * US, (2**20 if cuda else 2048)
    small_sizing = []
    for _ in range(5):
        fn = _sized_add(numel, device)
        t = profiled_per_call(fn, device, calls=20)["median_s"] if cuda else quick_time(fn)
        small_sizing.append((numel, t / US))
        if 0.8 * small_target <= t <= 1.25 * small_target:
            break
        numel = int(min(2**26, max(256, numel * small_target / max(t, 1e-9))))
    numel = _closest(small_sizing, small_target / US)  # the last resize may not have been measured
    # ~5 ms: a float32 GEMM grown until it takes about that long
    big_target, n = 5 * MS, (2048 if cuda else 256)
    big_sizing = []
    for _ in range(6):
        fn = _sized_mm(n, device)
        t = quick_time(fn)
        big_sizing.append((n, t / MS))
        if 0.8 * big_target <= t <= 1.25 * big_target:
            break
        n = int(min(16384, max(64, round(n * (big_target / max(t, 1e-9)) ** (1 / 3) / 16) * 16)))
        del fn
    n = _closest(big_sizing, big_target / MS)
    out: dict[str, Any] = {
        "sizing_small_numel_us": small_sizing,
        "sizing_big_n_ms": big_sizing,
        "tolerance": TIMING_TOLERANCE,
        "compared_unflushed": has_flush,
        "reference": "CUDA kernel device time" if cuda else "CPU time of top-level ops",
    }
    verdicts = []
    for label, fn, shape in (("small_add", _sized_add(numel, device), numel), ("big_mm", _sized_mm(n, device), n)):
        timed = time_callable(fn, device=device, **warm)
        prof = profiled_per_call(fn, device, calls=50 if label == "small_add" else 20)
        rel = timed.median_s / prof["median_s"] - 1.0
        within = abs(rel) <= TIMING_TOLERANCE
        verdicts.append(within)
        out[label] = {
            "size": shape,
            "time_callable_us": timed.median_s / US,
            "profiler_us": prof["median_s"] / US,
            "rel_diff": rel,
            "within_tolerance": within,
            "repeats": timed.repeats,
            **_timing_details(timed),
            **{k: v for k, v in prof.items() if k != "median_s"},
        }
        if has_flush and cuda:  # what the probes record by default: L2 flushed before every sample
            cold = time_callable(fn, device=device)
            out[label]["default_flushed"] = {
                "time_callable_us": cold.median_s / US,
                "vs_profiler": cold.median_s / prof["median_s"] - 1.0,
                **_timing_details(cold),
            }
    out["summary"] = "; ".join(
        f"{k} {out[k]['time_callable_us']:.1f} vs {out[k]['profiler_us']:.1f} us ({100 * out[k]['rel_diff']:+.0f}%)"
        for k in ("small_add", "big_mm")
    )
    if cuda and not all(verdicts):
        raise _with_figures(
            RuntimeError(
                f"time_callable differs from the profiler by more than {TIMING_TOLERANCE:.0%}: {out['summary']}"
            ),
            out,
        )
    if not cuda:
        out["note"] = "CPU: reported only (the profiler's own overhead is of the order of a 5 us op)"
    return out


# --- 7. fusion -------------------------------------------------------------------------------


def step_fusion(check: Check) -> dict[str, Any]:
    shim = ensure_psutil()
    from predictors.fusion_model import FusionModel, FusionPoint
    from probes.fusion import measure_fusion_width

    workload, widths = "pointnet", (1, 2, 4)
    secs = 0.5 if check.args.quick else 2.0
    points, out = [], {}
    for w in widths:
        m = measure_fusion_width(workload, w, device=check.device, max_seconds=secs, seed=0)
        points.append(FusionPoint(w, float(m.extra["samples_per_s"]), float(m.extra["peak_memory_bytes"])))
        out[f"width{w}"] = {
            "step_ms": m.median_s / MS,
            "samples_per_s": m.extra["samples_per_s"],
            "peak_memory_mib": m.extra["peak_memory_bytes"] / 2**20,
            "repeats": m.repeats,
        }
        batch_size, optimizer = int(m.params["batch_size"]), m.params["optimizer"]
    figures: dict[str, Any] = {"workload": workload, "widths": out, "psutil_shim": shim}
    model = FusionModel.fit(workload, batch_size, optimizer, points)
    figures["model"] = {
        "a": model.a,
        "b": model.b,
        "c": model.c,
        "fit_gmae": model.fit_gmae,
        "memory_intercept_mib": model.memory_intercept / 2**20,
        "memory_slope_mib": model.memory_slope / 2**20,
        "predicted_samples_per_s": {w: model.throughput(w) for w in (1, 2, 4, 8, 16)},
    }
    try:
        from policies.fusion_width import choose_width

        if check.device.type == "cuda":
            cap = 0.8 * torch.cuda.mem_get_info(check.device)[0]
        else:
            cap = 0.25 * (total_memory_bytes() or 2**33)
        decision = choose_width(model, cap, max_width=64)
        figures["policy"] = {
            "choice": decision.choice,
            "predicted_ms": decision.predicted_ms,
            "memory_cap_mib": cap / 2**20,
        }
    except Exception as exc:  # noqa: BLE001 - the policy is a bonus; the model is the step
        figures["policy_error"] = f"{type(exc).__name__}: {exc}"
    choice = figures.get("policy", {}).get("choice", "-")
    figures["summary"] = (
        f"{workload} samples/s "
        + ", ".join(f"w{w} {p.samples_per_s:.0f}" for w, p in zip(widths, points))
        + f"; fit GMAE {100 * model.fit_gmae:.1f}%; policy {choice}"
    )
    return figures


# --- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default=None, help="default: cuda when torch.cuda.is_available(), else cpu"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON path (default benchmarks/results/gpu_check_<device-slug>.json)"
    )
    parser.add_argument("--quick", action="store_true", help="short timings, a ~30 s calibration budget")
    parser.add_argument(
        "--budget-s", type=float, default=None, help="calibration measuring budget in seconds (default 120, --quick 30)"
    )
    parser.add_argument(
        "--step-timeout-s",
        type=float,
        default=300.0,
        help="dump every thread's stack to stderr each time a step runs this long (0: never)",
    )
    return parser.parse_args(argv)


def default_out(device: torch.device) -> Path:
    if device.type == "cuda" and torch.cuda.is_available():
        slug = device_slug(torch.cuda.get_device_name(device))
    else:
        slug = device.type
    return REPO / "benchmarks" / "results" / f"gpu_check_{slug}.json"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kind = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")
    out = args.out or default_out(device)
    check = Check(args, device, out)
    print(f"[gpu-check] device {kind}; writing {out}", flush=True)
    t0 = time.perf_counter()

    check.run("device_info", lambda: step_device_info(check))
    check.run("probe_gemm", lambda: step_probe_gemm(check))
    check.run("probe_elementwise", lambda: step_probe_elementwise(check))
    check.run("probe_memcpy", lambda: step_probe_memcpy(check))
    check.run("probe_embedding", lambda: step_probe_embedding(check))
    pg = ProcessGroup(device)
    try:
        check.run("collectives", lambda: step_collectives(check, pg))
        check.run("nccl_choice", lambda: step_nccl_choice(check, pg))
        check.run("overlap_pairs", lambda: step_overlap(check, pg))
        check.run("training_transformer", lambda: step_training_transformer(check, pg))
        check.run("training_dlrm", lambda: step_training_dlrm(check, pg))
    finally:
        check.run("process_group_teardown", pg.stop)
    check.run("calibration", lambda: step_calibration(check))
    check.run("timing", lambda: step_timing(check))
    check.run("fusion", lambda: step_fusion(check))
    check.write()

    print(f"\n{'step':<24}{'status':<9}{'seconds':>8}  detail")
    for s in check.steps:
        print(f"{s['name']:<24}{s['status']:<9}{s['seconds']:>8.1f}  {summary(s)}")
    doc = check.document()
    print(
        f"\n[gpu-check] {doc['summary'][PASSED]} passed, {doc['summary'][FAILED]} failed, "
        f"{doc['summary'][SKIPPED]} skipped in {time.perf_counter() - t0:.0f} s; imported ray: "
        f"{doc['imported_ray']}, mlflow: {doc['imported_mlflow']}; JSON {out}",
        flush=True,
    )
    return 1 if check.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
