# Two entry points a user needs: `make autotune` and `make test`. Both set up .venv first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
JOB    ?= examples/dlrm_small.yaml
STAMP  := $(VENV)/.setup-stamp
# Every install takes the versions the suite last passed with (constraints.txt).
PIP    := $(PY) -m pip install --quiet -c constraints.txt
# fbgemm-gpu when a GPU is visible, the CPU build otherwise.
FBGEMM := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo fbgemm-gpu==1.8.0 || echo fbgemm-gpu-cpu==1.8.0)

.PHONY: setup autotune lint test test-fast clean postgres gpu-check

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PIP) torch==2.13.0 $(FBGEMM)
	$(PIP) -e '.[test,torchrec,server]'
	# torchrec declares fbgemm-gpu (the CUDA build); with fbgemm-gpu-cpu it is installed without
	# its declared dependencies, which the `torchrec` extra lists instead.
	$(PIP) --no-deps torchrec==1.8.0
	$(PY) -c "import torch, fbgemm_gpu, ray, mlflow, sklearn, scipy, torchrec; print('setup ok: torch', torch.__version__, 'ray', ray.__version__, 'mlflow', mlflow.__version__, 'torchrec', torchrec.__version__)"
	touch $(STAMP)

autotune: setup
	$(PY) -m orchestrator.autotune --job $(JOB)

# The server tests need PostgreSQL's server programs (Debian's postgresql package).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	  else echo "tests/test_server.py needs PostgreSQL: sudo apt-get install postgresql"; exit 1; fi; }

# Lint and format checks over the tree, type checks over the modelling core (pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: setup postgres lint
	$(PY) -m pytest -q --durations=25 tests

test-fast: setup
	$(PY) -m pytest -q -m "not slow" tests

clean:
	rm -rf $(VENV) mlflow.db mlartifacts .autotune

# On a lent GPU machine: a bare python3 (PyTorch, NumPy, SciPy, scikit-learn; no Ray, MLflow or
# fbgemm-gpu, no .venv) drives probes -> predictors -> policies on the one device; cuda when
# torch sees one, else cpu. Extra flags: make gpu-check GPU_CHECK_ARGS="--quick --out PATH".
gpu-check:
	PYTHONPATH=. python3 benchmarks/gpu_check.py $(GPU_CHECK_ARGS)
