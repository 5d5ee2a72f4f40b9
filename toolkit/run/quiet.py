"""TensorFlow's C++ start-up chatter kept off stderr (`framework_logs: false`, the default).

TensorFlow 2.21 logs through absl before absl's logging is initialised, so its INFO lines (oneDNN,
cpu_feature_guard, gRPC in the multi-worker strategy) go to stderr whatever TF_CPP_MIN_LOG_LEVEL
says: 6-20 lines per rank before anything useful. They are written by C++ straight to file
descriptor 2, so the only place to drop them is that descriptor: `filter_stderr()` points fd 2 at a
pipe read by a small relay process that copies every line to the real stderr except those. A
process (not a thread) relays, so nothing is lost when the training process crashes or is killed:
the relay ends when the last writer has gone. Warnings, errors and every other line pass through.
"""
from __future__ import annotations

import os
import re
import signal

# absl's INFO lines ("I1123 08:41:22.164884    9163 port.cc:153] ..."), its notice that it is not
# initialised, and the lines that continue an INFO message (cpu_feature_guard's second line, the
# task names after the coordination service's "Example stragglers:").
NOISE = re.compile(rb"^(I\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w./-]+:\d+\] |"
                   rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR)")
CONTINUATION = re.compile(rb"^(To enable the following instructions: .*|/job:\S+)$")


def is_noise(line: bytes, after_noise: bool = False) -> bool:
    return bool(NOISE.match(line) or (after_noise and CONTINUATION.match(line)))


def _relay(read_fd: int) -> None:
    """The relay process: lines from the pipe to the real stderr (fd 2), minus the noise."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # it ends when the writers are gone, not before
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pending, after_noise = b"", False
    while True:
        try:
            chunk = os.read(read_fd, 65536)
        except InterruptedError:
            continue
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        keep = []
        for line in lines:
            after_noise = is_noise(line, after_noise)
            if not after_noise:
                keep.append(line + b"\n")
        if keep:
            os.write(2, b"".join(keep))
    if pending and not is_noise(pending, after_noise):
        os.write(2, pending)


def quiet_framework_logs(config) -> None:
    """Before the framework is imported: TensorFlow's C++ INFO lines off stderr, unless `framework_logs`."""
    if config.framework == "tensorflow" and not config.framework_logs:
        filter_stderr()


def filter_stderr() -> None:
    """From now on this process's fd 2 (and its children's) passes through the relay. Call it
    before TensorFlow is imported and before any thread starts (it forks)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:                        # the relay: keep only the pipe and the real stderr
        try:
            os.close(write_fd)
            os.closerange(3, read_fd)
            os.closerange(read_fd + 1, 4096)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)         # never hold the launcher's stdout pipe open
            _relay(read_fd)
        finally:
            os._exit(0)
    os.close(read_fd)
    os.dup2(write_fd, 2)
    os.close(write_fd)
