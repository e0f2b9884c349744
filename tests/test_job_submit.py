"""`ray job submit --working-dir .` as the README writes it, against a local Ray head with its job
API: the command runs in Ray's temporary copy of the working directory, so what it keeps
(calibration, plan, the MLflow store that holds its lock) must land under `AUTOTUNE_HOME`,
and nothing in the copy."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_e2e import cli_env, last_json


@pytest.fixture()
def head_with_job_api():
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()  # this process does not join; the submitted job does
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": True, "dashboard_port": 0})
    try:
        url = c.head_node.address_info["webui_url"]
        yield url if url.startswith("http") else f"http://{url}"
    finally:
        c.shutdown()


@pytest.mark.slow
def test_a_submitted_autotune_keeps_its_state_under_autotune_home(tmp_path, tiny_job_dict, head_with_job_api):
    work, home = tmp_path / "work", tmp_path / "state"
    work.mkdir()
    (work / "tiny.yaml").write_text(yaml.safe_dump(tiny_job_dict))
    runtime_env = {"env_vars": {"AUTOTUNE_HOME": str(home), "TQDM_DISABLE": "1"}}
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("ray")),
            "job",
            "submit",
            "--address",
            head_with_job_api,
            "--working-dir",
            ".",
            "--runtime-env-json",
            json.dumps(runtime_env),
            "--",
            sys.executable,
            "-m",
            "orchestrator.autotune",
            "--job",
            "tiny.yaml",
            "--calibration-budget-s",
            "20",
            "--dry-run",
            "--json",
        ],
        cwd=work,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = last_json("\n".join(line for line in proc.stdout.splitlines() if line.startswith("{")))
    assert out["recalibrated"] and out["tracking_uri"] == f"sqlite:///{home}/mlflow.db"
    assert (home / "mlflow.db").is_file(), "the store (and the calibration lock it holds) is under AUTOTUNE_HOME"
    assert list(home.glob("calibrations/*/measurements.jsonl")), "the calibration's rows are under AUTOTUNE_HOME"
    assert (home / "plans" / f"tiny-{out['hardware_id']}.json").is_file()
    assert not (work / ".autotune").exists() and not (work / "mlflow.db").exists()
