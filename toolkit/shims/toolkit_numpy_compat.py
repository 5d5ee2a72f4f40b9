"""Restore `numpy.bool` for MXNet 1.9.1 on numpy 1.26, lazily.

Installed into site-packages with a one-line `toolkit_numpy_compat.pth`, so it runs in every
Python process of the environment, horovodrun's build-check subprocess included. It costs one
entry on `sys.meta_path`: numpy is imported (and patched) only when something imports mxnet.
"""
import sys


class _PatchNumpyBeforeMxnet:
    def find_spec(self, name, path=None, target=None):
        if name == "mxnet":
            sys.meta_path.remove(self)
            import numpy

            if "bool" not in vars(numpy):  # hasattr would trip numpy 1.26's FutureWarning
                numpy.bool = bool
        return None  # let the normal finders import the module


if not any(type(f).__name__ == "_PatchNumpyBeforeMxnet" for f in sys.meta_path):
    sys.meta_path.insert(0, _PatchNumpyBeforeMxnet())
