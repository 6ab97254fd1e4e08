# kruntimes — the two commands are `make demo` and `make test`; both set everything up.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: all venv test lint typecheck pytest proto openapi demo bench clean

all: test

$(STAMP): pyproject.toml scripts/system-packages.sh
	@sh scripts/system-packages.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,chart]'
	@touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

typecheck: $(STAMP)
	$(VENV)/bin/mypy kruntimes

# Test processes (pytest-xdist, a whole file to each; 0: one process, no xdist): two where the
# machine has two CPUs or more, since most of a platform test waits (docs/contributing.md).
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ "$$n" -ge 2 ] && echo 2 || echo 0)

pytest: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test: lint typecheck pytest

proto: $(STAMP)
	$(PY) proto/generate.py

openapi: $(STAMP)
	$(PY) -m kruntimes.gateway.openapi

demo: $(STAMP)
	$(PY) -m kruntimes.workers.demo

bench: $(STAMP)
	$(PY) bench/runtime_server.py
	$(PY) bench/invoke.py
	$(PY) bench/lifecycle.py
	$(PY) bench/function_start.py
	$(PY) bench/codec.py
	$(PY) bench/kubernetes.py
	$(PY) bench/gateway_memory.py
	$(PY) bench/reconcile.py
	$(PY) bench/async_invoke.py

# Mutation testing of the pure decision code (docs/mutation.md); not part of `make test`. mutmut works
# in a copy (mutants/), one module at a time, one worker at the lowest priority.
MUTATE_MODULES ?= kruntimes.decisions.scheduling kruntimes.decisions.hostlife kruntimes.decisions.runlife \
	kruntimes.decisions.reconciling kruntimes.gateway.auth.cache kruntimes.wire.frames kruntimes.krm.tags

.PHONY: mutate
mutate: $(STAMP)
	rm -rf mutants && mkdir mutants
	@for module in $(MUTATE_MODULES); do \
		echo "mutmut: $$module (log: mutants/$$module.log)"; \
		nice -n 19 $(VENV)/bin/mutmut run --max-children 1 "$$module.*" > mutants/$$module.log 2>&1 \
			|| { tail -n 40 mutants/$$module.log; exit 1; }; \
	done
	@! grep -rlR --include='*.py' 'mutmut generated' kruntimes tests || { echo 'a mutant in the tree'; exit 1; }
	$(PY) -m tests.mutation.score --survivors

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
