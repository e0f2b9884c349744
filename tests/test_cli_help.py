"""Every command's help: answered without importing torch, Ray or MLflow (so in well under a
second), every option explained, examples, environment and exit codes in the epilog, and a
usage line that names the command the way the user started it."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.defaults import FUSION_WORKLOADS

REPO = Path(__file__).resolve().parents[1]
COMMANDS = ("autotune", "calibrate", "plan", "predict", "run", "nightly", "drift", "fuse", "nccl_tuner")
HEAVY = ("torch", "ray", "mlflow", "scipy", "sklearn", "pandas", "fbgemm_gpu")


def _help_in_a_fresh_process(command: str) -> dict:
    code = f"""
import contextlib, io, json, sys
from orchestrator.cli import {command} as cli
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        cli.main(["--help"])
        code = None
    except SystemExit as exc:
        code = exc.code
print(json.dumps({{"code": code, "help": out.getvalue(), "imported": sorted(sys.modules)}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("command", COMMANDS)
def test_help_imports_nothing_heavy_and_explains_itself(command):
    shown = _help_in_a_fresh_process(command)
    assert shown["code"] == 0
    heavy = [m for m in shown["imported"] if m.split(".")[0] in HEAVY]
    assert not heavy, f"--help of {command} imported {sorted({m.split('.')[0] for m in heavy})}"
    text = shown["help"]
    for part in ("examples:", "environment:", "AUTOTUNE_HOME", "exit codes:", "--quiet", "--verbose"):
        assert part in text, f"{command} --help lacks {part!r}"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help(command):
    parser = importlib.import_module(f"orchestrator.cli.{command}").build_parser()
    undocumented = [a.option_strings[-1] for a in parser._actions if a.option_strings and not a.help]
    assert not undocumented, f"{command}: no help for {undocumented}"


def test_usage_names_the_console_script_or_the_module(monkeypatch):
    from orchestrator.cli import plan

    monkeypatch.setattr(sys, "argv", ["/venv/bin/autotune-plan"])
    assert plan.build_parser().format_usage().startswith("usage: autotune-plan ")
    monkeypatch.setattr(sys, "argv", [str(REPO / "orchestrator/cli/plan.py")])
    assert plan.build_parser().format_usage().startswith("usage: python -m orchestrator.cli.plan ")


def test_every_command_is_a_console_script():
    text = (REPO / "pyproject.toml").read_text()
    for command in COMMANDS:
        script = "autotune" if command == "autotune" else f"autotune-{command.replace('_', '-')}"
        assert f'{script} = "orchestrator.cli.{command}:main"' in text


def test_the_fusion_workloads_the_parser_offers_are_the_ones_that_exist():
    from probes.workloads.fusion.models import WORKLOADS

    assert set(FUSION_WORKLOADS) == set(WORKLOADS)


def test_quiet_and_verbose_exclude_each_other(capsys):
    from orchestrator.cli import plan

    assert plan.main(["--job", "x.yaml", "--quiet", "--verbose", "--json"]) == 2
    error = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert error["field"] in ("--verbose", "--quiet")
