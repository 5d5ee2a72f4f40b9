"""The type check of the product (toolkit/ and adapters/, installed as toolkit.adapters), as `make types` runs it.

mypy maps a file to its module by its folder, and adapters/ installs as toolkit.adapters (pyproject's
package-dir), so the check runs on a tree of links laid out as the installed package: toolkit/'s
entries and toolkit/adapters -> adapters/. The settings are pyproject's [tool.mypy]. mypy's cache is
kept beside the toolkit's other caches (~/.cache/toolkit/mypy; under TOOLKIT_CACHE_DIR or
XDG_CACHE_HOME where set): a fresh clone checks in seconds instead of ~40 s, since mypy takes a cached
module only when its source's hash matches.

    .venv/bin/python tests/typecheck.py          # mypy's report; exit 1 on an error
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from toolkit.install import cachedir

ROOT = Path(__file__).resolve().parent.parent
CACHE = cachedir.home() / "mypy"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="toolkit-types-") as tmp:
        package = Path(tmp) / "toolkit"
        package.mkdir()
        for entry in (ROOT / "toolkit").iterdir():
            if entry.name not in ("__pycache__", "adapters"):
                (package / entry.name).symlink_to(entry)
        (package / "adapters").symlink_to(ROOT / "adapters")
        cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
               "--cache-dir", str(CACHE), "-p", "toolkit"]
        return subprocess.run(cmd, cwd=tmp).returncode


if __name__ == "__main__":
    sys.exit(main())
