"""benchmarks/gpu_check.py on CPU: every step recorded, gloo collectives and the training probes
pass, no Ray or MLflow imported; and the same run as on a lent GPU machine's bare python3 (Ray,
MLflow, fbgemm-gpu and psutil unimportable), where the FBGEMM steps are skipped, not failed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
STEPS = [
    "device_info",
    "probe_gemm",
    "probe_elementwise",
    "probe_memcpy",
    "probe_embedding",
    "collectives",
    "nccl_choice",
    "overlap_pairs",
    "training_transformer",
    "training_dlrm",
    "process_group_teardown",
    "calibration",
    "timing",
    "fusion",
]
# What the lent machine lacks: a None entry in sys.modules makes `import name` raise ImportError.
BARE = ("ray", "mlflow", "fbgemm_gpu", "psutil")


def _run(out: Path, block: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, dict]:
    args = [str(SCRIPT), "--device", "cpu", "--quick", "--budget-s", "8", "--out", str(out)]
    if block:
        code = (
            "import runpy, sys\n"
            f"for name in {block!r}: sys.modules[name] = None\n"
            f"sys.argv = {args!r}\n"
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
        )
        cmd = [sys.executable, "-c", code]
    else:
        cmd = [sys.executable, *args]
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert out.exists(), f"no JSON written\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc, json.loads(out.read_text())


def _status(doc: dict) -> dict[str, str]:
    return {s["name"]: s["status"] for s in doc["steps"]}


def _check_common(proc: subprocess.CompletedProcess, doc: dict) -> dict[str, str]:
    status = _status(doc)
    failed = {s["name"]: s["error"] for s in doc["steps"] if s["status"] == "failed"}
    assert not failed and proc.returncode == 0, f"failed steps: {failed}\n{proc.stdout[-2000:]}"
    assert list(status) == STEPS
    for step in doc["steps"]:
        assert set(step) >= {"name", "status", "seconds", "figures", "error"}
        assert step["status"] in ("passed", "skipped")
    assert doc["device"]["kind"] == "cpu" and doc["device"]["slug"] == "cpu"
    assert doc["timestamp"] and doc["summary"]["failed"] == 0
    assert doc["imported_ray"] is False and doc["imported_mlflow"] is False
    # the Ray-free part of the orchestrator only (the fingerprint)
    assert set(doc["imported_orchestrator"]) <= {"orchestrator", "orchestrator.cluster"}

    figures = {s["name"]: s["figures"] for s in doc["steps"]}
    assert status["collectives"] == "passed" and figures["collectives"]["backend"] == "gloo"
    ops = {key.split(".")[0] for key in figures["collectives"]["points"]}
    assert ops >= {"all_reduce", "all_to_all", "all_gather", "reduce_scatter", "broadcast"}
    assert status["nccl_choice"] == "skipped" and "NCCL" in doc["steps"][STEPS.index("nccl_choice")]["error"]
    assert status["overlap_pairs"] == "skipped" and "world" in doc["steps"][STEPS.index("overlap_pairs")]["error"]
    assert status["training_transformer"] == "passed" and figures["training_transformer"]["step_ms"] > 0
    calib = figures["calibration"]
    assert status["calibration"] == "passed" and calib["points"] >= 10
    assert "gemm" in calib["held_out"] and calib["held_out"]["gemm"]["gmae"] is not None
    timing = figures["timing"]
    for kernel in ("small_add", "big_mm"):
        assert timing[kernel]["time_callable_us"] > 0 and timing[kernel]["profiler_us"] > 0
    assert status["fusion"] == "passed" and figures["fusion"]["model"]["a"] > 0
    return status


@pytest.mark.slow
def test_gpu_check_cpu(tmp_path):
    proc, doc = _run(tmp_path / "cpu.json")
    status = _check_common(proc, doc)
    # fbgemm-gpu-cpu is installed in the project's environment: the FBGEMM steps run
    assert status["probe_embedding"] == "passed" and status["training_dlrm"] == "passed"
    table = proc.stdout.split("\n\nstep ", 1)[-1]  # the final table: a row per step
    for name in STEPS:
        assert f"\n{name} " in table


@pytest.mark.slow
def test_gpu_check_bare_python(tmp_path):
    proc, doc = _run(tmp_path / "bare.json", block=BARE)
    status = _check_common(proc, doc)
    for name in ("probe_embedding", "training_dlrm"):
        step = doc["steps"][STEPS.index(name)]
        assert status[name] == "skipped" and "fbgemm" in step["error"]
    fusion = doc["steps"][STEPS.index("fusion")]["figures"]
    assert fusion["psutil_shim"] is True


def test_device_slug():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.device_slug("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3"
    assert module.device_slug("NVIDIA H200") == "nvidia_h200"
