# Two entry points for a fresh machine (Debian 12, Python 3.11, root): `make run`, `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=
PYTEST_ARGS ?=

.PHONY: run test install install-test test-deps kube-testenv node-testenv influx-testenv \
	browser-testenv docker-testenv lab-testenv alertmanager-testenv postgres-testenv \
	prometheus-testenv test-images bcc-setup lint bench lab clean

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

## Servers and binaries the tests talk to: a real Kubernetes node's binaries (kube-testenv, built
## from Debian's source package and cached after the first build); and node-testenv: BCC,
## Debian's influxdb, victoria-metrics, prometheus-alertmanager, postgresql and prometheus
## (their services and the package's own PostgreSQL cluster are not started), chromium, Docker with a debootstrapped bookworm base image for the image test,
## stress-ng and redis-server for the interference lab; then test-images. The Kubernetes build and the rest are independent:
## `make -j2 test-deps` runs them side by side.
test-deps: kube-testenv node-testenv test-images

## The Kubernetes build is CPU-bound (7-11 min on 2 cores on a fresh machine); the rest waits on
## the network and dpkg, so they overlap (their apt-get calls take turns: apt_get in
## scripts/setup-lib.sh). `make test` runs it with --background instead.
kube-testenv:
	bash scripts/kube-testenv.sh

## One target per script, so that `make -j2` can overlap them: none needs the venv but BCC's.
node-testenv: docker-testenv bcc-setup influx-testenv browser-testenv lab-testenv \
	alertmanager-testenv postgres-testenv prometheus-testenv

docker-testenv:
	bash scripts/docker-testenv.sh

influx-testenv:
	bash scripts/influx-testenv.sh

browser-testenv:
	bash scripts/browser-testenv.sh

lab-testenv:
	bash scripts/lab-testenv.sh

alertmanager-testenv:
	bash scripts/alertmanager-testenv.sh

## Debian's postgresql for the cluster server's PostgreSQL tests, which start their own server
## from initdb in a temp dir as the `postgres` user (tests/support/postgres.py).
postgres-testenv:
	bash scripts/postgres-testenv.sh

## Debian's prometheus (2.42) and promtool for tests/test_prometheus_rules.py, which runs
## its own server on loopback (tests/support/prometheus.py); the package's service is disabled.
prometheus-testenv:
	bash scripts/prometheus-testenv.sh

## The agent's and the lab workload's images into Docker's layer cache, while the Kubernetes
## build still runs: the image test and the node fixture then build from the cache (on a fresh
## machine the first build, mostly apt and pip inside the images, cost the suite 143 s). They
## need Docker and the venv only, so they build while the other installs go on (183 s in the
## last fresh run, docs/development.md; they used to wait for every install).
test-images: docker-testenv install-test
	cd tests && $(abspath $(BIN))/python -m support.kubenode --images-only

## ruff, and the layer rule: each part imports only from the layers below it (pyproject.toml's
## [tool.importlinter], docs/architecture.md).
lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/python scripts/lint_imports.py

## The whole suite: lint (ruff and the import contract), then every test against the real components.
## The Kubernetes build goes on in the background, its compile at idle CPU priority, while the
## other installs and then the tests that need no Kubernetes run; the Kubernetes tests wait for
## it (tests/conftest.py: the run order; a fresh machine's figures: docs/development.md).
test:
	bash scripts/kube-testenv.sh --background
	$(MAKE) -j2 test-images install-test node-testenv
	$(MAKE) lint
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
