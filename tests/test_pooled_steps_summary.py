"""`benchmarks/pooled_steps.py`'s summary: a pooled fit judged against its own run's own-steps fit,
pair by pair, never against another run's."""

from __future__ import annotations

import json

import pytest

from benchmarks.pooled_steps import AT_SPEED, OWN, resummarized, summarize


def run(geomean: float, worst: float, signed: float) -> dict:
    return {"geomean_error": geomean, "max_error": worst, "mean_signed_error": signed}


def judged(cycle: str, variant: str, dlrm: dict, dp: dict, tp: dict | None = None) -> dict:
    out = {"cycle": cycle, "variant": variant, "lent_steps": 0 if variant == OWN else 40, "dlrm": dlrm}
    out["transformer_dp"] = dp
    if tp is not None:
        out["transformer_tp"] = tp
    return out


def test_changes_are_paired_by_run_and_bars_counted():
    pooled = "own + 3 earlier"
    results = [
        judged("a", OWN, run(0.06, 0.20, -0.08), run(0.05, 0.15, +0.02), run(0.10, 0.2, 0.0)),
        judged("a", pooled, run(0.05, 0.18, -0.04), run(0.06, 0.16, +0.03), run(0.08, 0.2, 0.0)),
        judged("b", OWN, run(0.12, 0.30, +0.10), run(0.04, 0.12, -0.01)),
        judged("b", pooled, run(0.10, 0.24, +0.07), run(0.04, 0.12, -0.02)),
    ]
    summary = summarize(results)
    own, pool = summary[OWN], summary[pooled]
    assert own["dlrm"]["met"] == 0 and pool["dlrm"]["met"] == 1  # a: signed -8% -> -4%
    assert own["transformer_dp"]["met"] == pool["transformer_dp"]["met"] == 2
    assert own["both"] == {"runs": 2, "met": 0} and pool["both"] == {"runs": 2, "met": 1}
    assert "paired" not in own["dlrm"]
    paired = pool["dlrm"]["paired"]
    assert paired["geomean_error"]["mean_change"] == pytest.approx(-0.015)  # (-0.01 - 0.02) / 2
    assert paired["abs_mean_signed_error"]["mean_change"] == pytest.approx(-0.035)  # (-0.04 - 0.03) / 2
    assert paired["geomean_error"]["cycles"] == 2
    tp = pool["transformer_dp"]["paired"]["tp_geomean_error"]
    assert tp["cycles"] == 1 and tp["mean_change"] == pytest.approx(-0.02)  # only run a had TP tasks
    assert pool["dlrm"]["sd_signed"] < own["dlrm"]["sd_signed"]


def test_a_run_judged_only_pooled_is_not_paired_with_another_runs_own_fit():
    pooled = "own + 3 earlier"
    results = [
        judged("a", OWN, run(0.06, 0.2, -0.08), run(0.05, 0.15, 0.0)),
        judged("b", pooled, run(0.20, 0.4, +0.2), run(0.05, 0.15, 0.0)),
    ]
    summary = summarize(results)
    assert summary[pooled]["dlrm"]["paired"]["geomean_error"] is None


def test_runs_judged_apart_are_summarized_as_one(tmp_path):
    pooled = "own + 3 earlier"
    parts = []
    for host, signed in (("amd", -0.08), ("intel", +0.08)):
        path = tmp_path / f"{host}.json"
        results = [
            judged(host, OWN, run(0.06, 0.2, signed), run(0.05, 0.15, 0.0)),
            judged(host, pooled, run(0.05, 0.2, signed / 2), run(0.05, 0.15, 0.0)),
        ]
        path.write_text(json.dumps({"command": f"python benchmarks/pooled_steps.py {host}", "results": results}))
        parts.append(path)
    out, data = resummarized(parts, str(tmp_path / "both.json"))
    assert out == str(tmp_path / "both.json") and len(data["results"]) == 4
    assert data["commands"] == ["python benchmarks/pooled_steps.py amd", "python benchmarks/pooled_steps.py intel"]
    assert data["summary"][pooled]["dlrm"]["paired"]["abs_mean_signed_error"]["cycles"] == 2
    assert data["summary"][pooled]["dlrm"]["met"] == 2 and data["summary"][OWN]["dlrm"]["met"] == 0
    alone, again = resummarized(parts[:1], "unused")
    assert alone == str(parts[0]) and again["summary"][pooled]["dlrm"]["runs"] == 1


def test_rescaled_pooling_is_paired_with_pooling_as_is_where_steps_were_lent():
    as_is, rescaled = "own + 3 earlier", "own + 3 earlier" + AT_SPEED
    results = []
    for cycle, lent, dlrm_as_is, dlrm_rescaled in (("a", 40, 0.08, 0.05), ("b", 120, 0.06, 0.05), ("c", 0, 0.1, 0.1)):
        results.append(judged(cycle, OWN, run(0.07, 0.2, 0.0), run(0.05, 0.15, 0.0)))
        for label, geomean in ((as_is, dlrm_as_is), (rescaled, dlrm_rescaled)):
            row = judged(cycle, label, run(geomean, 0.2, 0.0), run(0.05, 0.15, 0.0))
            results.append({**row, "lent_steps": lent})
    summary = summarize(results)
    change = summary[rescaled]["dlrm"]["against_as_is"]["geomean_error"]
    assert change["cycles"] == 2  # c lent nothing: its two pooled fits are one
    assert change["mean_change"] == pytest.approx(-0.02)  # (-0.03 - 0.01) / 2
    assert "against_as_is" not in summary[as_is]["dlrm"]
    assert summary[rescaled]["dlrm"]["paired"]["geomean_error"]["cycles"] == 3


def test_a_joined_output_can_be_joined_again_and_is_complete_only_where_its_parts_were(tmp_path):
    paths = []
    for name, complete in (("a", True), ("b", False), ("c", True)):
        path = tmp_path / f"{name}.json"
        results = [judged(name, OWN, run(0.06, 0.2, 0.0), run(0.05, 0.15, 0.0))]
        path.write_text(json.dumps({"command": f"judge {name}", "results": results, "complete": complete}))
        paths.append(path)
    out, ab = resummarized(paths[:2], str(tmp_path / "ab.json"))
    assert ab["complete"] is False and ab["commands"] == ["judge a", "judge b"]
    assert ab["summarized_by"].endswith(f"--out {tmp_path / 'ab.json'}")
    (tmp_path / "ab.json").write_text(json.dumps(ab))
    _, abc = resummarized([tmp_path / "ab.json", paths[2]], str(tmp_path / "abc.json"))
    assert abc["commands"] == ["judge a", "judge b", "judge c"] and len(abc["results"]) == 3


def test_variants_without_an_own_steps_fit_are_summarized_unpaired():
    results = [judged("a", "candidate", run(0.06, 0.2, 0.0), run(0.05, 0.15, 0.0))]
    assert "paired" not in summarize(results)["candidate"]["dlrm"]
