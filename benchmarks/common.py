"""What every benchmark shares: markdown tables, the machine a table was measured on, and writing a
table into its docs page between markers.

A docs page holds each generated block between `<!-- NAME:begin -->` and `<!-- NAME:end -->` (the
one marker syntax); `write_between` replaces what lies between them and nothing else.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, Iterator, Sequence

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


# -- tables ----------------------------------------------------------------------------------------

def row(cells: Sequence[object]) -> str:
    """One markdown table row: `| a | b |`."""
    return "| " + " | ".join(map(str, cells)) + " |"


def table(header: Sequence[str], rows: Iterable[Sequence[object] | str]) -> str:
    """A markdown table: the header, its `|---|` line, then each row: its cells, or a line already
    written (a failed row: `| name | failed: why | | |`)."""
    lines = [row(header), "|" + "---|" * len(header)]
    lines += [r if isinstance(r, str) else row(r) for r in rows]
    return "\n".join(lines)


# -- timing -----------------------------------------------------------------------------------------

def alternating(blocks: dict, rounds: int) -> dict:
    """{name: [seconds of each timed run]} of the callables `blocks`, each run once untimed first
    (graphs, allocators, Horovod's first cycles), then `rounds` rounds in ABBA order (the machine's drift
    hits every block alike; no block always goes first)."""
    for block in blocks.values():
        block()
    seconds: dict = {name: [] for name in blocks}
    order = list(blocks.items())
    for r in range(rounds):
        for name, block in (order if r % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            block()
            seconds[name].append(time.perf_counter() - t0)
    return seconds


# -- a commit's code beside the working tree's -------------------------------------------------------

def which_toolkit(code: Path) -> str:
    """The toolkit and adapters a job launched from `code` imports (the venv maps both to the checkout)."""
    env = dict(os.environ, PYTHONPATH=str(code))
    script = "import toolkit, toolkit.adapters as a; print(toolkit.__file__, a.__file__)"
    return subprocess.run([sys.executable, "-c", script], cwd=code, env=env,
                          capture_output=True, text=True, check=True).stdout.strip()


@contextlib.contextmanager
def before_and_after(commit: str, worktree: Path) -> Iterator[dict]:
    """{"before": `commit` checked out in `worktree`, "after": ROOT}, each checked to import its own toolkit
    (a job runs with PYTHONPATH and cwd set to one of them); the worktree is removed at the end."""
    subprocess.run(["git", "worktree", "add", "--detach", "--force", str(worktree), commit], cwd=ROOT, check=True,
                   capture_output=True)
    # the editable install maps toolkit.adapters to this checkout's adapters/: the worktree's own, by a link
    (worktree / "toolkit" / "adapters").symlink_to(worktree / "adapters")
    try:
        codes = {"before": worktree, "after": ROOT}
        for name, code in codes.items():
            for found in which_toolkit(code).split():
                if not found.startswith(str(code)):
                    raise SystemExit(f"{name}: imports {found}, not {code}'s toolkit")
        yield codes
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, capture_output=True)


# -- the machine -----------------------------------------------------------------------------------

def today() -> str:
    return datetime.date.today().isoformat()


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` knows."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.processor())


def cores() -> str:
    """`2 CPU cores (x86_64)`: the short form in the API and async tables."""
    return f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()})"


def machine() -> str:
    """`2026-11-23, Intel(R) Xeon(R) Processor, 2 cores, Linux 6.x, Python 3.11.7`: date, CPU, cores,
    kernel and Python, the long form most tables are stamped with."""
    return (f"{today()}, {cpu_model()}, {os.cpu_count()} cores, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")


def horovod_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("horovod")
    except PackageNotFoundError:
        return "not installed"


# -- docs ------------------------------------------------------------------------------------------

def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def write_between(doc: Path, name: str, text: str) -> None:
    """Replace what lies between the `name` markers in `doc` (a path, or a file name in docs/) by `text`."""
    path = doc if Path(doc).is_absolute() else DOCS / doc
    begin, end = markers(name)
    current = path.read_text()
    if begin not in current or end not in current:
        raise SystemExit(f"{path} has no {begin} ... {end} markers to write between")
    path.write_text(current[:current.index(begin)] + f"{begin}\n{text}\n{end}"
                    + current[current.index(end) + len(end):])
    print(f"wrote {path} ({name})", file=sys.stderr)
