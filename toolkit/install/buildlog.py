"""What a Horovod build is doing, read from its log while pip runs it: CMake's percent of the build steps
(`[ 45%] Building CXX object ...`), said every 30 s on a terminal (every 5 minutes elsewhere, never under CI),
with the time so far; and the build's duration at the end."""
from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path

_STEP = re.compile(r"^\s*\[\s*(\d+)%\]\s*(.*)$", re.M)


def progress(text: str) -> str:
    """`45% of the build steps (Building CXX object horovod/torch/...)`, or where the build is before CMake's steps."""
    steps = _STEP.findall(text)
    if steps:
        percent, what = steps[-1]
        return f"{percent}% of the build steps ({what.strip()[:80]})"
    return "configuring (CMake)" if "cmake" in text.lower() else "preparing the sources"


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def default_every() -> float | None:
    """Seconds between progress lines: 30 on a terminal, 300 elsewhere, None (no lines) under CI."""
    if os.environ.get("CI"):
        return None
    return 30.0 if sys.stdout.isatty() else 300.0


class Progress:
    """`with Progress(log, say):` around the build: a line every `every` seconds while it runs; `took()` after."""

    def __init__(self, log_path: Path, say, every: float | None = None):
        self.log_path, self.say = Path(log_path), say
        self.every = default_every() if every is None else every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = self._end = 0.0

    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        if self.every:
            self._thread = threading.Thread(target=self._run, daemon=True, name="toolkit-build-progress")
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._end = time.monotonic()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        assert self.every
        while not self._stop.wait(self.every):
            try:
                text = self.log_path.read_text(errors="replace")
            except OSError:
                text = ""
            self.say(f"horovod: {progress(text)}; {minutes(time.monotonic() - self._start)} so far")

    def took(self) -> str:
        return minutes((self._end or time.monotonic()) - self._start)
