# Two commands do all set-up: `make serve` and `make test`. Each creates .venv
# when missing and (re)installs the project only when pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: serve test test-unit test-faults test-gateway-processes test-vllm lint install clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[engine,dev]'
	@# xgrammar's own dependencies come with the engine extra; --no-deps keeps out triton
	@# (1 GB, GPU only). Keep this version equal to the `structured` extra's.
	$(PY) -m pip install --quiet --no-deps 'xgrammar==0.2.8'
	@touch $(STAMP)

install: $(STAMP)

# The history tests start a PostgreSQL server of their own: .ci/ensure-postgres installs
# Debian's package when its programs are missing (and does nothing otherwise).
test: $(STAMP)
	.ci/ensure-postgres
	$(PY) -m pytest -q

# The fast loop: unit tests that load no trained model, start no other process and run
# no long property-based suite (about a minute on 2 cores; `make test` runs them all).
test-unit: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/unit -m "not weights and not processes and not fuzz"

# The fault-injection suite alone (issue 38; `make test` runs it too): workers killed and
# frozen at each phase, the network reset and stalled, garbage frames, PostgreSQL stopped.
FAULT_TESTS := tests/integration/test_fault_matrix.py tests/integration/test_fault_encode_and_net.py \
	tests/integration/test_fault_proxy.py tests/integration/test_gateway_faults.py \
	tests/integration/test_pd_faults.py tests/integration/test_stream_faults.py \
	tests/integration/test_history_outage.py tests/unit/gateway/workers/test_garbled_frames.py \
	tests/unit/gateway/workers/test_wrong_request_id.py tests/integration/test_chaos_smoke.py
test-faults: $(STAMP)
	.ci/ensure-postgres
	$(PY) -m pytest -q -p no:cacheprovider $(FAULT_TESTS)

# The integration suite with every test gateway run as `--processes 2` (issue 36): two
# gateway processes on one port (tests/integration/processes.py reads the variable); the
# gateways whose tests need one process say `--processes 1`, marked `# single_process:`.
test-gateway-processes: $(STAMP)
	.ci/ensure-postgres
	TANDEM_TEST_GATEWAY_PROCESSES=2 $(PY) -m pytest -q -p no:cacheprovider tests/integration

# Compatibility lane: Tandem's gateway in front of real vLLM CPU workers, and smg (the
# reference gateway) in front of Tandem's workers. vLLM and smg live in their own virtualenvs
# under ~/.cache/tandem (built on first use, reused after), never in .venv.
test-vllm: $(STAMP)
	$(PY) -m tests.compat.vllm_env
	$(PY) -m pytest -q -p no:cacheprovider --durations=8 tests/compat

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy

serve: $(STAMP)
	$(VENV)/bin/tandem serve

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info

# Side-by-side with smg over null workers (minutes; not part of `make test`). smg and
# matplotlib go into their own virtualenvs under ~/.cache/tandem/bench, never into .venv.
.PHONY: bench
bench: $(STAMP)
	$(PY) -m bench.side_by_side --out docs/benchmarks
	$(PY) -m bench.report docs/benchmarks
