"""Bad input, every kind: exit 2 naming the field and what is allowed; with --json also one
JSON object on stdout; nothing (Ray, an MLflow store) started before the input is checked."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.options import EXIT_BAD_INPUT, run_main, wants_json
from orchestrator.jobfile import load_job
from policies.plan import Candidate, Decision, Plan, PlanError
from policies.sharders import NoFeasiblePlanError
from probes.vocabulary.jobspec import JobSpec, JobSpecError

REPO = Path(__file__).resolve().parents[1]


def json_error(out: str) -> dict:
    obj = json.loads(out.strip().splitlines()[-1])
    assert obj["exit_code"] == EXIT_BAD_INPUT or obj["exit_code"] == 3
    return obj


@pytest.fixture()
def scratch(tmp_path, monkeypatch, tiny_job_dict):
    """A scratch working directory holding a good job file (good.yaml)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("AUTOTUNE_HOME", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(tiny_job_dict))
    return tmp_path


def write_job(path: Path, data: dict) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


def cli_main(module: str):
    import importlib

    return importlib.import_module(f"orchestrator.cli.{module}").main


def check_refused(capsys, code: int, field: str, *in_stderr: str) -> dict:
    out, err = capsys.readouterr()
    assert code == EXIT_BAD_INPUT, err
    for text in in_stderr:
        assert text in err, err
    obj = json_error(out)
    assert obj["field"] == field, obj
    assert "Traceback" not in err
    return obj


# --- 1. the job file itself -------------------------------------------------------------------


@pytest.mark.parametrize("module", ["plan", "predict", "run", "autotune", "calibrate"])
def test_a_job_file_that_is_not_utf8_exits_2_in_every_cli(scratch, capsys, module):
    (scratch / "latin.yaml").write_bytes(b"\xff\xfe\x00name: x")
    argv = ["--job", "latin.yaml", "--json"] + (["--plan", "p.json"] if module in ("predict", "run") else [])
    obj = check_refused(capsys, cli_main(module)(argv), "--job", "latin.yaml: not a UTF-8 text file")
    assert "expected a YAML job file in UTF-8" in obj["error"]
    assert not (scratch / ".autotune").exists(), "bad input is refused before anything starts"


@pytest.mark.parametrize(
    "make, expected", [(lambda d: (d / "adir.yaml").mkdir(), "got a directory"), (lambda d: None, "job file not found")]
)
def test_a_directory_or_missing_job_file(scratch, capsys, make, expected):
    make(scratch)
    check_refused(capsys, cli_main("plan")(["--job", "adir.yaml", "--json"]), "--job", expected)


def test_load_job_names_the_file_and_the_option(tmp_path):
    (tmp_path / "d.yaml").mkdir()
    with pytest.raises(JobSpecError) as info:
        load_job(tmp_path / "d.yaml")
    assert info.value.fields == ["--job"] and info.value.problems[0].startswith(str(tmp_path / "d.yaml"))


# --- 2. network numbers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dim, field, expected",
    [
        ({"peers": "2", "bandwidth_gbps": 1, "latency_us": 1}, "network.dims[0].peers", "got '2'; allowed: 1..65536"),
        ({"peers": float("nan"), "bandwidth_gbps": 1, "latency_us": 1}, "network.dims[0].peers", "got nan"),
        ({"peers": float("inf"), "bandwidth_gbps": 1, "latency_us": 1}, "network.dims[0].peers", "got inf"),
        (
            {"peers": 2, "bandwidth_gbps": float("inf"), "latency_us": 1},
            "network.dims[0].bandwidth_gbps",
            "got inf; allowed: a finite number > 0",
        ),
        ({"peers": 2, "bandwidth_gbps": float("nan"), "latency_us": 1}, "network.dims[0].bandwidth_gbps", "got nan"),
        ({"peers": 2, "bandwidth_gbps": -1, "latency_us": 1}, "network.dims[0].bandwidth_gbps", "got -1"),
        (
            {"peers": 2, "bandwidth_gbps": 1, "latency_us": float("nan")},
            "network.dims[0].latency_us",
            "got nan; allowed: a finite number >= 0",
        ),
        ({"peers": 2, "bandwidth_gbps": 1, "latency_us": float("inf")}, "network.dims[0].latency_us", "got inf"),
    ],
)
def test_network_numbers_must_be_finite_and_positive(tiny_job_dict, dim, field, expected):
    tiny_job_dict["network"] = {"dims": [dim]}
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_dict(tiny_job_dict)
    assert info.value.fields == [field]
    assert expected in info.value.problems[0], info.value.problems


def test_network_nan_in_a_job_file_exits_2_with_json(scratch, capsys, tiny_job_dict):
    # YAML's .nan and .inf, as a user writes them
    text = yaml.safe_dump(tiny_job_dict) + "network: {dims: [{peers: .nan, bandwidth_gbps: .inf, latency_us: 1}]}\n"
    (scratch / "net.yaml").write_text(text)
    obj = check_refused(
        capsys,
        cli_main("plan")(["--job", "net.yaml", "--json"]),
        "network.dims[0].peers",
        "network.dims[0].peers: expected an integer >= 1, got nan",
        "network.dims[0].bandwidth_gbps",
    )
    assert obj["fields"] == ["network.dims[0].peers", "network.dims[0].bandwidth_gbps"]


# --- 3. memory cap -----------------------------------------------------------------------------


@pytest.mark.parametrize("cap", [float("nan"), float("inf"), float("-inf"), -1, 0, "8"])
def test_memory_cap_must_be_a_finite_positive_number(tiny_job_dict, cap):
    tiny_job_dict["memory_cap_gb"] = cap
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_dict(tiny_job_dict)
    assert info.value.fields == ["memory_cap_gb"]
    assert "memory_cap_gb: expected a positive number of GiB" in info.value.problems[0]
    assert "allowed: a finite number > 0" in info.value.problems[0]


def test_memory_cap_nan_exits_2_before_anything_starts(scratch, capsys, tiny_job_dict):
    (scratch / "cap.yaml").write_text(yaml.safe_dump(tiny_job_dict) + "memory_cap_gb: .nan\n")
    check_refused(capsys, cli_main("autotune")(["--job", "cap.yaml", "--json"]), "memory_cap_gb", "got nan")
    assert not (scratch / ".autotune").exists()


@pytest.mark.parametrize("module", ["run", "autotune", "calibrate", "nightly"])
def test_a_bad_core_binding_exits_2_naming_the_variable_before_anything_starts(scratch, capsys, monkeypatch, module):
    monkeypatch.setenv("AUTOTUNE_CORE_BINDING", "numa")
    argv = {"run": ["--job", "good.yaml", "--plan", "p.json"], "autotune": ["--job", "good.yaml"]}.get(module, [])
    obj = check_refused(capsys, cli_main(module)([*argv, "--json"]), "AUTOTUNE_CORE_BINDING", "allowed: exclusive, off")
    assert "'numa'" in obj["error"]
    assert not (scratch / ".autotune").exists()


# --- 4. tables too large: TorchRec's PlannerError ----------------------------------------------


def small_job(world=2, rows=1000, cap=None):
    from test_sharding import job

    return job([(rows, 16, 2)] + [(1000, 16, 2)] * 3, world, cap)


def test_a_torchrec_planner_that_finds_no_plan_leaves_the_other_candidates_competing(monkeypatch):
    from test_sharding import synthetic_model

    import policies.torchrec_bridge as bridge
    from policies.sharding import TORCHREC, TORCHREC_MEASURED, choose_sharding

    def refuse(job, cap, **kwargs):
        raise NoFeasiblePlanError("TorchRec's planner found no plan (insufficient_storage): shard does not fit")

    monkeypatch.setattr(bridge, "torchrec_plan", refuse)
    decision = choose_sharding(small_job(), synthetic_model(), memory_cap_bytes=2**30, search=False)
    by_name = {c.name: c for c in decision.candidates}
    for name in (TORCHREC, TORCHREC_MEASURED):
        assert not by_name[name].feasible and "found no plan" in by_name[name].detail["reason"]
    assert by_name[decision.choice].feasible


def test_torchrecs_planner_error_becomes_no_feasible_plan(monkeypatch):
    pytest.importorskip("torchrec")
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import PlannerError, PlannerErrorType

    from policies.torchrec_bridge import torchrec_plan

    def fail(self, *args, **kwargs):
        raise PlannerError(
            "Unable to find a plan.\nLast planner error: \n\tShard of size X does not fit on any rank.",
            PlannerErrorType.INSUFFICIENT_STORAGE,
        )

    monkeypatch.setattr(EmbeddingShardingPlanner, "plan", fail)
    with pytest.raises(NoFeasiblePlanError, match=r"\(insufficient_storage\): Shard of size X does not fit"):
        torchrec_plan(small_job(), memory_cap_bytes=2**30)


def test_a_table_too_large_for_any_rank_is_no_feasible_plan_not_a_planner_error():
    pytest.importorskip("torchrec")
    from test_sharding import synthetic_model

    from policies.sharding import TORCHREC, TORCHREC_MEASURED, choose_sharding

    # 4e9 rows x 16 columns: 238 GiB, against a 64 MiB cap; the measured planner must not try
    # to sample a typical batch of it either (its Zipf CDF alone would be 30 GiB)
    job = JobSpec.from_dict(
        {
            **small_job().to_dict(),
            "tables": [
                {
                    "name": "huge",
                    "num_embeddings": 4_000_000_000,
                    "embedding_dim": 16,
                    "pooling_factor": 2,
                    "distribution": {"zipf": 1.05},
                },
                {"name": "small", "num_embeddings": 1000, "embedding_dim": 16, "pooling_factor": 2},
            ],
        }
    )
    with pytest.raises(NoFeasiblePlanError) as info:
        choose_sharding(job, synthetic_model(), memory_cap_bytes=2**26)
    # (TorchRec on its own constants may place the table in host memory: then our cap refuses it)
    assert f"{TORCHREC_MEASURED}: TorchRec's planner found no plan" in str(info.value)
    assert f"{TORCHREC}: " in str(info.value)

    def plan_cli(argv):
        choose_sharding(job, synthetic_model(), memory_cap_bytes=2**26)

    assert run_main(plan_cli, ["--json"]) == EXIT_BAD_INPUT


# --- 5. calibrate --job ------------------------------------------------------------------------


def test_calibrate_with_a_bad_job_file_exits_2(scratch, capsys, tiny_job_dict):
    tiny_job_dict["world_size"] = "two"
    write_job(scratch / "bad.yaml", tiny_job_dict)
    check_refused(
        capsys,
        cli_main("calibrate")(["--job", "bad.yaml", "--json"]),
        "world_size",
        "world_size: expected an integer >= 1, got 'two'",
    )
    assert not (scratch / ".autotune").exists()


def test_calibrate_resume_of_a_non_calibration_directory_names_the_option(scratch, capsys):
    check_refused(
        capsys, cli_main("calibrate")(["--resume", str(scratch), "--json"]), "--resume", "not a calibration directory"
    )


# --- 6. predict / run --plan -------------------------------------------------------------------


def good_plan(job: JobSpec) -> Plan:
    decision = Decision(
        "sharding",
        "naive",
        1.0,
        [Candidate("naive", 1.0, True, {})],
        {"table_to_rank": [i % job.world_size for i in range(len(job.tables))]},
    )
    return Plan(job.to_dict(), "hw", "1", 1.0, {"sharding": decision})


def mutated(plan: Plan, change) -> dict:
    data = json.loads(plan.to_json())
    change(data)
    return data


@pytest.mark.parametrize(
    "content, field, expected",
    [
        ("{not json", "--plan", "not valid JSON"),
        ("{}", "job", "job: required field is missing"),
        ("[]", "(top level)", "expected a plan object"),
        (b"\xff\x00", "--plan", "not a UTF-8 text file"),
        (
            lambda p: mutated(p, lambda d: d["decisions"]["sharding"]["choice_detail"].update(table_to_rank=[0, 1])),
            "decisions.sharding.choice_detail.table_to_rank",
            "one entry per table of the plan's job (5), got 2",
        ),
        (
            lambda p: mutated(p, lambda d: d.update(predicted_iteration_ms=float("nan"))),
            "predicted_iteration_ms",
            "a finite number",
        ),
        (
            lambda p: mutated(p, lambda d: d["decisions"].update(sharding=[])),
            "decisions.sharding",
            "expected a mapping",
        ),
        (
            lambda p: mutated(p, lambda d: d["decisions"]["sharding"]["candidates"].append({"nme": "x"})),
            "decisions.sharding.candidates[1]",
            "expected a mapping with fields",
        ),
    ],
)
def test_malformed_plan_files_exit_2_naming_the_field(scratch, capsys, tiny_job_dict, content, field, expected):
    job = JobSpec.from_dict(tiny_job_dict)
    if callable(content):
        content = json.dumps(content(good_plan(job)))
    path = scratch / "plan.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    for module in ("predict", "run"):
        obj = check_refused(
            capsys,
            cli_main(module)(["--job", "good.yaml", "--plan", "plan.json", "--json"]),
            field,
            "invalid plan: plan.json",
            expected,
        )
        assert expected in obj["error"]
    assert not (scratch / ".autotune").exists()


@pytest.mark.parametrize(
    "change, field, expected",
    [
        (
            lambda d: d["decisions"]["sharding"]["choice_detail"].update(table_to_rank=[0, 1, 5, 0, 1]),
            "decisions.sharding.choice_detail.table_to_rank",
            "rank 5 outside 0..1",
        ),
        (lambda d: d["job"].update(world_size=4), "job.world_size", "made for world_size 4, the job has 2"),
        (lambda d: d["job"]["tables"][0].update(name="other"), "job.tables", "the plan was made for tables"),
        (lambda d: d["decisions"].pop("sharding"), "decisions.sharding", "required for a DLRM plan"),
    ],
)
def test_a_plan_of_another_job_is_refused_before_anything_starts(
    scratch, capsys, tiny_job_dict, change, field, expected
):
    plan = good_plan(JobSpec.from_dict(tiny_job_dict))
    (scratch / "plan.json").write_text(json.dumps(mutated(plan, change)))
    for module in ("predict", "run"):
        check_refused(
            capsys, cli_main(module)(["--job", "good.yaml", "--plan", "plan.json", "--json"]), field, expected
        )


def test_plan_from_dict_round_trips_and_raises_plan_error(tiny_job_dict):
    job = JobSpec.from_dict(tiny_job_dict)
    plan = good_plan(job)
    again = Plan.from_dict(json.loads(plan.to_json()))
    assert again.table_to_rank == plan.table_to_rank
    again.check_job(job)
    with pytest.raises(PlanError) as info:
        Plan.from_dict(
            {
                **plan.to_dict(),
                "decisions": {"chunking": {"policy": "chunking", "choice": "x", "predicted_ms": 1.0, "candidates": []}},
            }
        )
    assert info.value.field == "decisions.chunking.choice_detail.chunk_schedule"
    assert isinstance(info.value, ValueError)


# --- 7. options: budgets, ages, iterations -----------------------------------------------------


# Per command: (arguments, the option the error names, what it says about the allowed values).
BAD_OPTIONS = {
    "calibrate": [
        (["--budget-s", "nan"], "--budget-s", "expected a finite number of seconds in (0, 604800]"),
        (["--budget-s", "-5"], "--budget-s", "got '-5'"),
        (["--budget-s", "inf"], "--budget-s", "got 'inf'"),
        (["--seed", "-1"], "--seed", "expected an integer in 0..4294967295"),
        (["--refit", "."], "--refit", "expected a calibration directory"),
    ],
    "autotune": [
        (["--job", "good.yaml", "--calibration-budget-s", "0"], "--calibration-budget-s", "got '0'"),
        (["--job", "good.yaml", "--calibration-budget-s", "1e400"], "--calibration-budget-s", "1e400"),
        (["--job", "good.yaml", "--max-model-age-days", "nan"], "--max-model-age-days", "days in (0, 3650]"),
        (["--job", "good.yaml", "--iterations", "0"], "--iterations", "expected an integer in 1..100000"),
        (["--job", "good.yaml", "--iterations", "-3"], "--iterations", "got '-3'"),
        (["--job", "good.yaml", "--plan-out", "."], "--plan-out", "(a directory)"),
    ],
    "run": [(["--job", "good.yaml", "--plan", "p.json", "--iters", "0"], "--iters", "an integer in 1..100000")],
    "nightly": [
        (["--budget-s", "nan"], "--budget-s", "expected a finite number of seconds"),
        (["--max-model-age-days", "-1"], "--max-model-age-days", "got '-1'"),
        (["--sentinel-ratio", "inf"], "--sentinel-ratio", "got 'inf'"),
    ],
    "drift": [
        (["--last", "0"], "--last", "expected an integer in 1..100000"),
        (["--out-dir", "good.yaml"], "--out-dir", "(an existing file)"),
    ],
    "fuse": [
        (["--workload", "cnn", "--max-width", "0"], "--max-width", "expected an integer in 1..4096"),
        (["--workload", "cnn", "--memory-cap-gb", "nan"], "--memory-cap-gb", "got 'nan'"),
        (["--workload", "nope"], "--workload", "invalid choice: 'nope'"),
    ],
    "plan": [
        ([], "--job", "the following arguments are required: --job"),
        (["--job", "good.yaml", "--bogus"], "--bogus", "unrecognized arguments: --bogus"),
    ],
}


@pytest.mark.parametrize(
    "module, argv, field, expected", [(module, *case) for module, cases in BAD_OPTIONS.items() for case in cases]
)
def test_bad_options_exit_2_naming_the_option_and_range(scratch, capsys, module, argv, field, expected):
    obj = check_refused(capsys, cli_main(module)(argv + ["--json"]), field, expected, "usage:")
    assert expected in obj["error"]
    assert not (scratch / ".autotune").exists()


def test_without_json_an_option_error_prints_no_json_and_still_exits_2(scratch, capsys):
    assert cli_main("calibrate")(["--budget-s", "nan"]) == EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert out == "" and "argument --budget-s" in err


def test_a_parser_outside_run_main_still_exits_2_as_argparse_does(capsys):
    from orchestrator.cli.nightly import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--budget-s", "nan"])
    assert info.value.code == EXIT_BAD_INPUT
    assert "argument --budget-s" in capsys.readouterr().err


def test_wants_json_takes_argparse_prefixes():
    assert wants_json(["--job", "j", "--json"]) and wants_json(["--jso"])
    assert not wants_json(["--job", "--", "--json"]) and not wants_json(["--j"]) and not wants_json([])


# --- 8. sizes no job needs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "mutate, field, expected",
    [
        (lambda d: d.update(world_size=100_000), "world_size", "expected an integer <= 65536"),
        (lambda d: d.update(batch_size=2**20 + 1), "batch_size", "allowed: 1..1048576"),
        (lambda d: d.update(iterations=10**6), "iterations", "allowed: 1..100000"),
        (lambda d: d.update(warmup_iterations=10**6), "warmup_iterations", "allowed: 0..10000"),
        (lambda d: d.update(seed=2**40), "seed", "allowed: 0..4294967295"),
        (
            lambda d: d.update(tables=[dict(d["tables"][0], name=f"t{i}") for i in range(4097)]),
            "tables",
            "at most max(4096, 32 x world_size) = 4096 tables",
        ),
        (
            lambda d: d["tables"][0].update(num_embeddings=2**34 + 1),
            "tables[0].num_embeddings",
            "allowed: 1..17179869184",
        ),
        (lambda d: d["tables"][0].update(embedding_dim=8193), "tables[0].embedding_dim", "allowed: 1..8192"),
        (lambda d: d["tables"][0].update(pooling_factor=16385), "tables[0].pooling_factor", "allowed: 1..16384"),
        (
            lambda d: d.update(world_size=65536, batch_size=2**20),
            "tables[0].pooling_factor",
            "batch_size x world_size x pooling_factor <= 1073741824",
        ),
        (lambda d: d["dense"].update(num_dense_features=10**6), "dense.num_dense_features", "allowed: 1..65536"),
        (lambda d: d["dense"].update(bottom_mlp=[8] * 65), "dense.bottom_mlp", "allowed: 1..64 layers"),
        (lambda d: d["dense"].update(top_mlp=[10**6, 1]), "dense.top_mlp[0]", "allowed: 1..65536"),
        (lambda d: d.update(name="../../x"), "name", "no / or \\"),
        (
            lambda d: d["tables"][0].update(distribution={"zipf": float("inf")}),
            "tables[0].distribution",
            "got {'zipf': inf}",
        ),
        (
            lambda d: d.update(network={"topology": "2D-SW_SW", "collective_mb": float("inf")}),
            "network.collective_mb",
            "allowed: a finite number > 0 and <= 1048576",
        ),
    ],
)
def test_sizes_beyond_any_job_are_refused_naming_the_field_and_range(tiny_job_dict, mutate, field, expected):
    mutate(tiny_job_dict)
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_dict(tiny_job_dict)
    assert info.value.fields[0] == field, info.value.problems  # (every table, for the lookups bound)
    assert expected in info.value.problems[0], info.value.problems


def test_more_tables_are_allowed_on_more_ranks(tiny_job_dict):
    tiny_job_dict.update(world_size=256, tables=[dict(tiny_job_dict["tables"][0], name=f"t{i}") for i in range(5000)])
    assert len(JobSpec.from_dict(tiny_job_dict).tables) == 5000


def test_world_size_100000_exits_2_at_once(scratch, capsys, tiny_job_dict):
    tiny_job_dict["world_size"] = 100_000
    write_job(scratch / "big.yaml", tiny_job_dict)
    for module in ("plan", "autotune", "calibrate"):
        check_refused(
            capsys,
            cli_main(module)(["--job", "big.yaml", "--json"]),
            "world_size",
            "world_size: expected an integer <= 65536",
            "allowed: 1..65536",
        )
    assert not (scratch / ".autotune").exists()


# --- the real entry points ---------------------------------------------------------------------


def test_python_dash_m_entry_points_exit_2_with_one_json_object(tmp_path):
    (tmp_path / "latin.yaml").write_bytes(b"\xff\xfe")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    env["PYTHONPATH"] = str(REPO)
    for module in ("orchestrator.autotune", "orchestrator.cli.calibrate", "orchestrator.cli.plan"):
        proc = subprocess.run(
            [sys.executable, "-m", module, "--job", "latin.yaml", "--json"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-2000:]
        assert "latin.yaml: not a UTF-8 text file" in proc.stderr and "Traceback" not in proc.stderr
        (line,) = proc.stdout.strip().splitlines()
        assert json.loads(line)["field"] == "--job"
    assert not (tmp_path / ".autotune").exists()


def test_no_champion_is_exit_3_with_json(tracking, capsys):
    code = cli_main("plan")(["--job", str(REPO / "examples/dlrm_small.yaml"), "--json", "--tracking-uri", tracking])
    out, err = capsys.readouterr()
    assert code == 3 and "orchestrator.cli.calibrate" in err
    obj = json.loads(out.strip().splitlines()[-1])
    assert obj["exit_code"] == 3 and "no champion model" in obj["error"]
