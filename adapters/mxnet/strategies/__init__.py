"""How gradients and state move for MXNet: one module per backend (adapters/strategy.py)."""
