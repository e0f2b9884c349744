"""The host sampler beside a run (benchmarks/host_canary.py): its wakeup canary leaves the process
as it found it, and its join sets each launch beside the samples taken while it ran."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.host_canary import Echo, Sample, join, launches, wakeup_us


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs two cores to bind apart"
)
def test_the_wakeup_canary_times_every_round_trip_and_gives_back_the_cores_and_its_child():
    before = os.sched_getaffinity(0)
    trips = wakeup_us(20)
    assert len(trips) == 20 and trips == sorted(trips) and trips[0] > 0
    assert os.sched_getaffinity(0) == before
    echo = Echo()
    assert len(echo.round_trips_us(3)) == 3
    assert echo.loops_at_once_ms() > 0 and len(echo.round_trips_us(2)) == 2  # the pipes stay in step
    echo.close()
    with pytest.raises(ChildProcessError):  # the echo child ended when its pipe closed and was reaped
        os.waitpid(echo.pid, os.WNOHANG)
    assert os.sched_getaffinity(0) == before


def sample(unix: float, wakeup: float) -> dict:
    fields = {name: 0.0 for name in Sample.__dataclass_fields__}
    return {**fields, "unix": unix, "wakeup_us_median": wakeup, "pressure_some_avg10": None}


def test_each_launch_is_set_beside_the_samples_of_its_window_and_ranked_against_its_lean(tmp_path):
    result = {
        "tasks": [
            {
                "name": "a",
                "predicted_ms": 10.0,
                "measured_rounds_ms": [10.0, 12.0, 14.0],
                "launch_ended_unix": [100, 200, 300],
            },
            {"name": "b", "predicted_ms": 20.0, "measured_rounds_ms": [21.0, 30.0], "launch_ended_unix": [150, 250]},
            {"name": "old", "predicted_ms": 5.0, "measured_rounds_ms": [5.0]},  # a JSON from before the end times
        ]
    }
    assert [row["over"] for row in launches(result)] == pytest.approx([1.0, 1.2, 1.4, 1.05, 1.5])
    (tmp_path / "run.json").write_text(json.dumps(result))
    lines = [sample(t, w) for t, w in [(95, 10), (99, 30), (145, 60), (195, 50), (245, 90), (295, 70), (400, 1)]]
    (tmp_path / "canary.jsonl").write_text("\n".join(json.dumps(s) for s in lines) + "\n")
    report = join(tmp_path / "canary.jsonl", [tmp_path / "run.json"], window_s=10)
    assert report["launches"] == 5
    first = next(j for j in report["joined"] if j["ended"] == 100)
    assert first["samples"] == 2 and first["wakeup_us_median"] == pytest.approx(20.0)
    assert report["spearman_vs_over"]["wakeup_us_median"] == pytest.approx(0.9)  # ranks 1-5 against 1,3,4,2,5
    assert report["spearman_vs_over"]["pressure_some_avg10"] is None  # never sampled: no figure, not a zero
