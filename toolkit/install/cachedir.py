"""The toolkit's cache folder: TOOLKIT_CACHE_DIR, else $XDG_CACHE_HOME/toolkit, else ~/.cache/toolkit.
Horovod's builds (`horovod/`), setup's kept virtualenvs (`venvs/`) and the type check's cache (`mypy/`) live there."""
from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("TOOLKIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "toolkit"))
