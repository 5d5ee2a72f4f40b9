"""`toolkit.adapters`: one package per framework (`torch/`, `tensorflow/`, `mxnet/`), each with a
session implementing `base.Session` (the public API) and its built-in models.

The folder sits at the top of the checkout; it installs as `toolkit.adapters` (pyproject's
package-dir), so it never shadows, nor is shadowed by, another package called `adapters`. Imported
only through `toolkit.registry`, when its framework is chosen.
"""
