"""Bad input through the real CLI: one line naming the field or flag and the fix, non-zero, no traceback."""
import sys
import time

import pytest

from tests.conftest import BIN, TRAIN, clean_env, one_line_error, run, toolkit
from toolkit import registry
from toolkit.cli import main


@pytest.mark.parametrize("text, needles", [
    ("lr: [1, 2\n", ["invalid YAML"]),
    ("", ["empty"]),
    ("batchsize: 4\n", ["unknown key 'batchsize'", "batch_size"]),
    ("lr: abc\n", ["lr='abc'"]),
    ("epochs: -1\n", ["epochs=-1"]),
])
def test_bad_config_files(tmp_path, text, needles):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    one_line_error(run(TRAIN + ["--config", cfg], timeout=60), *needles)


@pytest.mark.parametrize("flags, needles", [
    (["--config", "/nonexistent.yaml"], ["file not found"]),
    (["--batch-size", "0"], ["batch_size=0", "--batch-size"]),
    (["--accumulation-steps", "0"], ["accumulation_steps=0"]),
    (["--lr", "-1"], ["lr=-1.0"]),
    (["--epochs", "0"], ["epochs=0"]),
    (["--framework", "caffe"], ["framework='caffe'", "Available: torch, tensorflow, mxnet"]),
])
def test_bad_flags(flags, needles):
    one_line_error(run(TRAIN + flags, timeout=60), *needles)


def test_bad_environment_value():
    from tests.conftest import clean_env
    one_line_error(run(TRAIN, env=clean_env(TOOLKIT_BATCH_SIZE="lots"), timeout=60), "TOOLKIT_BATCH_SIZE")


@pytest.mark.parametrize("framework, extra, install", [
    ("torch", [], "pip install torch=="),
    ("mxnet", [], "pip install mxnet==1.9.1"),
    ("tensorflow", ["--keras", "tf_keras"], "pip install tensorflow-cpu==2.21.0"),
    ("tensorflow", ["--backend", "native", "--strategy", "mirrored"], "pip install tensorflow-cpu==2.21.0"),
])
def test_framework_not_installed(monkeypatch, capsys, framework, extra, install):
    monkeypatch.setattr(registry.importlib.util, "find_spec", lambda name, *a: None)
    assert main(["train", "--framework", framework, *extra, "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"framework={framework!r} is not installed" in err[0] and install in err[0]


def test_config_show_bad_input_and_doctor_unknown_framework():
    one_line_error(toolkit("config", "show", "--optimizer", "lamb"), "optimizer='lamb'")
    one_line_error(toolkit("doctor", "--framework", "jax"), "framework='jax'")


def test_no_flag_is_an_ambiguous_prefix_of_a_horovodrun_option():
    """horovodrun's argparse classifies every `--x` on its command line, the training script's
    flags included, and stops with `ambiguous option` when one is a prefix of two of its own
    (`--timeline` would match --timeline-filename and --timeline-mark-cycles)."""
    import argparse
    import re
    import shutil

    from toolkit import config
    horovodrun = shutil.which("horovodrun", path=str(BIN))
    if not horovodrun:
        pytest.skip("horovodrun is not installed; run `make setup`")
    theirs = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", run([horovodrun, "--help"], timeout=60).stdout))
    assert "--timeline-filename" in theirs and "--config-file" in theirs
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    ours = {s for a in parser._actions for s in a.option_strings if s.startswith("--")}
    ambiguous = {f: sorted(o for o in theirs if o.startswith(f)) for f in ours if f not in theirs}
    assert {f: m for f, m in ambiguous.items() if len(m) > 1} == {}


@pytest.mark.parametrize("argv, unknown", [
    (["launch", "-np", "2", "--gpu", "--emit", "slurm", "--", "true"], "--gpu (did you mean --gpus?)"),  # ran as --gpus
    (["launch", "-np", "2", "--bogus", "--dry-run", "--", "true"], "--bogus"),
    (["config", "show", "--epoch", "3"], "--epoch 3 (did you mean --epochs?)"),         # was taken as --epochs
    (["train", "--lr-sched", "cosine"], "--lr-sched cosine (did you mean --lr-schedule?)"),
    (["bench", "--np", "1", "--iter", "2", "--dry-run"], "--iter 2 --dry-run (did you mean --iters?)"),
    (["doctor", "--frame", "torch"], "--frame torch (did you mean --framework?)"),
])
def test_a_subcommands_bad_flag_is_its_own_usage_and_one_error_line(argv, unknown):
    """No abbreviated flags (`toolkit launch --gpu` once ran as --gpus: now it is an error that names --gpus),
    and a subcommand's unknown flag shows that subcommand's usage line, not the top-level
    `usage: toolkit [-h] COMMAND ...`."""
    prog = "toolkit " + " ".join(argv[:2] if argv[0] == "config" else argv[:1])
    proc = toolkit(*argv, timeout=60)
    assert proc.returncode == 2 and not proc.stdout, proc.stdout
    usage, error = proc.stderr.splitlines()
    assert usage.startswith(f"usage: {prog} ") and error == f"{prog}: error: unrecognized arguments: {unknown}", \
        proc.stderr


def test_wandb_asked_but_not_installed(tmp_path):
    """`make setup` installs wandb (for the test above); a sitecustomize hides it here, as a
    user's environment without it would be (`sys.modules['wandb'] = None`: find_spec says None)."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['wandb'] = None\n")
    proc = run(TRAIN + ["--wandb-project", "demo", "--epochs", "1"], timeout=60,
               env=clean_env(PYTHONPATH=str(tmp_path)))
    one_line_error(proc, "wandb_project='demo'", "pip install wandb")


@pytest.mark.distributed
def test_a_rank_failing_under_toolkit_launch_shows_its_line_and_exits_with_its_code():
    """horovodrun would add its traceback (and a second one from its Gloo thread) and exit 1."""
    proc = toolkit("launch", "-np", "3", "--gloo", "--timeout", "150", "--", *TRAIN, "--sync", "ssp", timeout=180)
    assert proc.returncode == 2, proc.stderr
    one_line_error(proc, "sync=async_ps/ssp talks through MPI", "toolkit launch --mpi", launched=True)
    assert "Traceback" not in proc.stderr and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_a_gloo_rank_asking_for_mpi_is_refused_before_mpi_starts():
    """Refused before MPI_Init: a singleton init starts Open MPI's daemon, which at the rank's exit can print
    its own `ORTE_ERROR_LOG: Broken pipe` line beside the toolkit's one (seen under two pytest workers)."""
    code = ("import sys\nfrom toolkit.run import ps\ntry:\n    ps._world()\nexcept Exception as e:\n"
            "    print(type(e).__name__, 'mpi4py.MPI' in sys.modules)")
    proc = run([sys.executable, "-c", code], timeout=60, env=clean_env(HOROVOD_RANK="0"))
    assert proc.stdout.split() == ["ToolkitError", "False"], proc.stdout + proc.stderr


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun", "tf_config"])
def test_an_unreachable_host_is_one_line_naming_it_within_the_start_timeout(launcher):
    start = time.monotonic()
    proc = toolkit("launch", "-np", "2", "-H", "localhost:1,nosuchhost.invalid:1", "--launcher", launcher,
                   "--start-timeout", "30", "--", *TRAIN, timeout=90)
    one_line_error(proc, "cannot reach nosuchhost.invalid", "does not resolve", "-H/--hostfile")
    assert time.monotonic() - start < 30


def test_launch_and_bench_take_np_with_one_or_two_dashes(capsys):
    """`-np` (horovodrun's, mpirun's) and `--np` on every subcommand that starts ranks; the same launch."""
    commands = []
    for flag in ("-np", "--np", "--num-proc"):
        assert main(["launch", flag, "3", "--gloo", "--dry-run", "--", "python", "-c", "pass"]) == 0
        commands.append(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(set(commands)) == 1 and "-np 3 -H localhost:3" in commands[0], commands
    from toolkit.cli import parser
    assert parser().parse_args(["bench", "-np", "1,4"]).np == parser().parse_args(["bench", "--np", "1,4"]).np == "1,4"


def test_gpus_is_the_spelling_of_every_command_and_gpu_still_works():
    """`--gpus`: setup and build-horovod for GPUs (the old `--gpu` kept), launch one GPU per rank, plan the GPU
    counts to plan for; the setup that the GPU image runs passes it on to build-horovod."""
    from toolkit.cli import parser
    from toolkit.install.envsetup import horovod_build_args
    for command in ("setup", "build-horovod"):
        assert parser().parse_args([command, "--gpus"]).gpu is parser().parse_args([command, "--gpu"]).gpu is True
        assert parser().parse_args([command]).gpu is False
    assert parser().parse_args(["launch", "-np", "2", "--gpus", "--", "x"]).gpus is True
    assert parser().parse_args(["plan", "--gpus", "8,64"]).gpus == "8,64"
    assert horovod_build_args(True, []) == ["--gpus"] and horovod_build_args(True, ["--gpu"]) == ["--gpu"]


@pytest.mark.parametrize("argv, unknown, suggestion", [
    (["launch", "-np", "2", "--glo", "--", "python"], "--glo", "--gloo"),
    (["train", "--epoch", "2"], "--epoch 2", "--epochs"),
    (["bench", "--hidden-sise", "8"], "--hidden-sise 8", "--hidden-size"),
])
def test_a_mistyped_flag_gets_did_you_mean(argv, unknown, suggestion, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1].endswith(f"unrecognized arguments: {unknown} (did you mean {suggestion}?)"), err


def _dry_launch(capsys, *flags) -> str:
    assert main(["launch", *flags, "--gloo", "--dry-run", "--", "python", "-c", "pass"]) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_launch_takes_torchruns_horovodruns_and_mpiruns_spellings(capsys, monkeypatch):
    """torchrun's --nproc-per-node (one host), horovodrun's -p, mpirun's -x NAME[=VALUE]: the same launch as the
    toolkit's own flags; what they cannot mean here is one line."""
    assert _dry_launch(capsys, "--nproc-per-node", "3") == _dry_launch(capsys, "-np", "3")
    assert _dry_launch(capsys, "--nproc_per_node", "2", "--nnodes", "1") == _dry_launch(capsys, "-np", "2")
    assert _dry_launch(capsys, "-np", "2", "-p", "2222") == _dry_launch(capsys, "-np", "2", "--ssh-port", "2222")
    monkeypatch.setenv("TOOLKIT_TEST_EXPORTED", "here")      # -x NAME: its value here (the dry run shows changes)
    line = _dry_launch(capsys, "-np", "2", "-x", "TOOLKIT_TEST_A=1", "-x", "TOOLKIT_TEST_EXPORTED")
    assert line == _dry_launch(capsys, "-np", "2", "--env", "TOOLKIT_TEST_A=1") and "TOOLKIT_TEST_A=1 " in line
    for flags, needle in ((["--nproc-per-node", "2", "--nnodes", "2"], "--nnodes 2: toolkit launch names the hosts"),
                          ([], "needs the number of ranks: -np N (or torchrun's --nproc-per-node N)"),
                          (["-np", "2", "-x", "TOOLKIT_TEST_NOT_SET"], "-x TOOLKIT_TEST_NOT_SET=VALUE"),
                          (["--nproc-per-node", "2", "-H", "a:2,b:2"], "with -H or --hostfile give -np")):
        assert main(["launch", *flags, "--dry-run", "--", "python"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], (flags, err)


@pytest.mark.parametrize("command", ["setup", "build-horovod", "doctor", "config", "launch", "train", "bench", "plan",
                                     "shards"])
def test_every_commands_help_ends_with_its_examples(command, capsys):
    from toolkit.cli import parser
    with pytest.raises(SystemExit) as e:
        parser().parse_args([command, "--help"])
    out = capsys.readouterr().out
    examples = out[out.rindex("examples:\n"):].splitlines()[1:]
    assert e.value.code == 0 and examples and all(ln.startswith(f"  toolkit {command} ") for ln in examples), out


def test_launch_takes_torchruns_max_restarts(capsys):
    """`--max-restarts N` reaches torchrun (elastic or not; elastic keeps 3 unless given); another launcher: one line."""
    native = ["--backend", "native", "--framework", "torch", "-np", "2"]

    def torchrun(*flags):
        assert main(["launch", *native, *flags, "--dry-run", "--", "python", "-c", "pass"]) == 0
        return capsys.readouterr().out

    assert "--nnodes 1:1 --max-restarts 5 " in torchrun("--min-np", "2", "--max-restarts", "5")
    assert "--nnodes 1:1 --max-restarts 3 " in torchrun("--min-np", "2")
    assert "--nproc-per-node 2 --max-restarts 0 " in torchrun("--max-restarts", "0")
    assert "--max-restarts" not in torchrun()
    assert main(["launch", "-np", "2", "--max-restarts", "5", "--dry-run", "--", "python"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-restarts 5: torchrun's restarts" in err[0], err
