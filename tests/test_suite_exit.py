"""The suite ends its process itself once every result is reported (`conftest.pytest_unconfigure`):
its exit status and its summary must be pytest's own, whatever the tests did."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_a_failing_suite_still_exits_1_with_its_summary_and_a_passing_one_0(tmp_path: Path):
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_sessionfinish, pytest_unconfigure  # noqa\n"
    )
    (tmp_path / "test_two.py").write_text("def test_passes():\n    pass\n\n\ndef test_fails():\n    assert 1 == 2\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def pytest(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(tmp_path)]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    failing = pytest()
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "1 failed, 1 passed" in failing.stdout
    passing = pytest("-k", "passes")
    assert passing.returncode == 0 and "1 passed, 1 deselected" in passing.stdout, passing.stdout + passing.stderr
    none = pytest("-k", "no_such_test")
    assert none.returncode == 5, none.stdout + none.stderr  # pytest's "no tests ran", kept


def test_a_fault_in_the_interpreters_teardown_does_not_change_the_exit_status(tmp_path: Path):
    """What CI saw: every test passed, then the process faulted as it tore down. A test here
    arms a segmentation fault for the interpreter's exit (`atexit`); the suite's own end comes
    first, so the run still exits 0. Without the hook the same run dies of SIGSEGV."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_sessionfinish, pytest_unconfigure  # noqa\n"
    )
    (tmp_path / "test_fault.py").write_text(
        "import atexit, os, signal\n\n\n"
        "def test_leaves_a_fault_for_teardown():\n"
        "    atexit.register(os.kill, os.getpid(), signal.SIGSEGV)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "1 passed" in run.stdout, (run.returncode, run.stdout + run.stderr)
    (tmp_path / "conftest.py").write_text("")  # the control: the fault does end a run without the hook
    bare = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert bare.returncode != 0 and "1 passed" in bare.stdout, (bare.returncode, bare.stdout + bare.stderr)
