"""TensorFlow's C++ start-up chatter off stderr (toolkit/run/quiet.py): which lines go, which stay, and
that the relay process passes everything else through, in order, to the end."""
import subprocess
import sys

from toolkit.run import quiet

RECORDED = [   # TensorFlow 2.21 on this machine: a rank's stderr before the first useful line
    (b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR", True),
    (b"I0000 00:00:1795423293.164884    9163 port.cc:153] oneDNN custom operations are on. You may see slightly "
     b"different numerical results", True),
    (b"I0000 00:00:1795423293.354993    9163 cpu_feature_guard.cc:227] This TensorFlow binary is optimized", True),
    (b"To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the "
     b"appropriate compiler flags.", True),
    (b"I0000 00:00:1795426552.905768    4513 coordination_service.cc:505] Example stragglers:", True),
    (b"/job:worker/replica:0/task:1", True),
    (b"toolkit: error: op=adasum needs Horovod's MPI controller", False),
    (b"W0000 00:00:1795426552.905768    4513 some_op.cc:12] a real warning", False),
    (b"E0000 00:00:1795426552.905768    4513 some_op.cc:12] an error", False),
    (b"/job:worker/replica:0/task:1", False),       # not after a dropped line: someone's own output
    (b"epoch 1/1  loss 1.8686", False),
]


def test_only_info_lines_and_their_continuations_are_dropped():
    after = False
    for line, noise in RECORDED:
        after = quiet.is_noise(line, after)
        assert after == noise, line


RELAYED = """
import os, sys
from toolkit.run import quiet
quiet.filter_stderr()
for line, _ in {recorded!r}:
    os.write(2, line + b"\\n")          # C++ writes straight to fd 2
print("python's own stderr line", file=sys.stderr)
os._exit(3)                             # a hard exit: the relay still delivers everything
"""


def test_the_relay_passes_the_rest_in_order_even_after_a_hard_exit():
    proc = subprocess.run([sys.executable, "-c", RELAYED.format(recorded=RECORDED)], capture_output=True,
                          timeout=60)
    assert proc.returncode == 3
    kept = [line for line, noise in RECORDED if not noise] + [b"python's own stderr line"]
    assert proc.stderr.splitlines() == kept
