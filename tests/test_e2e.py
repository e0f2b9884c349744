"""The whole cycle through the real CLIs, in a scratch directory with its own sqlite MLflow."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def cli_env(extra: dict | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1", **(extra or {})}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("AUTOTUNE_HOME", None)
    env.pop("RAY_ADDRESS", None)
    return env


def cli(module: str, *args: str, cwd: Path, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=cli_env(env), capture_output=True, text=True, timeout=900
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} {args} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return proc


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def run_three_iterations(job: str, plan: str, cwd: Path) -> dict:
    """`orchestrator.cli.run` of `job` under `plan` for three timed iterations: its JSON."""
    return last_json(
        cli("orchestrator.cli.run", "--job", job, "--plan", plan, "--iters", "3", "--json", cwd=cwd).stdout
    )


def test_invalid_job_exits_2_naming_the_field(tmp_path, tiny_job_dict):
    tiny_job_dict["tables"][1]["distribution"] = "gaussian"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(tiny_job_dict))
    proc = cli("orchestrator.autotune", "--job", "bad.yaml", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert "tables[1].distribution: expected 'uniform', {zipf: s} with s > 0, or {profile: name}" in proc.stderr
    assert "got 'gaussian'" in proc.stderr
    assert not (tmp_path / ".autotune").exists(), "bad input is refused before anything starts"


def test_plan_without_models_exits_3_with_a_hint(tmp_path):
    proc = cli(
        "orchestrator.cli.plan", "--job", str(REPO / "examples/dlrm_small.yaml"), "--json", cwd=tmp_path, check=False
    )
    assert proc.returncode == 3 and "orchestrator.cli.calibrate" in proc.stderr


@pytest.mark.slow
def test_autotune_twice_then_plan_predict_run(tmp_path, tiny_job_dict):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_job_dict))
    first = last_json(
        cli(
            "orchestrator.autotune", "--job", "tiny.yaml", "--calibration-budget-s", "25", "--json", cwd=tmp_path
        ).stdout
    )
    assert first["recalibrated"] is True
    assert first["calibration"]["promoted"] is True
    rows = first["calibration"]["rows_per_op"]
    assert {"gemm", "embedding_fwd", "embedding_bwd", "all_reduce", "all_to_all", "dlrm_step"} <= set(rows)
    assert first["measured_iteration_ms"] > 0 and first["predicted_iteration_ms"] > 0
    assert 0 <= first["host_other_share"] <= 1  # the host's other load while the steps were timed
    # each rank ran on its own share of the host's cores (`core_binding`), as the probes did
    cores = first["placement"]["rank_cores"]
    assert len(cores) == 2
    if hasattr(os, "sched_getaffinity"):  # no CPU affinity on macOS: nothing is bound there
        allowed = sorted(os.sched_getaffinity(0))
        assert all(share and set(share) <= set(allowed) for share in cores)
        if len(allowed) >= 2:
            assert not set(cores[0]) & set(cores[1])
    assert first["prediction_error"] == pytest.approx(
        abs(first["predicted_iteration_ms"] - first["measured_iteration_ms"]) / first["measured_iteration_ms"]
    )

    second_proc = cli("orchestrator.autotune", "--job", "tiny.yaml", "--dry-run", "--json", cwd=tmp_path)
    second = last_json(second_proc.stdout)
    assert second["recalibrated"] is False and second["model"] == first["model"]
    assert "reusing champion" in second_proc.stderr and "no recalibration" in second_proc.stderr

    # What MLflow holds for the first run.
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/.autotune/mlflow.db")
    client = MlflowClient()
    run = client.get_run(first["run_id"])
    assert {"predicted_iteration_ms", "measured_iteration_ms", "prediction_error", "host_other_share"} <= set(
        run.data.metrics
    )
    assert {"plan.json", "job.json", "plan_candidates.json"} <= {a.path for a in client.list_artifacts(first["run_id"])}
    assert run.data.params["world_size"] == "2" and run.data.params["tables"] == "5"
    # the calibration it started is a run of its own, nested under it, with the host's system metrics
    calibrating = client.get_run(first["calibration"]["run_id"])
    assert calibrating.data.tags["mlflow.parentRunId"] == first["run_id"]
    assert calibrating.data.tags["kind"] == "calibration"
    assert "heldout.gemm.gmae" in calibrating.data.metrics
    assert any(k.startswith("system/") for k in calibrating.data.metrics)
    assert {"measurements.parquet", "fingerprint.json"} <= {
        a.path for a in client.list_artifacts(calibrating.info.run_id)
    }
    name = first["model"].split("/")[0]
    champion = client.get_model_version_by_alias(name, "champion")
    assert champion.tags["hardware_id"] == first["hardware_id"]

    plan = last_json(
        cli(
            "orchestrator.cli.plan", "--job", "tiny.yaml", "--torchrec-plan-out", "tr.json", "--json", cwd=tmp_path
        ).stdout
    )
    # the plan as TorchRec's ShardingPlan, from the file the user loads
    from policies.torchrec_plans import from_sharding_plan, load_torchrec_plan
    from probes.vocabulary.jobspec import JobSpec

    torchrec_plan = load_torchrec_plan(json.loads((tmp_path / "tr.json").read_text()))
    job_spec = JobSpec.from_dict(yaml.safe_load((tmp_path / "tiny.yaml").read_text()))
    assert (
        from_sharding_plan(job_spec, torchrec_plan) == plan["decisions"]["sharding"]["choice_detail"]["table_to_rank"]
    )
    names = {c["name"] for c in plan["decisions"]["sharding"]["candidates"]}
    assert names >= {
        "naive",
        "random",
        "size_greedy",
        "lookup_greedy",
        "norm_lookup_greedy",
        "size_lookup_greedy",
        "all_row_wise",
        "all_column_wise",
        "search",
    }
    # With a network section the plan also chooses the gradient all-reduce's chunks.
    net = {**tiny_job_dict, "network": {"dims": [{"peers": 2, "bandwidth_gbps": 1, "latency_us": 20}]}}
    (tmp_path / "net.yaml").write_text(yaml.safe_dump(net))
    net_plan = last_json(
        cli("orchestrator.cli.plan", "--job", "net.yaml", "--out", "net_plan.json", "--json", cwd=tmp_path).stdout
    )
    assert net_plan["decisions"]["chunking"]["choice_detail"]["chunk_schedule"]["dims"] == [2]
    # ... and the real job runs its dense all-reduce with that schedule.
    ran = run_three_iterations("net.yaml", "net_plan.json", tmp_path)
    assert ran["iterations"] == 3 and ran["loss_last"] > 0
    plan_path = Path(tmp_path) / second["plan"]
    predicted = last_json(
        cli("orchestrator.cli.predict", "--job", "tiny.yaml", "--plan", str(plan_path), "--json", cwd=tmp_path).stdout
    )
    assert predicted["iteration_ms"] == pytest.approx(second["predicted_iteration_ms"])
    # A user's own torch.profiler trace of another model, priced by the same champion.
    from kineto_traces import write_mlp_trace

    write_mlp_trace(tmp_path / "traces")
    traced = last_json(cli("orchestrator.cli.predict", "--trace", "traces", "--json", cwd=tmp_path).stdout)
    assert traced["hardware_id"] == first["hardware_id"] and traced["ranks"] == 1
    assert traced["trace_ms"] > 0 and traced["iteration_ms"] > 0 and 0 < traced["priced_share"] < 1

    # Refit from the stored measurements: nothing is probed, a new version is registered.
    measurements = Path(tmp_path) / first["calibration"]["measurements"]
    refit = last_json(
        cli("orchestrator.cli.calibrate", "--refit", str(measurements.parent), "--json", cwd=tmp_path).stdout
    )
    assert refit["model"] == f"{name}/2" and refit["rows_per_op"] == first["calibration"]["rows_per_op"]
    assert refit["pooled_steps"] == []  # the calibration it refits is the store's only one: nothing to pool

    # Nightly: the champion's sentinel points, re-measured, still agree with it: nothing to do.
    # A transformer job with the same champion: autotune chooses its layout and runs it (through
    # the launcher `run` shares); plan and predict take the job as for a DLRM.
    transformer = {
        **{k: v for k, v in yaml.safe_load((REPO / "examples/transformer_small.yaml").read_text()).items()},
        **dict(name="tf", layers=2, hidden=64, heads=4, seq_len=32, vocab_size=128, global_batch=4),
    }
    (tmp_path / "tf.yaml").write_text(yaml.safe_dump(transformer))
    tuned = last_json(
        cli(
            "orchestrator.autotune",
            "--job",
            "tf.yaml",
            "--recalibrate",
            "never",
            "--iterations",
            "3",
            "--json",
            cwd=tmp_path,
        ).stdout
    )
    assert tuned["layout"] and tuned["measured_iteration_ms"] > 0 and tuned["predicted_iteration_ms"] > 0
    tf_plan = last_json(
        cli("orchestrator.cli.plan", "--job", "tf.yaml", "--out", "tf_plan.json", "--json", cwd=tmp_path).stdout
    )
    layouts = tf_plan["decisions"]["parallelism"]
    assert layouts["choice"] == tuned["layout"] and len(layouts["candidates"]) >= 10
    assert all(c["detail"]["memory"]["peak"] > 0 for c in layouts["candidates"])
    predicted = last_json(
        cli("orchestrator.cli.predict", "--job", "tf.yaml", "--plan", "tf_plan.json", "--json", cwd=tmp_path).stdout
    )
    assert predicted["iteration_ms"] == pytest.approx(layouts["predicted_ms"])

    hw = first["hardware_id"]
    # (A nightly on unchanged hardware recalibrating nothing: tests/test_server.py.) A drill makes
    # every probe on this machine read 4x slower: a sentinel priced right misses by 75%, and
    # only a model pricing its sentinels 2.6x long would stay under the 35% bound (at 3x, one
    # 2x long did; a first calibration timed beside other load once missed the drift, 12-01).
    # Two nightlies started together: one takes the lock, sees the sentinels drift,
    # recalibrates, and its new model (fitted on the slower machine) is promoted over the old;
    # the other sees the lock and exits cleanly.
    drill = {"AUTOTUNE_DRILL_SLOWDOWN": "4"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli.nightly",
                "--budget-s",
                "25",
                "--sentinel-speed-bound",
                "2",
                "--json",
            ],
            cwd=tmp_path,
            env=cli_env(drill),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [(p.wait(timeout=900), p.stdout.read(), p.stderr.read()) for p in procs]
    assert [code for code, _, _ in outs] == [0, 0], [err[-2000:] for _, _, err in outs]
    results = [last_json(out) for _, out, _ in outs]
    assert sorted(bool(r.get("skipped")) for r in results) == [False, True]
    skipped = next(err for (_, _, err), r in zip(outs, results) if r.get("skipped"))
    assert "another nightly run holds" in skipped
    drilled = next(r for r in results if not r.get("skipped"))
    (checked,) = drilled["checked"]
    assert checked["recalibrated"] and checked["promoted"], checked.get("promotion_reason")
    assert any(r.startswith("sentinel drift") for r in checked["reasons"])
    # The calibration timed its sentinels: the drilled machine runs them about 4x its times,
    # past the bound this nightly was given.
    assert any(r.startswith("speed drift") for r in checked["reasons"]) and checked["sentinel"]["speed"] > 2
    assert str(client.get_model_version_by_alias(name, "champion").version) == checked["model"].split("/")[1]
    # Its step fit left the undrilled calibration's steps out (one calibration, with its refit):
    # they measured a machine four times faster.
    from orchestrator import registry

    lent = registry.get_alias(hw, registry.CHAMPION).model.meta["pooled_steps"]
    assert len(lent) == 1 and not lent[0]["pooled"] and (lent[0]["speed"] or 1) < 0.5, lent
    # The drift report shows the jump: the drilled check over its bound.
    report = last_json(cli("orchestrator.cli.drift", "--json", cwd=tmp_path).stdout)
    series = report["hardware"][hw]["sentinel"]
    assert series[-1]["gmae"] > series[-1]["bound"]
    assert Path(tmp_path / report["charts"][hw]).exists()
