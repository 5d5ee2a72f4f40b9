"""What `toolkit launch` prints of its launcher's output: every rank's lines as they come, and for a
job that failed, the ranks' own one-line errors instead of the launcher's traceback.

horovodrun and `mpirun --tag-output` tag each rank's line (`[1]<stderr>:` over Gloo,
`[1,1]<stderr>:` over MPI). Untagged lines are the launcher's own. When a rank exits non-zero,
horovodrun raises (a 20-line traceback, sometimes a second one from its Gloo thread) and mpirun
prints a banner (also for a rank that called MPI_Abort: the parameter server's stop); both name the
rank and its exit code. Those lines are held back from the first
sign of them; at the end, if a rank's failure explains them, they are dropped and the job's exit
code is that rank's (horovodrun itself exits 1 whatever the rank's code). A rank that failed without
a `toolkit: error:` line of its own gets one from the launcher. A launcher that failed by itself
(no rank did) is reduced to its last line, e.g. horovodrun's ssh check. Anything not recognised is
printed as it came. mpirun's banner for daemons it could not start over ssh is reduced to ssh's own
lines (`Permission denied (publickey)`, `Host key verification failed.`).

The Ray and Spark drivers (engines.py) pass on their workers' lines tagged as horovodrun's (Ray's
own prefix on them dropped) and report a worker's non-zero exit in one line, settled as horovodrun's.

torchrun (launchers/torchrun.py) tags its ranks' lines `[rank]<std>:` on either stream; they are shown as
horovodrun's, `[rank]<stdout>:` or `[rank]<stderr>:`. When a rank fails, torchrun logs which one,
raises ChildFailedError (a 20-line traceback) and prints a report whose "Root Cause" names the
rank and its exit code (the ranks it stopped itself are listed above it, exit code -15): that is
held back and dropped like horovodrun's, and a rank killed by signal N exits 128 + N.
"""
from __future__ import annotations

import re
import sys
import threading
from typing import IO

from toolkit.messages import line

TAG = re.compile(r"^\[(?:\d+,)?(\d+)\]<std(?:out|err)>:")
TORCHRUN_TAG = re.compile(r"^\[(\d+)\]<std>:")     # launcher.TORCHRUN_TAG, which does not say the stream
TORCHRUN_PIECE = re.compile(r"\[(\d+)\]<std>:")    # the same tag anywhere in a line: pieces of two ranks' lines
TORCHRUN_LOG = r"[WE]\d{4} [\d:.]+ +\d+ \S*torch/distributed/elastic/"    # torchrun's own warnings and errors
SSH_SAID = re.compile(r"^(ssh: |(\S+: )?Permission denied \(|Host key verification failed)")   # ssh's lines
HOLD_FROM = re.compile(r"^(Traceback \(most recent call last\):|Exception in thread |-{20,}\s*$|"
                       r"Process \d+ exit with status code [1-9]\d*\.|Terminating remaining workers|"
                       r"ssh not successful for host |\[[^\]]+\] \S+ ORTE_ERROR_LOG: |={20,}\s*$|" + TORCHRUN_LOG +
                       "|" + SSH_SAID.pattern[1:] + ")")
SSH_FAILED = re.compile(r"^ssh not successful for host (\S+?):?\s*$")
EXIT_CODE = re.compile(r"^\s*(?:Exit code:\s+(\d+)\s*$|exitcode\s*:\s*(-?\d+) )")    # horovodrun/mpirun, torchrun
PROCESS = re.compile(r"^\s*(?:Process name:\s+(?:\[\[\d+,\d+\],)?(\d+)\]?\s*$|rank\s*:\s*(\d+) )")
ROOT_CAUSE = re.compile(r"^Root Cause \(first observed failure\):")     # torchrun's report: the rank that failed
ABORT_RANK = re.compile(r"^MPI_ABORT was invoked on rank (\d+) ")      # mpirun's banner for MPI_Abort
ABORT_CODE = re.compile(r"^with errorcode (\d+)\.")
ORTE_LOG = re.compile(r"^\[[^\]]+\] \S+ ORTE_ERROR_LOG: ")    # Open MPI's own internal errors
ORTE_NO_DAEMONS = re.compile(r"^ORTE was unable to reliably start one or more daemons")  # mpirun's ssh banner
RANK_ERROR = re.compile(r"toolkit: (error|stopped): ")    # a rank's own line: an error, or a preemption's stop
# Ray's prefix on a worker's line forwarded to the driver (`(BaseHorovodWorker pid=12, ip=10.0.0.2) `, colored),
# and an engine driver's report of a worker's exit (engines.py): held back as horovodrun's.
ENGINE_PREFIX = re.compile(r"^(?:\x1b\[\d+m)?\((?:\w|\.)+ pid=\d+(?:, ip=[^)]*)?\)(?:\x1b\[0m)? ")
ENGINE_EXIT = re.compile(r"^toolkit: launch: worker (\d+) exited with code (\d+)\s*$")


class Relay:
    """Copies a launcher's stdout and stderr lines to ours, holding back its failure reports."""

    def __init__(self, out: IO[str] | None = None, err: IO[str] | None = None):
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.lock = threading.Lock()
        self.held: list[tuple[IO[str], str]] = []
        self.rank_errors = 0
        self.failed_rank: str | None = None
        self.rank_code: int | None = None
        self.root_cause = False
        self.pieces: dict[tuple[IO[str], str], str] = {}    # (stream, rank): the start of a torchrun rank's line

    def line(self, text: str, stream: IO[str], rank: int | None = None) -> None:
        """One line of the launcher's (`rank` None) or of a worker the toolkit started itself."""
        if rank is None and TORCHRUN_TAG.match(text):
            for whole in self._torchrun_lines(text, stream):
                self._line(whole, stream, None)
        else:
            self._line(text, stream, rank)

    def _torchrun_lines(self, text: str, stream: IO[str]) -> list[str]:
        """torchrun's tail threads copy whatever a rank's log file holds, a line's start too (a rank's
        `print` writes its words one by one when unbuffered), each piece under the rank's tag, so two
        ranks' pieces can share a line (`[0]<std>:sum[1]<std>:sum 3 1 2`, then `[0]<std>: 3 0 2`): the
        whole lines, each rank's pieces joined, as the rank wrote them."""
        tags = list(TORCHRUN_PIECE.finditer(text))
        whole = []
        with self.lock:
            for i, tag in enumerate(tags):
                key = (stream, tag.group(1))
                piece = text[tag.end():tags[i + 1].start() if i + 1 < len(tags) else len(text)]
                piece = self.pieces.pop(key, "") + piece
                if i + 1 < len(tags):           # cut off by another rank's piece: the rest comes later
                    self.pieces[key] = piece
                else:
                    whole.append(tag.group(0) + piece)
        return whole

    def _line(self, text: str, stream: IO[str], rank: int | None) -> None:
        with self.lock:
            text = ENGINE_PREFIX.sub("", text)
            if m := ENGINE_EXIT.match(text):
                self.held.append((stream, text))
                self.failed_rank, self.rank_code = m.group(1), int(m.group(2))
                return
            if m := TORCHRUN_TAG.match(text):
                text = f"[{m.group(1)}]<{'stderr' if stream is self.err else 'stdout'}>:" + text[m.end():]
            if rank is not None or TAG.match(text):
                if TAG.sub("", text).strip() == "Terminated":   # the shell of a rank the launcher stopped
                    return
                if RANK_ERROR.search(text):
                    self.rank_errors += 1
                self._write(stream, text)
                return
            if not self.held and not HOLD_FROM.match(text):
                self._write(stream, text)
                return
            self.held.append((stream, text))
            if ROOT_CAUSE.match(text) and not self.root_cause:   # not the ranks torchrun stopped, listed first
                self.root_cause, self.rank_code, self.failed_rank = True, None, None
            if (m := EXIT_CODE.match(text) or ABORT_CODE.match(text)) and self.rank_code is None:
                code = int(next(g for g in m.groups() if g is not None))
                self.rank_code = 128 - code if code < 0 else code       # torchrun: -N for signal N
            if (m := PROCESS.match(text) or ABORT_RANK.match(text)) and self.failed_rank is None:
                self.failed_rank = next(g for g in m.groups() if g is not None)

    @staticmethod
    def _write(stream: IO[str], text: str) -> None:
        stream.write(text if text.endswith("\n") else text + "\n")
        stream.flush()

    def pump(self, source: IO[str], stream: IO[str], rank: int | None = None) -> threading.Thread:
        """A thread copying `source` (a launcher's pipe, or worker `rank`'s) line by line."""
        def copy():
            for text in iter(source.readline, ""):
                self.line(text, stream, rank)
        thread = threading.Thread(target=copy, daemon=True)
        thread.start()
        return thread

    def worker_failed(self, rank: int, code: int) -> int:
        """A worker the toolkit started itself exited non-zero (the first one to)."""
        if not self.rank_errors:
            self._write(self.err, line("error", f"launch: worker {rank} exited with code {code}"))
        return code

    def finish(self, returncode: int) -> int:
        """After the launcher exited: settle what was held back; the job's exit code."""
        for (stream, rank), piece in list(self.pieces.items()):    # a rank's last words without a newline
            self._line(f"[{rank}]<std>:{piece}", stream, None)
        self.pieces.clear()
        if returncode == 0 or not self.held:
            for stream, text in self.held:
                self._write(stream, text)
            return returncode
        if self.rank_code is not None:          # a rank failed: its own line says why
            if not self.rank_errors:
                rank = f"rank {self.failed_rank}" if self.failed_rank is not None else "a rank"
                self._write(self.err, line("error", f"launch: {rank} exited with code {self.rank_code} "
                                                            "(its output is above)"))
            return self.rank_code or returncode
        if self.rank_errors and all(ORTE_LOG.match(t) or not t.strip() for _, t in self.held):
            # Two ranks' MPI_Abort reports met in mpirun's show_help.c and it garbled them (`Data unpack
            # would read past end of buffer`, Open MPI 4.1, with or without help aggregation): the
            # banner naming the rank is lost; the ranks' own lines above say why the job stopped.
            return returncode
        lines = [t.strip() for _, t in self.held]
        unreachable = [(m.group(1), lines[i + 1] if i + 1 < len(lines) else "")
                       for i, t in enumerate(lines) if (m := SSH_FAILED.match(t))]
        if unreachable:                         # horovodrun's ssh check, one host at a time
            hosts = ", ".join(f"{host} ({why})" if why and not why.startswith("Traceback") else host
                              for host, why in unreachable)
            self._write(self.err, line("error", f"launch: cannot reach {hosts} over ssh; check the host "
                                                    "names in -H/--hostfile and that ssh to them works without a password"))
            return returncode
        banner = next((t for t in lines if ORTE_NO_DAEMONS.match(t)), None)
        if banner:                              # mpirun could not start its daemons over ssh
            said = "; ".join(dict.fromkeys(t for t in lines if SSH_SAID.match(t))) or banner
            self._write(self.err, line("error", f"launch: mpirun could not start on the other hosts over ssh "
                                                    f"({said}); check that ssh to each of them works without a password"))
            return returncode
        last = next((t.strip() for _, t in reversed(self.held) if t.strip() and not t.startswith("-")), "")
        if last.startswith(("RuntimeError: ", "ValueError: ")):   # horovodrun's own checks
            self._write(self.err, line("error", "launch: " + last.split(": ", 1)[1]))
        else:
            for stream, text in self.held:
                self._write(stream, text)
        return returncode
