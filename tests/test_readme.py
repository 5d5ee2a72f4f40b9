"""Every command of the README that can run on one machine runs as written (shortened to one epoch),
so the README cannot drift from the code again. Commands that need other hosts run with `--dry-run`
where `toolkit launch` has one; the rest say why they are not run here.

Each command runs in its own empty folder holding `examples/`, `tests/` and `.venv` (links to this checkout),
with the virtualenv's bin/ first on PATH (what `source .venv/bin/activate` does), so one command's
checkpoints never meet another's.
"""
from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from tests.conftest import ROOT, clean_env

pytestmark = pytest.mark.distributed

# (pattern, why it does not run here): the first that matches a command decides
NOT_HERE = [
    (r"^(sbatch|kubectl)\b", "needs a Slurm or Kubernetes cluster"),
    (r"^docker/build\.sh|^docker ", "builds or runs a container image (minutes; docs/DOCKER.md has the measured run)"),
    (r"^horovodrun .*-H a:", "needs the hosts a and b"),
    (r"^make test\b", "is this suite"),
    (r"_bench\.py|^\.venv/bin/toolkit bench|^toolkit bench", "a benchmark: minutes long (its docs page has the run)"),
    (r"--config elastic\.yaml", "needs more hosts from its discovery script (tests/test_elastic.py runs elastic)"),
    (r"^source ", "activates the virtualenv (every command here runs with it first on PATH)"),
    (r"^horovodrun -np 2 --gloo python examples/keras_fit\.py (--keras tf_keras )?--epochs 8\b",
     "runs, 8 epochs, both Keras, in tests/test_keras_fit.py (horovodrun -H localhost:2; it asserts more)"),
]
DRY_RUN = r"^(\.venv/bin/)?toolkit launch (?!.*--emit).*(-H (a|n):|--hostfile )"   # other hosts: print, run nothing
TRAINS = r"examples/train\.py|toolkit train|examples/keras_fit\.py"


def readme_commands() -> list[tuple[int, str]]:
    """(line, command) for every command in the README's ```bash blocks, continuations joined."""
    out, block, pending, start = [], False, "", 0
    for number, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1):
        if line.startswith("```"):
            block = line.strip() == "```bash"
            continue
        if not block or not line.strip():
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, re.sub(r"\s+", " ", (pending + line).strip())))
        pending = ""
    return out


def shortened(command: str) -> str:
    """One epoch instead of many; one more flag where the command trains without --epochs."""
    command = re.sub(r"--epochs \d+", "--epochs 1", command)
    if re.search(TRAINS, command) and "--epochs" not in command and not re.search(r"--emit|--dry-run", command):
        command = re.sub(r"(\s+#.*)?$", " --epochs 1", command, count=1)
    return command


def plan(command: str) -> tuple[str | None, str]:
    """(why not, the command to run)."""
    for pattern, why in NOT_HERE:
        if re.search(pattern, command):
            return why, command
    if re.search(DRY_RUN, command):
        return None, command.replace(" -- ", " --dry-run -- ", 1)
    return None, shortened(command)


COMMANDS = readme_commands()
RUN_HERE = [(line, command) for line, command in COMMANDS if plan(command)[0] is None]


def test_the_commands_not_run_here_are_few_and_say_why():
    """Not parametrised (a case that always skips hides nothing useful): the commands this file does
    not run, each with its reason, printed (`pytest -s`) and bounded."""
    not_here = [(line, plan(command)[0], command) for line, command in COMMANDS if plan(command)[0]]
    for line, why, command in not_here:
        print(f"README line {line} {why}: {command}")
    assert len(COMMANDS) > 25 and len(RUN_HERE) >= 25 and len(not_here) <= 14, not_here


@pytest.mark.parametrize("line, command", RUN_HERE, ids=[f"README:{n}" for n, _ in RUN_HERE])
def test_readme_command_runs_as_written(line, command, tmp_path):
    _, argv = plan(command)
    for name in ("examples", ".venv", "tests"):        # what the commands name, as in a checkout
        (tmp_path / name).symlink_to(ROOT / name)
    # what the cluster commands name: a hostfile, an ssh key, an image (HOME is this folder)
    (tmp_path / "hosts").write_text("a slots=4\nb slots=4\n")
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "cluster").write_text("")
    if argv.startswith("make "):
        for name in ("Makefile", "toolkit", "pyproject.toml", "README.md"):
            (tmp_path / name).symlink_to(ROOT / name)
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {argv}"], capture_output=True, text=True, timeout=300,
                          env=clean_env(HOME=str(tmp_path), IMAGE="toolkit:gpu"), cwd=tmp_path)
    assert proc.returncode == 0, (f"README line {line} failed ({shlex.quote(argv)}):\nSTDOUT:\n{proc.stdout[-2000:]}"
                                  f"\nSTDERR:\n{proc.stderr[-3000:]}")
