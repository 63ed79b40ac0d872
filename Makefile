# Every target sets itself up: a virtualenv in .venv with the project and its development
# tools installed (re-installed when pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LINTED := sdk mockbroker

PHONY_DOCS := docs-api test-docs bench-sizing
.PHONY: help setup proto proto-check docs docs-check $(PHONY_DOCS) lint typecheck checks bytecode test test-suite test-pythons test-fast test-times test-durations test-stateful chaos fuzz fuzz-atheris demo bench bench-backlog bench-profile bench-peers interop-setup interop clean

help:
	@echo "make demo    run the main job on an embedded broker"
	@echo "make test    lint, type-check and run every test tier"
	@echo "make test-pythons    the unit tier on Python 3.12 and 3.13, where installed (part of make test)"
	@echo "make test-times      make test with the time of each check and tier, and the slowest tests"
	@echo "make test-durations  the tests alone, writing each file's seconds to tests/durations.json"
	@echo "make chaos   the fault suite's long form, with its summary table"
	@echo "make test-stateful   a long random search of every state machine (orderly, key dispatch, dedup, offsets, locks, groups, pop, the fronts together)"
	@echo "make fuzz    a long random search of every RPC, every decoder, the RocketMQ fronts, the Exchange port, the clients' public methods and constructors and the ordermq command (part of make chaos)"
	@echo "make fuzz-atheris    coverage-guided fuzzing of the decoders (installs atheris)"
	@echo "make bench   measure throughput (writes bench/results/latest.json)"
	@echo "make bench-backlog   broker memory with a 10-million-message backlog (2.3 GB disk)"
	@echo "make bench-peers     the same workload on Redis, RabbitMQ and NATS, and ratios"
	@echo "make bench-profile   where broker and client CPU goes (py-spy), as shares"
	@echo "make bench-sizing    disk and broker memory per million messages (1 KB and 100 B)"
	@echo "make interop-setup   install the RocketMQ clients of others into ~/.cache/ordermq/interop"
	@echo "make interop RocketMQ's own clients (C++, Node.js; RocketMQ 5's Python and Node.js) against mockbroker"
	@echo "make proto   regenerate sdk/_pb and mockbroker/_pb_v2 from proto/"
	@echo "make docs    regenerate docs/configuration.md from the config classes"
	@echo "make docs-api        build the guides and the API reference into build/site (strict)"
	@echo "make test-docs       run every code block of README.md and docs/, then make docs-api"

# sdk/_speedups.c is compiled by the install: a change to it installs again.
$(STAMP): pyproject.toml sdk/_speedups.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# Our sources' bytecode, compiled once per run rather than in every process: with
# PYTHONDONTWRITEBYTECODE set (as on CI) nothing caches it, and each of the hundreds of
# processes the tests start (brokers, clients, workers, the CLI) compiled sdk/ and
# mockbroker/ again, about 0.4 s of CPU each (measured: tests/system/test_cli.py 13-15 s of
# CPU without, 7.3-7.5 s with). Python checks each file's size and time against its cache,
# so a file edited since is compiled afresh, never run stale.
bytecode: $(STAMP)
	$(PY) -m compileall -q -j0 $(LINTED) tests examples bench tools conftest.py > /dev/null

proto: $(STAMP)
	$(PY) tools/gen_proto.py

proto-check: $(STAMP)
	$(PY) tools/gen_proto.py --check

docs: $(STAMP)
	$(PY) tools/gen_config_docs.py

docs-check: $(STAMP)
	$(PY) tools/gen_config_docs.py --check

# The guides and the API reference (mkdocs + mkdocstrings, mkdocs.yml). --strict: a broken
# link, an unresolved cross-reference or a docstring griffe cannot parse fails it.
docs-api: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --quiet

# Every code block of README.md and docs/*.md (tests/docs_blocks.py), and the reference.
test-docs: docs-api
	$(PY) -m pytest -q README.md docs

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINTED) tests examples bench tools conftest.py
	$(VENV)/bin/ruff format --check $(LINTED) tests examples bench tools conftest.py

typecheck: $(STAMP)
	$(VENV)/bin/mypy $(LINTED)

# Three workers (pytest-xdist) on two cores: much of the suite waits on sockets, child
# processes and leases, so a third worker fills time the other two leave idle. Measured on
# this 2-core machine, the same main (c7ad150), quiet: pytest 8:33 with two workers
# (1.3 cores busy), 6:06 with three (1.6 cores busy); earlier, 11 min serial.
# --dist loadfile keeps each file on one worker: a module's fixtures (the chaos brokers,
# the interop installs) start once rather than once per worker (385 s against 455 s in
# pytest), and a document's blocks, which share a namespace and run in order, stay together.
# The longest files start first (tests/conftest.py, by tests/durations.json), not the files
# with the most tests.
TEST_WORKERS ?= 3
XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The checks run beside the tests, one after another, rather than before them: the tests
# leave about a third of two cores idle (they wait on sockets, child processes and leases),
# and the checks of a fresh clone (no mypy cache) take that room. Either failing fails
# make test (after the other has finished).
CHECKS := proto-check docs-check docs-api lint typecheck test-pythons
test: $(STAMP)
	@$(MAKE) --no-print-directory -j2 test-suite checks

checks: $(CHECKS)

test-suite: bytecode
	$(PY) -m pytest -q $(XDIST)

# make test's checks and tests, with where the time goes (tools/test_times.py).
test-times: bytecode
	$(PY) tools/test_times.py $(XDIST) $(PYTEST_ARGS)

# The tests alone (no checks), writing each file's seconds to tests/durations.json, which
# sets make test's start order; PYTEST_ARGS="tests/system" refreshes those files only.
test-durations: bytecode
	$(PY) tools/test_times.py --skip-checks --update-durations $(XDIST) $(PYTEST_ARGS)

# The unit tier on the other Pythons pyproject.toml promises (3.12, 3.13), each that is
# installed, in a virtualenv of its own (.venv-3.12, ...): tools/other_pythons.py.
test-pythons: $(STAMP)
	$(PY) tools/other_pythons.py

# Unit and component tiers only, for a quick loop while editing (make test-docs: the docs).
test-fast: bytecode
	$(PY) -m pytest -q -m "not system and not example and not docs"

# The property-based state machines (every one: tests/fuzzing.py's machine_settings) with
# many more, random, examples than `make test` runs.
STATE_MACHINES := $(shell grep -l machine_settings tests/unit/test_*.py tests/component/test_*.py)
test-stateful: bytecode
	HYPOTHESIS_PROFILE=long $(PY) -m pytest -q $(STATE_MACHINES)

# The fault suite with many more rounds than `make test` runs; the table is also saved as JSON.
chaos: bytecode
	mkdir -p bench/results
	ORDERMQ_CHAOS=long ORDERMQ_CHAOS_REPORT=bench/results/chaos.json HYPOTHESIS_PROFILE=long \
		$(PY) -m pytest -q -m chaos --timeout 3600

# The fuzz tier of the fault suite alone, long: every RPC of every front and every decoder
# of bytes.
fuzz: bytecode
	HYPOTHESIS_PROFILE=long $(PY) -m pytest -q tests/unit/test_fuzz_decoders.py \
		tests/component/test_fuzz_rpc.py tests/component/test_fuzz_fronts.py \
		tests/component/test_fuzz_exchange_port.py tests/component/test_fuzz_public_api.py \
		tests/component/test_fuzz_public_api_aio_push_tx.py tests/component/test_fuzz_cli.py \
		tests/unit/test_fuzz_broker_command.py tests/component/test_fuzz_career_dedup.py \
		tests/component/test_fuzz_client_constructors.py --timeout 3600

# libFuzzer on the decoders, FUZZ_SECONDS per target; findings are saved in FUZZ_ARTIFACTS.
FUZZ_SECONDS ?= 60
FUZZ_ARTIFACTS ?= bench/results/fuzz
fuzz-atheris: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,fuzz]'
	mkdir -p $(FUZZ_ARTIFACTS)
	for target in frames records properties locks.json offsets.json topics.json; do \
		$(PY) -m tests.atheris_decoders $$target -max_total_time=$(FUZZ_SECONDS) \
			-artifact_prefix=$(FUZZ_ARTIFACTS)/$$target- || exit 1; \
	done

# Clients written by others (PyPI rocketmq 0.4.4, i.e. rocketmq-client-cpp 1.2.3; npm ali-ons
# 3.12.0; RocketMQ 5's PyPI rocketmq-python-client 5.1.2 and npm rocketmq-client-nodejs
# 1.0.8), each in its own environment under ~/.cache/ordermq/interop, never in .venv; the interop
# tests install them on first use as well, and skip with the reason when they cannot;
# interop-setup fails when one of them cannot be installed.
interop-setup: $(STAMP)
	$(PY) -m tests.interop.provision

interop: bytecode
	$(PY) -m pytest -q -m interop

demo: bytecode
	$(PY) examples/demo.py

bench: bytecode
	$(PY) bench/run.py

# The same workload on Redis Streams, RabbitMQ and NATS JetStream (installs them if missing).
bench-backlog: $(STAMP)
	$(PY) bench/run.py --only backlog --output bench/results/backlog.json

# Disk and broker RSS per million messages (about a minute, 1.7 GB of temporary disk).
bench-sizing: $(STAMP)
	$(PY) bench/sizing.py --output bench/results/sizing.json

bench-profile: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) bench/profile_shares.py

bench-peers: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) bench/peers/run.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache bench/results build/site
