"""Horovod 0.28.1's Spark integration (horovod.spark), mended at run time for pyspark 4.3.

Each mend names what it fixes; `apply()` is idempotent, imports horovod.spark (and pyspark) and is needed
on the driver only (the tasks' side of Horovod needs none).

1. A worker that fails does not stop the others: horovod.spark's Gloo launcher (`gloo_run._exec_command_fn`)
   gives each worker only the driver's shutdown event, not the `terminate_all_event` with which horovodrun's
   own Gloo launcher stops every rank when one exits non-zero. `toolkit launch --launcher spark -np 2 -- sh
   -c 'test $HOROVOD_RANK = 1 && exit 3; sleep 30'` ended with code 3 only after rank 0's 30 s (a training
   rank blocked in a collective waits for Gloo's timeout instead). Now the first worker to exit non-zero
   aborts the others' commands through their task services, as horovodrun does; elastic runs keep
   Horovod's own behaviour.
2. The workers' output arrives only when they end: the driver copies each task's captured stdout/stderr with
   `shutil.copyfileobj` from a `codecs.StreamReader` over the socket (`network.BasicClient._send_one`), whose
   `read(65536)` waits for 64 KiB or the end of the stream. A job's `echo start; sleep 20; echo end` printed
   both lines at once 20 s later, and a training's epoch lines came after its last epoch. Now what has
   arrived is written at once, a chunk as it comes (`read1`, decoded incrementally as UTF-8).
3. A driver that is stopped cannot tell: Horovod's launcher turns SIGTERM into an event of its own
   (`register_shutdown_event`), aborts the workers, then raises as if one had failed (`Exit code: 143`), so
   `toolkit launch --launcher spark --timeout 25` printed `worker 0 was lost ...` before its own timeout
   line. The launcher's events are now kept: `stopped()` says whether it was told to stop.
"""
from __future__ import annotations

import codecs
import shutil
import threading

_applied = False
_shutdown_events: list = []


def stopped() -> bool:
    """Whether Horovod's launcher in this process was told to stop (SIGTERM, SIGINT)."""
    return any(event.is_set() for event in _shutdown_events)


class _EagerCopy:
    """horovod's `network` module's `shutil`, whose copyfileobj writes a socket's text as it arrives."""

    def __getattr__(self, name):
        return getattr(shutil, name)

    @staticmethod
    def copyfileobj(src, dst, length=0):
        raw = getattr(src, "stream", None)
        if not isinstance(src, codecs.StreamReader) or not hasattr(raw, "read1"):
            return shutil.copyfileobj(src, dst, length) if length else shutil.copyfileobj(src, dst)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            chunk = raw.read1(1 << 16)
            text = decoder.decode(chunk, final=not chunk)
            if text:
                dst.write(text)
                dst.flush()
            if not chunk:
                return


def apply() -> None:
    global _applied
    if _applied:
        return
    from horovod.runner import gloo_run as runner_gloo_run
    from horovod.runner.common.util import network
    from horovod.spark import gloo_run

    original = gloo_run._exec_command_fn

    def _exec_command_fn(driver, key, settings, env, stdout, stderr, prefix_output_with_timestamp):
        exec_command = original(driver, key, settings, env, stdout, stderr, prefix_output_with_timestamp)
        if getattr(settings, "elastic", False):
            return exec_command
        stop_all = threading.Event()

        def _exec_command(command, slot_info, events):
            exit_code, when = exec_command(command, slot_info, list(events or []) + [stop_all])
            if exit_code != 0:
                stop_all.set()
            return exit_code, when
        return _exec_command

    gloo_run._exec_command_fn = _exec_command_fn
    network.shutil = _EagerCopy()

    register = runner_gloo_run.register_shutdown_event

    def register_shutdown_event():
        event = register()
        _shutdown_events.append(event)
        return event

    runner_gloo_run.register_shutdown_event = register_shutdown_event
    _applied = True
