"""How gradients and state move for torch: one module per backend (adapters/strategy.py)."""
