# cloudshell-mutex: every task starts from a fresh clone; the Makefile installs what it needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
# Execution servers run Python 3.9: the library is also installed and unit-tested there.
# The first candidate that really runs 3.9 (a pyenv shim may exist without 3.9 being selected).
PYTHON39 ?= $(shell for p in $(wildcard $(HOME)/.pyenv/versions/3.9*/bin/python3.9) python3.9; do \
	$$p -c 'import sys; sys.exit(sys.version_info[:2] != (3, 9))' 2>/dev/null && { echo $$p; break; }; done)
VENV := .venv
# The one version source (pyproject.toml reads it through hatch; so does drivers.toml's {project_version}).
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' src/cloudshell_mutex/__init__.py)
VENV39 := .venv39
# The oldest cloudshell-automation-api that pyproject.toml allows: no re-send, no socket timeout, no 401
# handling. The lock's emulator tests also run with it, under Python 3.9 (docs/protocol.md).
OLDEST_CLIENT := cloudshell-automation-api==2021.1.0.181036
VENV_OLDEST := .venv-oldest-client
OLDEST_CLIENT_TESTS := tests/lock/test_mutex_emulator.py tests/lock/test_alias.py \
	tests/lock/test_unknown_outcomes_emulator.py tests/lock/test_exclusion.py tests/contract
BIN := $(VENV)/bin
# cloudshell-orch-core 4.5 pins old automation-api/logging (pip cannot install it beside shell-core 6); it is
# installed without its pins for the tests of the real Sandbox class, whose imports work with the new ones.
ORCH_CORE := cloudshell-orch-core==4.5.0.5000
PYTEST_ARGS ?=
# The suite waits on sleeps and other processes far more than it computes (a quarter of two cores): four
# pytest workers (pytest-xdist) run it in about 5.5 minutes on two cores. PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 4
# make bench: the decide plan (about 25 minutes: the default lock's targets, and the workloads sites run -
# setup bursts, a long hold, the stress run's throughput - judged), then the stalls (about 16 minutes) by
# default; BENCH=site those workloads
# alone (about ten minutes); BENCH=full the whole matrix (hours), then the cohort and readers-and-writers
# benches; BENCH=quick short windows (ten minutes), BENCH=quick,targets or quick,budget with more of N=8 and 32.
BENCH ?= decide
# ... and the cohort benchmark's plan (bench/cohort.py: quick, full, slice, smoke), run with BENCH=full.
COHORT_BENCH ?= quick
# The stalls (bench/stalls.py: dead, slow and unlucky parties, the default against fair=False), run with
# BENCH=decide and full; e.g. STALLS_ARGS="--scenarios bimodal --repeats 3".
STALLS_ARGS ?=
comma := ,

.PHONY: help venv venv39 test test-py39 test-oldest-client test-live test-dist stress chaos lint clean emulator package dist demo bench

help:
	@echo "make demo       two drivers race to rewire one sandbox, without and with the lock (about 10 s)"
	@echo "make bench      the lock against the original code -> docs/benchmarks.md (BENCH=full: hours)"
	@echo "make emulator   run the CloudShell API emulator on 127.0.0.1:8029 (Quali API on 9000)"
	@echo "make test       lint, the whole test suite, and the unit tests under Python 3.9"
	@echo "make test-live  the contract suite (tests/contract) against a real CloudShell server (CLOUDSHELL_TEST_*)"
	@echo "make package    build dist/Mutex_Package.zip and the library wheel (both reproducible)"
	@echo "make dist       everything a site needs: package, wheel, sdist, and the offline bundle (docs/deploy.md)"
	@echo "make test-dist  make dist in a fresh clone, then install from its bundle with no index"
	@echo "make stress     32 processes x 200 acquisitions under faults, kills and pauses; checks exclusion and the history;"
	@echo "                then 1,000 acquisitions of three named locks in one order: no deadlock seen"
	@echo "make chaos      liveness under faults: 6 processes x 15 sections, seeds 7, 8, 9, default lock and fair=False;"
	@echo "                a table of the sections that ran, and safety (tens of minutes)"
	@echo "make lint       ruff"
	@echo "make clean      remove the virtualenvs and build outputs"

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[cli,driver]' --group dev
	$(BIN)/python -m pip install --quiet --no-deps $(ORCH_CORE)
	touch $@

venv: $(BIN)/.installed

$(VENV39)/bin/.installed: pyproject.toml
	@test -n "$(PYTHON39)" || { echo "Python 3.9 not found: install it (pyenv install 3.9) or set PYTHON39=/path/to/python3.9"; exit 1; }
	$(PYTHON39) -m venv $(VENV39)
	$(VENV39)/bin/python -m pip install --quiet --upgrade pip
	$(VENV39)/bin/python -m pip install --quiet '.[cli,driver]' 'pytest>=8,<9' 'pytest-timeout>=2.2,<3' 'hypothesis>=6.100,<7'
	touch $@

venv39: $(VENV39)/bin/.installed

$(VENV_OLDEST)/bin/.installed: pyproject.toml
	@test -n "$(PYTHON39)" || { echo "Python 3.9 not found: install it (pyenv install 3.9) or set PYTHON39=/path/to/python3.9"; exit 1; }
	$(PYTHON39) -m venv $(VENV_OLDEST)
	$(VENV_OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_OLDEST)/bin/python -m pip install --quiet '.[cli,driver]' '$(OLDEST_CLIENT)' 'pytest>=8,<9' 'pytest-timeout>=2.2,<3' \
		'pytest-xdist>=3.5,<4'
	touch $@

lint: venv
	$(BIN)/ruff check src tests examples drivers tools
	$(BIN)/ruff format --check src tests examples drivers tools

# The three virtualenvs are built side by side (mostly downloads), then the stages run one after the other.
test:
	@$(MAKE) --no-print-directory -j3 venv venv39 $(VENV_OLDEST)/bin/.installed
	@$(MAKE) --no-print-directory lint test-py39 test-oldest-client
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The contract suite against a real server; `make test` runs the same tests against the emulator.
# Variables and their meaning: docs/contract.md (printed here when CLOUDSHELL_TEST_HOST is missing).
# The settings are checked before the virtualenv is built, so that a missing one is reported at once.
test-live:
	@if [ -z "$$CLOUDSHELL_TEST_HOST" ]; then \
		echo "make test-live runs tests/contract against a real CloudShell server. Set:"; \
		echo "  CLOUDSHELL_TEST_HOST            the server's host name or address (required)"; \
		echo "  CLOUDSHELL_TEST_PASSWORD        the user's password (required)"; \
		echo "  CLOUDSHELL_TEST_USER            a user allowed to create sandboxes (default: admin)"; \
		echo "  CLOUDSHELL_TEST_DOMAIN          the user's domain (default: Global)"; \
		echo "  CLOUDSHELL_TEST_API_PORT        the Automation API port (default: 8029)"; \
		echo "  CLOUDSHELL_TEST_QUALI_PORT      the Quali API port, for the package import (default: 9000)"; \
		echo "  CLOUDSHELL_TEST_IMPORT_PACKAGE  1 = import this tree's Mutex_Package.zip first (needs an admin)"; \
		echo "  CLOUDSHELL_TEST_OTHER_DOMAIN    a domain other than Global the user may log on to (else skipped)"; \
		echo "Optional: CLOUDSHELL_TEST_TIMEOUT, CLOUDSHELL_TEST_RACE_PROCESSES, CLOUDSHELL_TEST_RACE_ROUNDS,"; \
		echo "CLOUDSHELL_TEST_END_SECONDS (docs/contract.md). Example:"; \
		echo "  CLOUDSHELL_TEST_HOST=cs.example.com CLOUDSHELL_TEST_PASSWORD=... make test-live"; \
		exit 2; \
	fi
	@$(MAKE) --no-print-directory venv
	$(BIN)/python -m pytest -p no:cacheprovider tests/contract $(PYTEST_ARGS)

# A non-editable install, so that what is tested is what a wheel ships.
test-py39: venv39
	$(VENV39)/bin/python -m pip install --quiet --no-deps --force-reinstall .
	$(VENV39)/bin/python -m pytest -p no:cacheprovider -q -m "not integration and not dist" tests

# The lock's emulator tests with the oldest client the dependency range allows (tests that need a newer
# client's re-send or socket timeout are skipped there, and say so).
test-oldest-client: $(VENV_OLDEST)/bin/.installed
	$(VENV_OLDEST)/bin/python -m pip install --quiet --no-deps --force-reinstall .
	$(VENV_OLDEST)/bin/python -m pytest -n $(PYTEST_WORKERS) -p no:cacheprovider -q $(OLDEST_CLIENT_TESTS)

# 32 processes x 200 acquisitions under every fault, with original-protocol peers, our lock processes killed
# and paused at random; figures as JSON (docs/reliability.md). STRESS_ARGS="--processes 8 --rounds 20" for a
# shorter one (--help for the rest). Then 1,000 acquisitions of random subsets of three named locks in one order:
# no deadlock may be seen (make test runs 200 of them).
STRESS_ARGS ?=
stress: venv
	$(BIN)/python tests/stress/stress_harness.py $(STRESS_ARGS)
	CLOUDSHELL_MUTEX_DEADLOCK_ACQUISITIONS=1000 $(BIN)/python -m pytest -p no:cacheprovider -q -s \
		tests/lock/test_deadlock_processes.py -k one_order

# Liveness under faults (docs/reliability.md): 6 processes x 15 sections (acquire with a 30 s timeout, a
# read-modify-write, release) through resets before and after the commit, requests landing 1-3 s late and spikes
# past the clients' 1 s timeout; seeds 7, 8, 9 x the default lock and fair=False, then a table. Not part of make
# test (minutes per run; tests/stress/test_chaos_smoke.py runs a tiny round there). CHAOS_ARGS="--request-lifetime
# 10" for a lock told the server's measured request lifetime; "--journals DIR" keeps each run's records and timeline.
CHAOS_ARGS ?=
chaos: venv
	$(BIN)/python tests/stress/chaos_harness.py --all $(CHAOS_ARGS)

# Builds the package, starts the embedded emulator on free ports and races two driver processes.
demo: venv
	$(BIN)/python -m cloudshell_mutex.demo

# Not part of make test: benchmarks are not timed tests. Writes docs/benchmarks.md and docs/benchmarks/*.png,
# and the demo's time (the figure README.md and make help state) into docs/benchmarks.md.
bench: venv
	$(BIN)/python -m cloudshell_mutex.bench --plan $(BENCH)
	$(BIN)/python -m cloudshell_mutex.demo --doc docs/benchmarks.md
ifneq ($(filter decide full,$(subst $(comma), ,$(BENCH))),)
	$(BIN)/python -m cloudshell_mutex.bench.stalls --doc docs/benchmarks.md $(STALLS_ARGS)
endif
ifneq ($(filter full,$(subst $(comma), ,$(BENCH))),)
	$(BIN)/python -m cloudshell_mutex.bench.cohort --plan $(COHORT_BENCH)
	$(BIN)/python -m cloudshell_mutex.bench.rwmix --reads 0.9,0.5 --doc docs/benchmarks.md
endif

# With this tree's Mutex_Package.zip imported, so that drivers and scripts can lock at once (README).
emulator: venv
	$(BIN)/cloudshell-mutex package --output dist/Mutex_Package.zip
	$(BIN)/cloudshell-mutex emulator --package dist/Mutex_Package.zip

# The package zip's entries carry no build time; the wheel's take SOURCE_DATE_EPOCH (the last commit's
# time unless set), so the same commit gives the same sha256 for both (docs/package.md).
package: venv
	$(BIN)/cloudshell-mutex package --output dist/Mutex_Package.zip
	SOURCE_DATE_EPOCH=$${SOURCE_DATE_EPOCH:-$$(git log -1 --format=%ct 2>/dev/null || echo 1580601600)} \
		$(BIN)/python -m build --quiet --wheel --outdir dist .

# What a release hands to sites and to PyPI (docs/deploy.md): the package and the wheel (make package), the
# sdist, and dist/offline_requirements/, every wheel the execution servers need (CPython 3.9 on Windows x64
# and Linux x86_64), checked to install from that folder alone; twine checks the wheel and the sdist.
dist: package
	@test -n "$(PYTHON39)" || { echo "Python 3.9 not found: install it (pyenv install 3.9) or set PYTHON39=/path/to/python3.9"; exit 1; }
	SOURCE_DATE_EPOCH=$${SOURCE_DATE_EPOCH:-$$(git log -1 --format=%ct 2>/dev/null || echo 1580601600)} \
		$(BIN)/python -m build --quiet --sdist --outdir dist .
	$(BIN)/python tools/dist.py --python $(PYTHON39) --wheel dist/cloudshell_mutex-$(VERSION)-py3-none-any.whl
	$(BIN)/twine check --strict dist/cloudshell_mutex-$(VERSION)-py3-none-any.whl dist/cloudshell_mutex-$(VERSION).tar.gz

# The release path end to end, outside make test (it downloads every dependency): `make dist` in a fresh
# clone of this commit, then the tests marked `dist` install from that clone's bundle with no index.
test-dist: venv
	rm -rf build/test-dist && git clone --quiet . build/test-dist
	$(MAKE) --no-print-directory -C build/test-dist dist PYTHON39=$(PYTHON39)
	CLOUDSHELL_MUTEX_DIST=$(CURDIR)/build/test-dist/dist PYTHON39=$(PYTHON39) \
		$(BIN)/python -m pytest -p no:cacheprovider -m dist tests/release $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(VENV39) $(VENV_OLDEST) .venv-driver39 dist build .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
