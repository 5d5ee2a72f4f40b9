"""The benchmarks behind docs/: run from the repository root as `.venv/bin/python -m benchmarks.<name>`
(benchmarks/README.md lists them). Not part of the installed toolkit."""
