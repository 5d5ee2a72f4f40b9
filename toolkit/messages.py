"""Every line the toolkit itself writes to stderr, in one of two forms, both written here:

- `toolkit: <label>: <message>`: an error (`error`: the one line bad input gets), a stop
  (`stopped`: a preemption), a launcher's own notice (`launch`);
- rank 0's progress lines (`say`: the epoch lines, a resume, a warning), unless `quiet`;
and the progress bars (`bar`: tqdm's, on a terminal only, so logs stay clean).

Each line goes out in one write: launchers tag output by the chunk they read, and a line written in
two pieces can be interleaved with another rank's.
"""
from __future__ import annotations

import sys


def line(label: str, message) -> str:
    return f"toolkit: {label}: {message}"


def write(text: str, stream=None) -> None:
    stream = stream or sys.stderr
    stream.write(text + "\n")
    stream.flush()


def print_error(error: Exception) -> None:
    """The one `toolkit: error: <message>` line (or the error's own label: `stopped`)."""
    write(line(getattr(error, "label", "error"), error))


def say(rank: int, message: str, quiet: bool = False) -> None:
    """One line on rank 0's stderr (progress), unless `quiet`."""
    if rank == 0 and not quiet:
        write(message)


def bar(total: int, desc: str, unit: str, initial: int = 0):
    """tqdm's bar on stderr when stderr is a terminal (None elsewhere, or without tqdm: the `progress` extra)."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=False, file=sys.stderr, dynamic_ncols=True)
