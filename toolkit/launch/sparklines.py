"""The lines of a Spark job's workers as they reach the driver: Horovod's task tag dropped where the rank's own
tag follows, `<stdout>` lines put back on stdout, a worker's failure note kept instead of shown, and the
driver's report of a failed worker (engines.EXIT, which settles `toolkit launch`'s relay)."""
from __future__ import annotations

import contextlib
import re
import sys
import threading
from collections.abc import Iterator
from typing import Optional

from toolkit.launch import engines

TASK_TAG = re.compile(r"^\[\d+\]<std(?:out|err)>:")            # Horovod's tag: the Spark task's index
RANK_TAG = re.compile(r"^\[\d+\]<(std(?:out|err))>:")


class Lines:
    """A text stream that takes chunks from several threads and writes whole lines: Horovod's task tag
    dropped where the rank's own tag follows (`strip`), `<stdout>` lines sent to `out` (`route`), and a
    worker's failure note kept in `failures` instead of shown."""

    def __init__(self, err, out=None, strip: bool = True, route: bool = False):
        self.err, self.out, self.strip, self.route = err, out or err, strip, route
        self.failures: list[tuple[int, int]] = []
        self.lock, self.local = threading.Lock(), threading.local()
        self.parts: list = []

    def write(self, text: str) -> int:
        part = getattr(self.local, "part", None)
        if part is None:
            part = self.local.part = [""]
            with self.lock:
                self.parts.append(part)
        part[0] += text
        *lines, part[0] = part[0].split("\n")
        for line in lines:
            self._line(line)
        return len(text)

    def _line(self, line: str) -> None:
        if self.strip and (m := TASK_TAG.match(line)) and (RANK_TAG.match(line[m.end():]) or
                                                          engines.FAILED_NOTE.match(line[m.end():])):
            line = line[m.end():]
        if m := engines.FAILED_NOTE.match(line):
            with self.lock:
                self.failures.append((int(m.group(1)), int(m.group(2))))
            return
        stream = self.out if self.route and (m := RANK_TAG.match(line)) and m.group(1) == "stdout" else self.err
        with self.lock:
            stream.write(line + "\n")
            stream.flush()

    def flush(self) -> None:
        self.err.flush()
        self.out.flush()

    def close(self) -> None:
        """What is left of a line without its newline."""
        for part in self.parts:
            if part[0]:
                self._line(part[0])
                part[0] = ""

    def failed(self) -> Optional[tuple[int, int]]:
        return self.failures[0] if self.failures else None


@contextlib.contextmanager
def quiet_threads() -> Iterator[list[BaseException]]:
    """A thread that dies with an exception (Horovod's Spark thread, when the Spark job failed) prints its
    traceback: keep the exceptions for the one line instead."""
    caught: list[BaseException] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: caught.append(args.exc_value)     # type: ignore[arg-type]  # a dead thread's: set
    try:
        yield caught
    finally:
        threading.excepthook = previous


def exit_line(rank: int, code: int) -> int:
    print(engines.EXIT.format(rank=rank, code=code), file=sys.stderr, flush=True)
    return code
