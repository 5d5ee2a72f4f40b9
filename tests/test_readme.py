"""Every command of the README and of docs/*.md that can run on one machine runs as written (shortened
to one epoch), so the docs cannot drift from the code again. Commands that need other hosts run with
`--dry-run` where `toolkit launch` has one; the rest say why they are not run here (NOT_HERE). A command
that occurs in several files runs once, where it occurs first (the README, then docs/ by name).

Each command runs in its own empty folder holding `examples/`, `tests/`, `benchmarks/` and `.venv` (links
to this checkout), with the virtualenv's bin/ first on PATH (what `source .venv/bin/activate` does), so one
command's checkpoints never meet another's.

Every relative link of these files points at a file that exists, and at a heading of it when it names one.
"""
from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, clean_env

pytestmark = pytest.mark.distributed

FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "tests" / "README.md"]

# (pattern, why it does not run here): the first that matches a command decides
NOT_HERE = [
    (r"^(sbatch|kubectl)\b", "needs a Slurm or Kubernetes cluster"),
    (r"^(time )?(\w+=\S+ )*docker/build\.sh|^docker ",
     "builds or runs a container image (minutes; docs/DOCKER.md has the measured run)"),
    (r"^git archive ", "prepares a container build's context (docs/DOCKER.md)"),
    (r"^make matrix\b", "builds Horovod in Debian containers (root, buildah; 5-10 min a row; docs/TOOLCHAINS.md)"),
    (r"^(\w+=\S+ )*make setup\b", "makes another Python's virtualenv and builds Horovod for it (minutes)"),
    (r"^\.venv-3\.\d+/", "needs the virtualenv that `make setup PYTHON=...` makes (the lines above it)"),
    (r"\bbuild-horovod\b(?! --explain)",
     "builds Horovod, minutes, or reads its cache under ~/.cache (each command here has its own HOME)"),
    (r"^horovodrun .*-H a:", "needs the hosts a and b"),
    (r"^make test\b", "is this suite"),
    (r"tests/break_claims\.py (?!--list)", "applies mutants and runs their tests (minutes; `--list` runs here)"),
    (r"_bench\.py|-m benchmarks\.|^(\.venv/bin/)?toolkit bench\b",
     "a benchmark: minutes long (its docs page has the run)"),
    (r"^\w+=\"[^\"]*\"$", "sets a shell variable for the lines below it"),
    (r"toolkit plan \$F\b", "a ResNet-50 plan from $F above (~1 min each; docs/SCALING.md's usage example runs)"),
    (r"toolkit plan .*(--config cfg\.yaml|--bench runs/)",
     "stands for your config file, or a bench and calibration an earlier run wrote"),
    (r"mypkg\.|path/to/", "names stand for your own code (the README's `tests/user_code.py` command runs it)"),
    (r"--config elastic\.yaml", "needs more hosts from its discovery script (tests/test_elastic.py runs elastic)"),
    (r"--model resnet18 --dataset imagefolder:runs/digits-images\b",
     "ResNet-18 in bf16: ~10 min on a CPU without bf16 instructions (docs/BENCHMARKS.md); "
     "tests/test_workloads.py trains it on the same images"),
    (r"--checkpoint-dir runs/demo\b", "is what `make demo` runs (the README's `make demo` runs it, 15 epochs)"),
    (r"^source ", "activates the virtualenv (every command here runs with it first on PATH)"),
    # docs/INSTALL.md: here they would change the suite's own .venv (a `pip install torch==2.13.0+cpu` once
    # replaced its torch); tests/test_install.py runs the same steps in fresh virtualenvs
    (r"^(python\S* -m )?(pip|uv pip|uv venv) |^python\S* -m (venv|build) |\btwine check\b",
     "installs into, or makes, an environment of your own (tests/test_install.py does it in fresh virtualenvs)"),
    (r"^conda ", "conda's channels are not reachable from this machine (docs/INSTALL.md)"),
    (r"^horovodrun -np 4 ", "needs the GPU container's 4 GPUs"),
    (r"^horovodrun -np 2 --gloo python examples/your_(keras|mxnet)\.py\b",
     "runs as written in tests/test_api.py (test_the_your_script_examples_train_under_horovodrun: identical "
     "replicas, accuracy)"),
    (r"^toolkit launch --backend native --framework torch -np 2 -- python examples/train\.py --backend native",
     "runs in tests/test_native_torch.py (the same jobs, checked bit for bit against Horovod's)"),
    (r"^horovodrun -np 2 --gloo python examples/keras_fit\.py (--keras tf_keras )?--epochs 8\b",
     "runs, 8 epochs, both Keras, in tests/test_keras_fit.py (horovodrun -H localhost:2; it asserts more)"),
]
DRY_RUN = r"^(\.venv/bin/)?toolkit launch (?!.*--emit).*(-H (a|n):|--hostfile )"   # other hosts: print, run nothing
TRAINS = r"examples/train\.py|toolkit train|examples/keras_fit\.py"


def name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def bash_commands(path: Path) -> list[tuple[int, str]]:
    """(line, command) for every command in a file's ```bash blocks, continuations joined; comment lines
    (a `#` first) are the output a block shows, not commands."""
    out, block, pending, start = [], False, "", 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            block = line.strip() == "```bash"
            continue
        if not block or not line.strip() or (not pending and line.lstrip().startswith("#")):
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


COMMANDS = [(f"{name(path)}:{line}", command) for path in FILES for line, command in bash_commands(path)]
RUN_HERE: dict[str, tuple[str, str]] = {}      # what runs -> (where it occurs first, as written)
for where, command in COMMANDS:
    why, argv = plan(command)
    if why is None:
        RUN_HERE.setdefault(argv, (where, command))
NOT_RUN = [(where, plan(command)[0], command) for where, command in COMMANDS if plan(command)[0]]


def test_the_commands_not_run_here_are_few_and_say_why():
    """Not parametrised (a case that always skips hides nothing useful): the commands this file does
    not run, each with its reason, printed (`pytest -s`) and bounded; every reason still has a command."""
    for where, why, command in NOT_RUN:
        print(f"{where} {why}: {command}")
    readme = [where for where, _ in RUN_HERE.values() if where.startswith("README.md:")]
    assert len(readme) >= 15 and len(RUN_HERE) >= 35, sorted(RUN_HERE.values())
    # docs/INSTALL.md is a page of installs into environments of one's own: its commands run in
    # tests/test_install.py's fresh virtualenvs (and `make support`), not in the suite's .venv
    install = [n for n in NOT_RUN if n[0].startswith("docs/INSTALL.md:")]
    assert len(NOT_RUN) - len(install) <= 50 and len(install) <= 20, NOT_RUN
    unused = [pattern for pattern, _ in NOT_HERE if not any(re.search(pattern, c) for _, c in COMMANDS)]
    assert not unused, f"NOT_HERE patterns that no command matches any more (drop them): {unused}"


@pytest.mark.parametrize("argv", list(RUN_HERE), ids=[where for where, _ in RUN_HERE.values()])
def test_documented_command_runs_as_written(argv, tmp_path):
    where, command = RUN_HERE[argv]
    for name_ in ("examples", ".venv", "tests", "benchmarks"):     # what the commands name, as in a checkout
        if (ROOT / name_).exists():
            (tmp_path / name_).symlink_to(ROOT / name_)
    # what the cluster commands name: a hostfile, an ssh key, an image (HOME is this folder)
    (tmp_path / "hosts").write_text("a slots=4\nb slots=4\n")
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "cluster").write_text("")
    if argv.startswith("make "):
        for name_ in ("Makefile", "toolkit", "pyproject.toml", "README.md"):
            (tmp_path / name_).symlink_to(ROOT / name_)
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {argv}"], capture_output=True, text=True, timeout=300,
                          env=clean_env(HOME=str(tmp_path), IMAGE="toolkit:gpu"), cwd=tmp_path)
    assert proc.returncode == 0, (f"{where} failed ({shlex.quote(argv)}; as written: {command}):\n"
                                  f"STDOUT:\n{proc.stdout[-2000:]}\nSTDERR:\n{proc.stderr[-3000:]}")
    if argv.startswith("horovodrun") and not re.search(r"keras|tensorflow", argv):
        # a torch or MXNet job under plain horovodrun: no TensorFlow start-up lines (its launcher imported
        # TensorFlow and printed them, issue 33)
        noise = TENSORFLOW_LINES.findall(proc.stderr)
        assert not noise, f"{where}: TensorFlow's start-up lines on stderr: {noise}"


TENSORFLOW_LINES = re.compile(r".*(?:absl::InitializeLog|cpu_feature_guard|oneDNN custom operations).*")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)     # a `# comment` is no heading
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links(path: Path) -> list[tuple[str, str]]:
    """(text, target) of every relative markdown link outside code blocks."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return [(m.group(0), m.group(1)) for m in re.finditer(r"\[[^\]\n]*\]\(([^)\s]+)\)", text)
            if not re.match(r"[a-z]+:", m.group(1))]


@pytest.mark.parametrize("path", FILES, ids=[name(p) for p in FILES])
def test_every_relative_link_points_at_a_file_and_heading(path):
    broken = []
    for text, target in links(path):
        file, _, anchor = target.partition("#")
        goal = (path.parent / file).resolve() if file else path
        if not goal.exists():
            broken.append(f"{text}: no file {goal}")
        elif anchor and goal.suffix == ".md" and anchor not in anchors(goal):
            broken.append(f"{text}: no heading #{anchor} in {name(goal)}")
    assert not broken, f"{name(path)}: " + "; ".join(broken)


@pytest.mark.parametrize("path", FILES, ids=name)
def test_user_pages_speak_about_the_product_not_its_making(path):
    """A user can neither see nor act on the project's issue numbers or on which machine a session was lent."""
    found = [f"{name(path)}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\bissues? #?\d+|\bwas lent\b|\bdevice tool\b|\bclosing note", line, re.I)]
    assert not found, "\n".join(found)
