"""`toolkit.elastic`: the public name (docs/API.md) of toolkit/run/elastic.py, the same module object, so
state set through one name is seen through the other."""
import sys

from toolkit.run import elastic as _module

sys.modules[__name__] = _module
