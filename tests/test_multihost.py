"""Two real hosts on one machine (issue 6): network namespaces with their own addresses, joined by a
veth pair, each running sshd (tests/netns_hosts.sh). `toolkit launch -H hostA:1,hostB:1` trains
`digits` across them with horovodrun over Gloo and MPI; rank 1 really runs on hostB (its own
hostname), and its only way to rank 0 is the namespaces' link.

Needs root and network namespaces: skipped with the reason where they are missing, failed instead
when TOOLKIT_REQUIRE_MULTIHOST=1 demands the test.
"""
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, TRAIN, assert_replicas, clean_env, summary
from tests.test_distributed import digits, horovod_status

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
