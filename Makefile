# The two commands a newcomer needs: `make demo` (a real 2-rank training) and `make test`.
# Both run `make setup` first, which is idempotent and cached (seconds when nothing changed; seconds in a fresh
# clone whose pins an earlier setup kept, ~/.cache/toolkit/venvs; the first one builds Horovod: docs/BENCHMARKS.md).
PYTHON ?= python3.11
# Each Python its own virtualenv: .venv for the pinned one (toolkit/install/pins.py), .venv-3.12 for
# `make setup PYTHON=python3.12` (then `make test PYTHON=python3.12` tests that one).
VENV   ?= $(shell $(PYTHON) -c 'from toolkit.install import envsetup; print(envsetup.default_venv().name)' 2>/dev/null || echo .venv)
BIN    := $(VENV)/bin
# As root the two-host test (network namespaces) must run, not skip; 0 lets it skip with its reason.
TOOLKIT_REQUIRE_MULTIHOST ?= $(shell [ "$$(id -u)" = 0 ] && echo 1 || echo 0)
export TOOLKIT_REQUIRE_MULTIHOST

# The cluster engines setup adds (`ray,spark`, `all`; toolkit/install/pins.py ENGINES): none for `make setup` and
# `make demo`, both for `make test` (the Ray and Spark tests).
ENGINES ?=

.PHONY: setup demo test check lint types matrix support
setup:
	$(PYTHON) -m toolkit setup --venv $(VENV)$(if $(ENGINES), --engines $(ENGINES))

demo: setup
	rm -rf runs/demo
	$(BIN)/toolkit launch -np 2 --gloo --timeout 600 -- $(BIN)/python examples/train.py \
		--framework torch --dataset digits --epochs 15 --checkpoint-dir runs/demo

# Horovod must import for every framework first: a broken build fails here instead of skipping
# most of the suite. -rs prints every skip's reason. Its setup adds the engines (a target's variable
# reaches its prerequisites). The suite runs on TEST_WORKERS pytest workers (pytest-xdist; a whole file
# per worker, so a module's cluster or baseline is made once; 0: in one process), then the tests marked
# `serial` alone, one at a time (shaped links, kills timed into a write); both parts always run.
TEST_WORKERS ?= 2
test: ENGINES = ray,spark
test: setup
	$(BIN)/toolkit doctor --framework all
	$(MAKE) --no-print-directory lint types
	export TOOLKIT_REQUIRE_ENGINES=1; \
	$(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --dist loadfile -m "not serial" tests; rest=$$?; \
	$(BIN)/python -m pytest -q -rs -m serial tests && exit $$rest     # the Ray and Spark tests run, not skip

# The fast tier, before every commit (under 5 minutes on 2 cores): lint, types, the unit tests and one
# real 2-rank job per framework (tests/fast_tier.txt lists them). `make test` stays the whole suite.
check: setup
	$(MAKE) --no-print-directory lint types
	$(BIN)/python -m pytest -q -rs $$(grep -v '^#' tests/fast_tier.txt)

# ruff (pyproject's [tool.ruff]: pyflakes, pycodestyle's errors, import order) and mypy (tests/typecheck.py)
lint:
	$(BIN)/ruff check .

types:
	$(BIN)/python tests/typecheck.py

# The toolchain matrix (docs/TOOLCHAINS.md): Horovod built and 2 ranks trained in Debian 12 and 13
# containers (buildah, debootstrap bases). Root, buildah and debootstrap; about 10 min a row on 2 cores.
matrix:
	bash docker/matrix.sh

# The support table (docs/INSTALL.md): the toolkit's wheel installed into a fresh virtualenv per
# framework version and Python (toolkit/install/support.py), Horovod built there, 2 ranks trained.
# About 10 minutes a row that compiles Horovod on 2 cores; not part of `make test` (one row is).
support: setup
	$(BIN)/python -m benchmarks.support_matrix --write-docs
