"""Two real hosts on one machine (issue 6): network namespaces with their own addresses, joined by a
veth pair, each running sshd (tests/netns_hosts.sh). `toolkit launch -H hostA:1,hostB:1` trains
`digits` across them with horovodrun over Gloo and MPI; rank 1 really runs on hostB (its own
hostname), and its only way to rank 0 is the namespaces' link. Then hostB fails as a host does
(issue 20): its sshd stopped, its replies dropped, a key it refuses; each is one line naming it.

Needs root and network namespaces: skipped with the reason where they are missing, failed instead
when TOOLKIT_REQUIRE_MULTIHOST=1 demands the test.
"""
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, TRAIN, assert_replicas, clean_env, digits, horovod_status, one_line_error, summary

pytestmark = pytest.mark.distributed
SCRIPT = ROOT / "tests" / "netns_hosts.sh"


def _unavailable(reason: str):
    if os.environ.get("TOOLKIT_REQUIRE_MULTIHOST") == "1":
        pytest.fail(f"TOOLKIT_REQUIRE_MULTIHOST=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    if os.geteuid() != 0:
        _unavailable("the multi-host test needs root (ip netns, sshd)")
    if why := horovod_status("torch"):
        _unavailable(f"horovod.torch does not import: {why}")
    folder = tmp_path_factory.mktemp("netns")
    up = subprocess.run(["bash", SCRIPT, "up", folder], capture_output=True, text=True, timeout=300)
    if up.returncode != 0:
        subprocess.run(["bash", SCRIPT, "down", folder], capture_output=True, timeout=60)
        _unavailable(f"cannot make namespace hosts here: {(up.stderr or up.stdout).strip()[-300:]}")
    yield folder
    down = subprocess.run(["bash", SCRIPT, "down", folder], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_training_across_two_namespace_hosts(hosts, controller):
    report = 'echo "rank ${HOROVOD_RANK:-$OMPI_COMM_WORLD_RANK} on $(hostname)" >&2; exec "$@"'
    argv = ["bash", SCRIPT, "exec", hosts, "hostA", sys.executable, "-m", "toolkit", "launch", "-np", "2",
            "-H", "hostA:1,hostB:1", f"--{controller}", "--network-interface", "tk0", "--timeout", "240",
            "--", "sh", "-c", report, "sh", *TRAIN, *digits("torch"), "--epochs", "4"]
    env = clean_env()
    env["PATH"] = f"{hosts}/bin{os.pathsep}{env['PATH']}"     # the ssh with this run's key
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    out = summary(proc)
    placed = dict(re.findall(r"rank (\d) on (host\w)", proc.stderr))
    assert placed == {"0": "hostA", "1": "hostB"}, proc.stderr[-3000:]
    assert out["world_size"] == 2
    assert_replicas(out)
    assert out["accuracy"] > 0.9


def _launch_from_hostA(hosts, launcher, *extra, path=None, timeout=120):
    argv = ["bash", SCRIPT, "exec", hosts, "hostA", sys.executable, "-m", "toolkit", "launch", "-np", "2",
            "-H", "hostA:1,hostB:1", "--launcher", launcher, "--network-interface", "tk0", *extra,
            "--", *TRAIN, *digits("torch"), "--epochs", "1"]
    env = clean_env()
    env["PATH"] = f"{path or hosts / 'bin'}{os.pathsep}{env['PATH']}"
    start = time.monotonic()
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    return proc, time.monotonic() - start


@pytest.fixture
def fault(hosts):
    """Puts hostB in a fault (`netns_hosts.sh fault`) for one test; back to normal after it."""
    def put(kind):
        subprocess.run(["bash", SCRIPT, "fault", hosts, "hostB", kind], check=True, timeout=60)
    yield put
    put("none")


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun", "tf_config"])
def test_a_host_whose_ssh_refuses_is_one_line_naming_it(hosts, fault, launcher):
    """hostB resolves and is up, but nothing listens on its ssh port: one line, before any launcher
    (mpirun printed a 20-line banner; horovodrun skips its own ssh check for an hour once it passed)."""
    fault("refuse")
    proc, took = _launch_from_hostA(hosts, launcher)
    one_line_error(proc, "cannot reach hostB", "refused", "--ssh-port")
    assert took < 30


def test_a_host_that_answers_nothing_is_one_line_within_the_start_timeout(hosts, fault):
    """hostB drops what hostA sends (its replies are blackholed): ssh would wait for TCP's two minutes."""
    fault("drop")
    proc, took = _launch_from_hostA(hosts, "mpirun", "--start-timeout", "4")
    one_line_error(proc, "cannot reach hostB", "nothing answered", "within --start-timeout 4 s")
    assert took < 20


def test_mpiruns_banner_for_an_ssh_login_that_fails_is_ssh_s_own_line(hosts, tmp_path):
    """hostB's ssh port answers but refuses this key: mpirun's daemon banner becomes one line with
    ssh's reason (`Permission denied (publickey)`)."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", tmp_path / "stranger"], check=True)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host hostA hostB\n    IdentityFile {tmp_path / 'stranger'}\n    IdentitiesOnly yes\n"
                      f"    UserKnownHostsFile {hosts / 'known_hosts'}\n    StrictHostKeyChecking no\n"
                      "    BatchMode yes\n    LogLevel ERROR\n")
    (tmp_path / "bin").mkdir()
    wrapper = tmp_path / "bin" / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {config} "$@"\n')
    wrapper.chmod(0o755)
    proc, _ = _launch_from_hostA(hosts, "mpirun", path=tmp_path / "bin")
    one_line_error(proc, "mpirun could not start on the other hosts over ssh", "Permission denied (publickey)")
