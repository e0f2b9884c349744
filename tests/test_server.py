"""Against a real deployment's pieces on localhost: PostgreSQL (Debian's server programs, a
private cluster in a temporary directory) and `mlflow server` on it with basic auth and proxied
artifacts; calibrate → autotune → drift → nightly through the real CLIs."""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.server, pytest.mark.slow]
ADMIN_PASSWORD = "admin-pass-for-tests"
USER, USER_PASSWORD = "autotune", "autotune-pass-for-tests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        pytest.fail("PostgreSQL's server programs are missing: `make test` installs them (apt-get install postgresql)")
    return Path(found[-1]).parent


@pytest.fixture(scope="module")
def postgres():
    """A private PostgreSQL cluster on 127.0.0.1 (as the `postgres` user when we are root:
    the server refuses to run as root)."""
    bindir = pg_bin()
    base = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    os.chmod(base, 0o755)
    data = base / "data"
    data.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
        shutil.chown(base, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    run = lambda *cmd: subprocess.run(as_user + [str(c) for c in cmd], check=True, capture_output=True, text=True)  # noqa: E731
    run(bindir / "initdb", "-D", data, "-U", "mlflow", "--auth=trust")
    run(
        bindir / "pg_ctl",
        "-D",
        data,
        "-l",
        base / "server.log",
        "-w",
        "-t",
        "60",
        "-o",
        f"-p {port} -k {base} -c listen_addresses=127.0.0.1",
        "start",
    )
    try:
        for db in ("mlflow", "mlflow_auth"):
            run(bindir / "createdb", "-h", "127.0.0.1", "-p", port, "-U", "mlflow", db)
        yield f"postgresql://mlflow@127.0.0.1:{port}"
    finally:
        run(bindir / "pg_ctl", "-D", data, "-m", "fast", "stop")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def mlflow_server(postgres, tmp_path_factory):
    """`mlflow server` on the database, basic auth on, artifacts proxied; a user for us."""
    home = tmp_path_factory.mktemp("mlflow-server")
    ini = home / "basic_auth.ini"
    ini.write_text(
        f"[mlflow]\ndefault_permission = READ\ndatabase_uri = {postgres}/mlflow_auth\n"
        "admin_username = admin\nauthorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    port = free_port()
    env = {
        **os.environ,
        "MLFLOW_AUTH_CONFIG_PATH": str(ini),
        "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-secret",
    }
    log = open(home / "server.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"{postgres}/mlflow",
            "--artifacts-destination",
            str(home / "artifacts"),
            "--app-name",
            "basic-auth",
            "--workers",
            "1",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=home,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"{url}/health", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("mlflow server did not come up:\n" + (home / "server.log").read_text()[-3000:])
            time.sleep(1)
        created = requests.post(
            f"{url}/api/2.0/mlflow/users/create",
            json={"username": USER, "password": USER_PASSWORD},
            auth=("admin", ADMIN_PASSWORD),
            timeout=30,
        )
        assert created.ok, created.text
        yield url, home
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def cli(module: str, *args: str, cwd: Path, url: str) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TQDM_DISABLE": "1",
        "MLFLOW_TRACKING_URI": url,
        "MLFLOW_TRACKING_USERNAME": USER,
        "MLFLOW_TRACKING_PASSWORD": USER_PASSWORD,
    }
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-m", module, *args, "--json"], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, f"{module} {args} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_calibrate_autotune_drift_nightly_against_a_real_server(mlflow_server, tmp_path, tiny_job_dict):
    url, home = mlflow_server
    # Authentication is on: no credentials, no data.
    assert requests.get(f"{url}/api/2.0/mlflow/experiments/search?max_results=1", timeout=30).status_code == 401

    # No model for this hardware on the server yet: autotune calibrates, registers, plans, runs.
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_job_dict))
    tuned = cli(
        "orchestrator.autotune",
        "--job",
        "tiny.yaml",
        "--calibration-budget-s",
        "20",
        "--iterations",
        "3",
        cwd=tmp_path,
        url=url,
    )
    calibration = {**tuned["calibration"], "hardware_id": tuned["hardware_id"]}
    assert tuned["recalibrated"] is True and calibration["promoted"] and calibration["model"].endswith("/1")
    assert tuned["model"] == calibration["model"] and tuned["measured_iteration_ms"] > 0
    report = cli("orchestrator.cli.drift", cwd=tmp_path, url=url)
    (version,) = report["hardware"][calibration["hardware_id"]]["versions"]
    assert version["version"] == "1" and version["jobs"] == 1
    assert version["rolling_geomean_error"] == pytest.approx(tuned["prediction_error"])
    nightly = cli("orchestrator.cli.nightly", "--budget-s", "20", cwd=tmp_path, url=url)
    (checked,) = nightly["checked"]
    assert checked["hardware_id"] == calibration["hardware_id"] and checked["sentinel"]["gmae"] is not None
    assert nightly["recalibrated"] == 0, (
        checked["reasons"],
        checked["sentinel"],
    )  # unchanged hardware: its sentinels agree, no false alarm

    # Everything landed in the server: runs and registry in PostgreSQL, artifacts proxied into
    # the server's artifact store (no local mlruns / mlartifacts beside the client).
    os.environ.update({"MLFLOW_TRACKING_USERNAME": USER, "MLFLOW_TRACKING_PASSWORD": USER_PASSWORD})
    try:
        import mlflow

        mlflow.set_tracking_uri(url)
        client = mlflow.MlflowClient()
        name = calibration["model"].split("/")[0]
        assert client.get_model_version_by_alias(name, "champion").version in ("1", "2", 1, 2)
        kinds = {
            r.data.tags.get("kind") for r in mlflow.search_runs(experiment_names=["autotune"], output_format="list")
        }
        assert {"autotune", "calibration", "drift", "nightly"} <= kinds
        assert "plan.json" in {a.path for a in client.list_artifacts(tuned["run_id"])}
        calibrated = {a.path for a in client.list_artifacts(tuned["calibration"]["run_id"])}
        assert "measurements.parquet" in calibrated
    finally:
        mlflow.set_tracking_uri(None)
        for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            os.environ.pop(key, None)
    assert any((home / "artifacts").rglob("plan.json"))
    assert not (tmp_path / "mlartifacts").exists() and not (tmp_path / "mlruns").exists()
