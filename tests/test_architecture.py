"""The package boundaries the design promises, checked on the code as it is.

The modelling core (the torch-free vocabulary, predictors, policies) must import without torch,
ray or mlflow, so it runs anywhere (a GPU machine without Ray, a laptop); imports point one way
(probes <- predictors <- policies <- orchestrator) with no cycle; and its modules and
functions stay small enough to read.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("probes", "predictors", "policies", "orchestrator")
CORE = ("probes/vocabulary", "predictors", "policies")
LAYER = {"probes": 0, "predictors": 1, "policies": 2, "orchestrator": 3}
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 350, 60


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def top_level_imports(path: Path, known: set[str]) -> set[str]:
    """Project modules `path` imports when it is imported (not the lazy imports inside functions)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        found.update(n for n in names if n in known)
    return found


def test_the_modelling_core_imports_no_torch_ray_or_mlflow():
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import predictors, policies, probes.vocabulary\n"
        "for pkg in ('predictors', 'policies', 'probes.vocabulary'):\n"
        "    for info in pkgutil.iter_modules(importlib.import_module(pkg).__path__):\n"
        "        importlib.import_module(f'{pkg}.{info.name}')\n"
        "print(json.dumps(sorted(m for m in ('torch', 'ray', 'mlflow', 'fbgemm_gpu', 'torchrec') if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_imports_point_down_the_layers_without_cycles():
    known = modules()
    graph = {name: top_level_imports(path, set(known)) for name, path in known.items()}
    upward = [(a, b) for a, deps in graph.items() for b in deps if LAYER[b.split(".")[0]] > LAYER[a.split(".")[0]]]
    assert upward == []
    vocabulary = [
        (a, b)
        for a, deps in graph.items()
        if a.startswith("probes.vocabulary")
        for b in deps
        if not b.startswith("probes.vocabulary") and b != "probes"
    ]
    assert vocabulary == []

    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> list[str] | None:
        state[name] = 1
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                return path + [name, dep]
            if dep not in state and (cycle := visit(dep, path + [name])):
                return cycle
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            assert visit(name, []) is None


@pytest.mark.parametrize("package", CORE)
def test_the_modelling_core_has_small_modules_and_functions(package):
    too_long = []
    for path in sorted((REPO / package).glob("*.py")):
        source = path.read_text()
        if len(source.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{path.name}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.name}:{node.name}: {length} lines")
    assert too_long == []
