"""The NCCL tuner CSV: the choice probe's points and forced settings, the rules chosen from
measured choices (only where a forced pair beat NCCL's own choice beyond the spread), the file
NVIDIA's example plugin reads, and the command (which refuses a calibration without NCCL rows)."""

from __future__ import annotations

import json
import os

import pytest
import torch.distributed as dist

from orchestrator.cli import nccl_tuner as cli
from orchestrator.measurement_store import MeasurementStore
from policies.nccl_tuner import (
    MAX_BYTES,
    TunerFileError,
    TunerRule,
    parse_tuner_csv,
    size_choices,
    tuner_csv,
    tuner_rules,
)
from predictors.fit import kernel_rows
from probes.nccl_choice import PROBE, forced_nccl, nccl_choice_specs, nccl_groups
from probes.probe import ProbeSpec
from probes.sweep import collective_batches
from probes.vocabulary.nccl import AUTO, NCCL_CHOICE_FAMILY, candidates
from probes.vocabulary.placement import RankPlacement
from probes.vocabulary.records import Measurement


def choice_row(op, nbytes, algo, proto, seconds, spread=0.0, nodes=2, ranks=8):
    params = {"bytes": nbytes, "algo": algo, "proto": proto, "nodes": nodes}
    return Measurement(op, params, seconds, spread, 20, "cuda", ranks, "h", "", NCCL_CHOICE_FAMILY)


def test_candidates_put_nccls_own_choice_first_and_tree_only_for_all_reduce():
    assert candidates("all_reduce")[0] == (AUTO, AUTO) and ("tree", "ll") in candidates("all_reduce")
    assert {a for a, _ in candidates("all_gather")[1:]} == {"ring"} and len(candidates("broadcast")) == 4
    with pytest.raises(ValueError, match="all_to_all"):
        candidates("all_to_all")


def test_forced_settings_are_set_inside_and_restored_after(monkeypatch):
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    with forced_nccl("tree", "ll128"):
        assert (os.environ["NCCL_ALGO"], os.environ["NCCL_PROTO"]) == ("Tree", "LL128")
    assert "NCCL_ALGO" not in os.environ and os.environ["NCCL_PROTO"] == "Simple"
    with forced_nccl(AUTO, AUTO):  # NCCL's own choice: neither variable set
        assert "NCCL_ALGO" not in os.environ and "NCCL_PROTO" not in os.environ
    assert os.environ["NCCL_PROTO"] == "Simple"
    with pytest.raises(RuntimeError), forced_nccl("ring", "ll"):
        raise RuntimeError("a failed batch still restores them")
    assert "NCCL_ALGO" not in os.environ and os.environ["NCCL_PROTO"] == "Simple"


def test_groups_are_the_world_and_the_biggest_node():
    assert nccl_groups(["a", "a"]) == [(0, 1)]
    assert nccl_groups(["a", "a", "b", "b", "b"]) == [(0, 1, 2, 3, 4), (2, 3, 4)]
    assert nccl_groups(["a", "b"]) == [(0, 1)]  # no node holds two ranks
    assert nccl_groups(["a"]) == []


def test_a_pairs_sizes_form_one_batch_on_one_communicator():
    specs = nccl_choice_specs([(0, 1, 2, 3)], max_bytes=2**20)
    sizes = sorted({s.params["bytes"] for s in specs})
    assert sizes[0] == 1024 and sizes[-1] == 2**20 and len(sizes) == 6
    assert len(specs) == len(sizes) * (7 + 4 + 4 + 4)  # all_reduce: auto + 2x3; the others: auto + ring x3
    batches = collective_batches(specs, max_points=64, max_bytes=2**40)
    assert len(batches) == 19
    assert all(len({PROBE.batch_key(s) for s in batch}) == 1 for batch in batches)


def test_placed_points_record_the_nodes_their_group_spans():
    spec = nccl_choice_specs([(0, 1, 2, 3)], max_bytes=1024)[0]
    placed = PROBE.placed(spec, RankPlacement((0, 0, 1, 1)))
    assert placed.params["nodes"] == 2 and placed.params["scope"] == "inter"
    assert PROBE.placed(spec, RankPlacement((0, 0, 0, 0))).params["nodes"] == 1


def test_the_probe_refuses_a_group_that_is_not_nccl(monkeypatch):
    monkeypatch.setattr(dist, "get_backend", lambda *a, **k: "gloo")
    spec = ProbeSpec(
        NCCL_CHOICE_FAMILY, {"op": "all_reduce", "bytes": 1024, "ranks": [0, 1], "algo": "ring", "proto": "ll"}
    )
    with pytest.raises(ValueError, match="NCCL group .*'gloo'"):
        PROBE.run([spec], "cpu")


def _ladder_rows():
    """all_reduce on 2x8: tree/LL twice as fast as NCCL's choice up to 16 KiB, nothing clearly
    better at 64 KiB-256 KiB (overlapping spreads), ring/LL128 faster from 1 MiB."""
    rows = []
    for nbytes in (1024, 4096, 16384, 65536, 262144, 1048576, 4194304):
        auto = 1e-5 + nbytes / 1e10
        rows.append(choice_row("all_reduce", nbytes, AUTO, AUTO, auto, spread=0.04 * auto))
        for algo, proto in candidates("all_reduce")[1:]:
            t = auto * 1.5
            if nbytes <= 16384 and (algo, proto) == ("tree", "ll"):
                t = auto * 0.5
            if 65536 <= nbytes <= 262144 and (algo, proto) == ("ring", "simple"):
                t = auto * 0.97  # faster, but within both spreads
            if nbytes >= 1048576 and (algo, proto) == ("ring", "ll128"):
                t = auto * 0.8
            rows.append(choice_row("all_reduce", nbytes, algo, proto, t, spread=0.04 * t))
    return rows


def test_rules_override_nccl_only_where_a_pair_was_clearly_faster():
    rows = _ladder_rows()
    choices = {c.nbytes: c for c in size_choices(rows)}
    assert sorted(choices) == [1024, 4096, 16384, 1048576, 4194304]
    assert choices[1024].best == ("tree", "ll") and choices[1024].speedup == pytest.approx(2.0)
    rules = tuner_rules(rows)
    assert rules == [
        TunerRule("all_reduce", 0, 32768, "tree", "ll", 2, 8),  # 16 KiB's range ends at sqrt(16 KiB x 64 KiB)
        TunerRule("all_reduce", 524289, MAX_BYTES, "ring", "ll128", 2, 8),
    ]


def test_a_group_whose_own_choice_was_not_measured_takes_the_fastest_pair():
    rows = [
        choice_row("broadcast", 1024, "ring", "ll", 1e-5, nodes=1, ranks=4),
        choice_row("broadcast", 1024, "ring", "simple", 3e-5, nodes=1, ranks=4),
    ]
    (rule,) = tuner_rules(rows)
    assert (rule.op, rule.protocol, rule.nodes, rule.ranks, rule.min_bytes, rule.max_bytes) == (
        "broadcast",
        "ll",
        1,
        4,
        0,
        MAX_BYTES,
    )


def test_the_csv_reads_back_as_the_example_plugin_reads_it():
    rules = tuner_rules(_ladder_rows())
    text = tuner_csv(rules, ["from a test"])
    assert text.startswith("# from a test\n")
    assert "allreduce,0,32768,tree,ll,-1,2,8,-1,-1" in text.splitlines()
    assert parse_tuner_csv(text) == rules
    # 8 fields (numPipeOps and regBuff omitted) is a valid line too
    assert parse_tuner_csv("broadcast,0,32768,ring,simple,-1,1,-1")[0].pipe_ops == -1
    for bad, field in (
        ("all_reduce,0,1,ring,ll,-1,1,2,-1,-1", "collective_type"),
        ("allreduce,0,1,nvls,ll,-1,1,2,-1,-1", "algorithm"),
        ("allreduce,0,1,ring,ll", "fields"),
        ("allreduce,9,1,ring,ll,-1,1,2", "min_bytes"),
        ("allreduce,0,x,ring,ll,-1,1,2", "integer"),
    ):
        with pytest.raises(TunerFileError, match=field):
            parse_tuner_csv(bad)


def test_forced_choices_never_reach_the_collective_models():
    plain = Measurement("all_reduce", {"bytes": 1024}, 1e-5, 0.0, 10, family="collective")
    assert kernel_rows([plain, *_ladder_rows()]) == [plain]


def _calibration(tmp_path, rows, device_kind):
    directory = tmp_path / "calibrations" / "20261126-000000-x"
    directory.mkdir(parents=True)
    (directory / "fingerprint.json").write_text(json.dumps({"hardware_id": "hw", "device_kind": device_kind}))
    store = MeasurementStore(directory)
    store.add(rows)
    store.sync()
    return directory


def test_the_command_refuses_a_calibration_without_nccl_choices(tmp_path, capsys):
    plain = Measurement("all_reduce", {"bytes": 1024}, 1e-5, 0.0, 10, family="collective")
    directory = _calibration(tmp_path, [plain], "cpu")
    assert cli.main(["--calibration", str(directory), "--json", "--out", str(tmp_path / "t.conf")]) == 2
    captured = capsys.readouterr()
    error = json.loads(captured.out.strip().splitlines()[-1])
    assert error["field"] == "--calibration" and "no NCCL algorithm/protocol measurements" in error["error"]
    assert "gloo" in captured.err and not (tmp_path / "t.conf").exists()


def test_the_command_writes_the_csv_from_the_newest_calibration(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTOTUNE_HOME", str(tmp_path))
    _calibration(tmp_path, _ladder_rows(), "cuda")
    assert cli.main(["--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    written = (tmp_path / "nccl_tuner.conf").read_text()
    assert result["out"] == str(tmp_path / "nccl_tuner.conf")
    assert parse_tuner_csv(written) == tuner_rules(_ladder_rows()) and len(result["rules"]) == 2
    assert {w["bytes"] for w in result["wins"]} == {1024, 4096, 16384, 1048576, 4194304}


def test_the_command_says_when_there_is_no_calibration(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTOTUNE_HOME", str(tmp_path / "empty"))
    assert cli.main([]) == 2
    assert "no calibration under" in capsys.readouterr().err
