# The two commands a newcomer needs: `make demo` (a real 2-rank training) and `make test`.
# Both run `make setup` first, which is idempotent and cached (~1 min after the first time).
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: setup demo test
setup:
	$(PYTHON) -m toolkit setup

demo: setup
	$(BIN)/toolkit launch -np 2 --gloo --timeout 600 -- $(BIN)/python examples/train.py \
		--framework torch --dataset digits --epochs 15 --checkpoint-dir runs/demo

test: setup
	$(BIN)/python -m pytest -q tests
