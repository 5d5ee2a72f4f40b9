"""Elastic training (issue 6): a worker is killed mid-run, training goes on with fewer workers, then
a new host appears in the discovery script's output and the job grows back; the replicas end equal.

One machine: the "hosts" are names of this machine (localhost, 127.0.0.1, its hostname), which
Horovod treats as separate hosts (a failed host is blacklisted, so the kill removes exactly one)
and starts locally without ssh; Gloo talks over `--network-interface lo`.
"""
import json
import re
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest
import yaml

from tests.conftest import TRAIN, clean_env, digits, horovod_status, kill_rank, started

pytestmark = pytest.mark.distributed

EPOCH = re.compile(r"epoch (\d+)/\d+ .* on (\d+)$")


def _local_name() -> str | None:
    """A third name for this machine that Horovod starts locally: the hostname, if it resolves here."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        return None
    local = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    return name if address in local and name not in ("localhost", "127.0.0.1") else None


class Lines:
    """The job's merged output, read on a thread; wait() for a line that matches."""

    def __init__(self, stream):
        self.lines, self._cv = [], threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream):
        for line in stream:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self.lines.append(None)
            self._cv.notify_all()

    def wait(self, predicate, what: str, timeout: float = 120, since: int = 0):
        """The first non-None predicate(line) among lines from index `since` on, waiting up to timeout s."""
        deadline, seen = time.monotonic() + timeout, since
        with self._cv:
            while True:
                for line in self.lines[seen:]:
                    if line is None:
                        raise AssertionError(f"the job ended before {what}:\n" + self.tail())
                    if (m := predicate(line)) is not None:
                        return m
                seen = len(self.lines)
                left = deadline - time.monotonic()
                assert left > 0, f"no {what} within {timeout} s:\n" + self.tail()
                self._cv.wait(left)

    def tail(self) -> str:
        return "\n".join(ln for ln in self.lines[-40:] if ln is not None)


def epoch_on(n: int, after: int = 0):
    """Predicate: an epoch line of rank 0 trained on n workers, later than epoch `after`."""
    def match(line):
        m = EPOCH.search(line)
        return int(m.group(1)) if m and int(m.group(2)) == n and int(m.group(1)) > after else None
    return match


@pytest.mark.parametrize("fw, epochs", [("torch", 8), ("tensorflow", 8)])
def test_a_killed_worker_shrinks_the_job_and_a_new_host_grows_it_back(tmp_path, fw, epochs):
    if why := horovod_status(fw):
        pytest.skip(f"horovod.{fw} does not import: {why}")
    third = _local_name()
    if third is None:
        pytest.skip(f"the hostname {socket.gethostname()!r} does not resolve to an address of this machine")
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    config = tmp_path / "elastic.yaml"      # the launcher and the ranks read the same block
    config.write_text(yaml.safe_dump({"elastic": {"min_np": 1, "max_np": 2, "discovery": str(discover),
                                                  "commit_every": 5},
                                      "epochs": epochs, "straggler": "0:60,1:60"}))
    argv = [sys.executable, "-m", "toolkit", "launch", "-np", "2", "--network-interface", "lo", "--timeout", "400",
            "--", *TRAIN, *digits(fw), "--config", config]
    with started(argv, stderr=subprocess.STDOUT, env=clean_env(HOROVOD_ELASTIC_TIMEOUT="120")) as job:
        out, t0 = Lines(job.stdout), time.monotonic()
        first = out.wait(epoch_on(2), "an epoch on 2 workers")
        t_kill = time.monotonic() - t0
        kill_rank(str(config), host="127.0.0.1")
        shrunk = out.wait(epoch_on(1, after=first), "an epoch on 1 worker after the kill")
        t_shrunk = time.monotonic() - t0
        hosts.write_text(f"localhost:1\n127.0.0.1:1\n{third}:1\n")     # 127.0.0.1 is blacklisted now
        grown = out.wait(epoch_on(2, after=shrunk), "an epoch on 2 workers again", timeout=180)
        assert grown < epochs, "the job grew back only at its end"
        t_grown = time.monotonic() - t0
        code = job.wait(timeout=300)
        t_end = time.monotonic() - t0
    assert code == 0, out.tail()
    lines = [ln for ln in out.lines if ln and "<stdout>:{" in ln]
    assert len(lines) == 1, out.tail()
    result = json.loads(lines[0].split("<stdout>:", 1)[1])
    print(f"{fw}: epochs on 2 workers until {first}, on 1 from {shrunk}, on 2 again from {grown}; "
          f"{result['elastic']}, accuracy {result['accuracy']:.4f}; killed at {t_kill:.0f} s, shrunk by {t_shrunk:.0f} s, grown at {t_grown:.0f} s, done at {t_end:.0f} s")
    # the replica check ran on the final 2 workers: the new one ended identical to the survivor
    assert result["world_size"] == 2 and result["elastic"]["world_sizes"] == [2, 1, 2]
    assert len(result["final_digests"]) == 2 and len(set(result["final_digests"])) == 1, result["final_digests"]
    assert result["elastic"]["resets"] >= 2
    assert result["accuracy"] > 0.9
