# Two entry points for a fresh machine (Debian 12, Python 3.11, root): `make run`, `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=
PYTEST_ARGS ?=

.PHONY: run test install install-test test-deps bcc-setup lint bench lab clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

## The agent with its UI/API on http://127.0.0.1:8080, storing into the embedded store (./data).
## A failed BCC setup (no root, no network) does not stop it: it reports "eBPF unavailable".
run: $(VENV)/.installed
	-bash scripts/bcc-setup.sh $(VENV)
	$(BIN)/sloguard run $(ARGS)

## BCC for the eBPF collector: Debian packages, a stand-in kernel header tree, tracefs, the venv
## link (idempotent; quick on a second run). Without root the agent falls back to procfs.
bcc-setup: $(VENV)/.installed
	bash scripts/bcc-setup.sh $(VENV)

## Servers and binaries the tests talk to (a real kube-apiserver, cached after the first build;
## Debian's influxdb and victoria-metrics, whose services are not started; Debian's chromium;
## Docker and a debootstrapped bookworm base image for the image test; stress-ng and
## redis-server for the interference lab).
test-deps: bcc-setup
	bash scripts/kube-testenv.sh
	bash scripts/influx-testenv.sh
	bash scripts/browser-testenv.sh
	bash scripts/docker-testenv.sh
	bash scripts/lab-testenv.sh

## ruff, and the layer rule: each part imports only from the layers below it (pyproject.toml's
## [tool.importlinter], docs/architecture.md).
lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/python scripts/lint_imports.py

## The whole suite: lint (ruff and the import contract), then every test against the real components.
test: install-test test-deps lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install-test bcc-setup
	$(BIN)/python benchmarks/agent_overhead.py
	$(BIN)/python benchmarks/store_choice.py
	$(BIN)/python benchmarks/ebpf_overhead.py
	$(BIN)/python benchmarks/influx_write.py

## The interference lab, every shipped scenario (~30 min, root): the report and its plots go to
## docs/lab-report/, the raw results to lab-out/ (docs/lab.md).
lab: $(VENV)/.installed
	bash scripts/lab-testenv.sh
	$(BIN)/sloguard lab --out lab-out $(ARGS)
	mkdir -p docs/lab-report
	cp lab-out/report.md lab-out/*.png docs/lab-report/

clean:
	rm -rf $(VENV) build *.egg-info
