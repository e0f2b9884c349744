"""The calibration-scaling benchmark end to end at a tiny size (its own Ray clusters, so a subprocess)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_calibration_scaling_benchmark_runs_on_one_two_and_three_nodes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1"}
    env.pop("RAY_ADDRESS", None)
    cmd = [
        sys.executable,
        str(REPO / "benchmarks/calibration_scaling.py"),
        "--local-points",
        "6",
        "--collective-points",
        "2",
        "--out-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [out] = tmp_path.glob("calibration_scaling_*.json")
    result = json.loads(out.read_text())
    assert out.name == f"calibration_scaling_{result['hardware_id']}.json"
    one, two, three = (result["configs"][name] for name in ("1_node", "2_nodes", "3_nodes"))
    assert [c["distinct_actor_nodes"] for c in (one, two, three)] == [1, 2, 3]
    for config in (one, two, three):
        assert (config["local"]["done"], config["local"]["failed"]) == (6, 0)
        assert config["local"]["s_per_measurement"] > 0
        # every row says how long its probe took, and the sweep took at least that per device
        assert config["local"]["probe_s"] > 0 and config["local"]["cost_ratio"] >= 1.0
    assert two["collective"]["done"] == 2 and two["collective"]["scopes"] == ["inter"]
    assert result["speedup_per_measurement"] > 0 and isinstance(result["not_slower"], bool)
