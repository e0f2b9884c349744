"""benchmarks/issue26_cycle.sh store: a finished cycle's scratch directory kept as the committed
cycles were, with the scratch and checkout paths removed (a run's files name both)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks/issue26_cycle.sh"
STORED = ROOT / "benchmarks/results/e2e_issue26_20261207"  # a committed cycle: 16:54's
HHMM = "1654"


def scratch_cycle(x: Path, ran: Path) -> Path:
    """A cycle directory as `run` leaves it, rebuilt from the committed files, its calibration
    log and one benchmark naming the scratch directory and the checkout that ran it."""
    cal = x / "home/calibrations/20261207-165438-cpu2c-n1-bc3cb441b9"
    cal.mkdir(parents=True)
    (cal / "measurements.jsonl").write_bytes(gzip.decompress((STORED / f"measurements_{HHMM}.jsonl.gz").read_bytes()))
    (cal / "fingerprint.json").write_bytes((STORED / f"fingerprint_{HHMM}.json").read_bytes())
    (x / "canary.jsonl").write_bytes(gzip.decompress((STORED / f"canary_{HHMM}.jsonl.gz").read_bytes()))
    summary = (STORED / f"calibration_{HHMM}.txt").read_text()
    log = f"ray: started\n{summary}[autotune] wrote {cal}/performance_model.json via {ran}/orchestrator\n"
    (x / "calibrate.log").write_text(log)
    dlrm = (STORED / f"dlrm_{HHMM}.json").read_text()
    (x / "dlrm.json").write_text(dlrm.replace('"home/calibrations/', f'"{x}/home/calibrations/'))
    (x / "transformer.json").write_bytes((STORED / f"transformer_{HHMM}.json").read_bytes())
    (x / "caldir").write_text(f"caldir {cal}/\n")
    (x / "code_dir").write_text(f"{ran}\n")
    return x


def store(args: list[str], results: Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PY": sys.executable, "RESULTS": str(results)}
    return subprocess.run(
        ["bash", str(SCRIPT), "store", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_store_keeps_the_cycle_as_committed_with_local_paths_removed(tmp_path):
    x = scratch_cycle(tmp_path / "c_1654", ran=tmp_path / "wt")
    results = tmp_path / "results"
    done = store([str(x), HHMM, "20261207"], results)
    assert done.returncode == 0, done.stderr
    out = results / "e2e_issue26_20261207"
    for name in (f"dlrm_{HHMM}.json", f"transformer_{HHMM}.json", f"fingerprint_{HHMM}.json"):
        assert (out / name).read_bytes() == (STORED / name).read_bytes(), name
    for name in (f"measurements_{HHMM}.jsonl.gz", f"canary_{HHMM}.jsonl.gz"):
        assert gzip.decompress((out / name).read_bytes()) == gzip.decompress((STORED / name).read_bytes()), name
    assert json.loads((out / f"canary_join_{HHMM}.json").read_text()) == json.loads(
        (STORED / f"canary_join_{HHMM}.json").read_text()
    )
    summary = (out / f"calibration_{HHMM}.txt").read_text()  # the [autotune] lines alone, paths gone
    kept = (STORED / f"calibration_{HHMM}.txt").read_text()
    assert (
        summary
        == kept
        + "[autotune] wrote home/calibrations/20261207-165438-cpu2c-n1-bc3cb441b9/performance_model.json via orchestrator\n"
    )
    assert str(tmp_path) not in "".join(p.read_text() for p in out.glob("*.json"))


def test_a_relative_directory_is_stored_as_an_absolute_one(tmp_path):
    """`run` writes absolute paths into the files; `store` given the same directory relatively
    must still find and remove them."""
    scratch_cycle(tmp_path / "c_1654", ran=tmp_path / "wt")
    results = tmp_path / "results"
    done = store(["c_1654", HHMM, "20261207"], results, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (results / f"e2e_issue26_20261207/dlrm_{HHMM}.json").read_bytes() == (
        STORED / f"dlrm_{HHMM}.json"
    ).read_bytes()


def test_an_unknown_command_names_the_allowed_ones_and_exits_2():
    bad = subprocess.run(["bash", str(SCRIPT), "keep"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "run DIR [SEED] | store DIR HHMM YYYYMMDD" in bad.stderr


def test_store_without_its_arguments_stops_and_writes_nothing(tmp_path):
    done = store([], tmp_path / "results")
    assert done.returncode != 0 and not (tmp_path / "results").exists()
