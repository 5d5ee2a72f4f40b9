"""Launcher argv and environment, without MPI (Horovod's test/single style)."""
import argparse
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import one_line_error, run, toolkit
from toolkit.errors import ToolkitError
from toolkit.launch import hosts
from toolkit.launch.launchers import LAUNCHERS, horovodrun, mpirun, tf_config, torchrun
from toolkit.launch.spec import LaunchSpec

CMD = ("python", "examples/train.py", "--framework", "torch")


def test_horovodrun_defaults_to_localhost_slots():
    argv, env = horovodrun.plan(LaunchSpec(command=CMD, np=2, controller="gloo"), environ={"PATH": "/bin"})
    assert argv[:argv.index("python")] == ["horovodrun", "-np", "2", "-H", "localhost:2",
                                            "--start-timeout", "60", "--gloo"]
    assert argv[-len(CMD):] == list(CMD)
    assert env["PYTHONUNBUFFERED"] == "1"
    # the launching Python's bin/ (a virtualenv's: horovodrun, python) comes first, even if not activated
    assert env["PATH"] == f"{os.path.dirname(sys.executable)}{os.pathsep}/bin"


def test_cli_finds_horovodrun_in_an_inactive_virtualenv():
    bare = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    proc = run([sys.executable, "-m", "toolkit", "launch", "-np", "1", "--gloo", "--timeout", "120", "--",
                sys.executable, "-c", "print('rank ok')"], env=bare, timeout=150)
    assert proc.returncode == 0, proc.stderr
    assert "rank ok" in proc.stdout


def test_horovodrun_hosts_and_interface():
    spec = LaunchSpec(command=CMD, np=8, hosts="a:4,b:4", controller="mpi", network_interface="eth0",
                             start_timeout=30)
    argv, _ = horovodrun.plan(spec, environ={})
    assert ["-H", "a:4,b:4"] == argv[3:5] and "--mpi" in argv
    assert argv[argv.index("--network-interface") + 1] == "eth0"
    assert argv[argv.index("--start-timeout") + 1] == "30"


def test_mpirun_forwards_toolkit_and_python_environment(monkeypatch):
    monkeypatch.setattr(mpirun, "is_root", lambda: True)
    environ = {"PATH": "/bin", "TOOLKIT_EPOCHS": "3", "HOROVOD_CYCLE_TIME": "1", "HOME": "/root"}
    argv, env = mpirun.plan(LaunchSpec(command=CMD, np=2, launcher="mpirun", env=("A=1",)), environ)
    assert argv[:2] == ["mpirun", "--allow-run-as-root"]
    forwarded = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert {"PATH", "TOOLKIT_EPOCHS", "HOROVOD_CYCLE_TIME", "PYTHONUNBUFFERED"} <= forwarded
    assert "HOME" not in forwarded
    assert env["A"] == "1"
    assert ["-bind-to", "none"] == argv[argv.index("-bind-to"):argv.index("-bind-to") + 2]


def test_parse_hosts():
    assert hosts.parse_hosts("a:4, b:2,c") == [("a", 4), ("b", 2), ("c", 1)]
    assert hosts.total_slots("a:4,b:4") == 8


@pytest.mark.parametrize("kwargs, needle", [
    (dict(np=4, hosts="localhost:2"), "-np 4 is more than the 2 slot(s)"),
    (dict(np=0), "-np 0"),
    (dict(np=2, hosts="a:x"), "slots of 'a' must be an integer"),
    (dict(np=2, hosts="a:0"), "give at least 1"),
    (dict(np=2, launcher="srun"), "--launcher 'srun'"),
    (dict(np=2, launcher="mpirun", controller="gloo"), "--gloo needs horovodrun"),
    (dict(np=2, start_timeout=0), "--start-timeout 0"),
    (dict(np=2, launcher="tf_config", controller="gloo"), "TF_CONFIG: drop it"),
    # Ray and Spark place the workers themselves (issue 38)
    (dict(np=2, address="h:6379"), "--address is Ray's; add --launcher ray"),
    (dict(np=2, launcher="ray", master="spark://h:7077"), "--master is Spark's; add --launcher spark"),
    (dict(np=2, cpus_per_worker=2), "add --launcher ray or spark"),
    (dict(np=2, launcher="ray", hosts="a:2"), "-H/--hostfile: ray places the workers on its own nodes"),
    (dict(np=2, launcher="spark", controller="mpi"), "--mpi: on spark Horovod's ranks meet over Gloo"),
    (dict(np=2, launcher="ray", cpus_per_worker=0), "CPUs must be more than 0"),
    (dict(np=2, launcher="spark", min_np=1), "drop --launcher spark"),
    (dict(np=2, launcher="ray", min_np=1, backend="native"), "drop --backend native"),
])
def test_bad_launch_specs(kwargs, needle):
    with pytest.raises(ToolkitError) as e:
        LaunchSpec(command=CMD, **kwargs)
    assert needle in str(e.value)


def test_empty_command():
    with pytest.raises(ToolkitError, match="no command"):
        LaunchSpec(command=(), np=2)


def test_every_launcher_is_a_row_of_the_table_and_a_choice_of_the_cli():
    """--launcher offers the table's names (the parser does not import the table, to start quickly)."""
    from toolkit.commands import launch as command

    sub = argparse.ArgumentParser().add_subparsers()
    command.register(sub)
    assert f"--launcher {{{','.join(LAUNCHERS)}}}" in sub.choices["launch"].format_help()
    assert all(name == launcher.name for name, launcher in LAUNCHERS.items())


def test_cli_dry_run_prints_the_command():
    proc = toolkit("launch", "-np", "2", "--gloo", "--dry-run", "--", "python", "x.py", "--lr", "0.1")
    assert proc.returncode == 0, proc.stderr
    # what really runs: horovodrun as `python -m toolkit.launch.horovodrun` (its build check made cheap)
    assert f"{sys.executable} -m toolkit.launch.horovodrun -np 2 -H localhost:2 --start-timeout 60 --gloo python x.py " \
           "--lr 0.1" in proc.stdout


def test_horovodruns_verbose_and_output_filename_reach_the_launchers_that_have_them(tmp_path):
    """--output-filename DIR: every rank's output in its own files (horovodrun: DIR/rank.N/stdout), still on
    the terminal; mpirun gets Open MPI's own flags, torchrun --log-dir; the others refuse in one line."""
    out = tmp_path / "out"
    proc = toolkit("launch", "-np", "2", "--gloo", "--output-filename", out, "--", sys.executable, "-c",
                   "import os; print('rank', os.environ['HOROVOD_RANK'])", timeout=120)
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        assert f"rank {rank}" in (out / f"rank.{rank}" / "stdout").read_text()
        assert f"rank {rank}" in proc.stdout
    for launcher, flags in (("horovodrun", "--gloo --verbose --output-filename d python"),
                            ("mpirun", "--verbose --output-filename d python")):
        dry = toolkit("launch", "-np", "2", "--launcher", launcher, *(["--gloo"] if launcher == "horovodrun" else []),
                      "--verbose", "--output-filename", "d", "--dry-run", "--", "python", "x.py")
        assert dry.returncode == 0 and flags in dry.stdout, dry.stdout + dry.stderr
    dry = toolkit("launch", "-np", "2", "--backend", "native", "--framework", "torch", "--output-filename", "d",
                  "--dry-run", "--", "python", "x.py")
    assert dry.returncode == 0 and "--log-dir d " in dry.stdout, dry.stdout + dry.stderr
    one_line_error(toolkit("launch", "-np", "2", "--backend", "native", "--framework", "torch", "--verbose", "--",
                           "true"), "--verbose: torchrun has no such option", "LOGLEVEL=INFO")
    one_line_error(toolkit("launch", "-np", "2", "--launcher", "ray", "--output-filename", "d", "--", "true"),
                   "--output-filename: Ray has no such option", "horovodrun's and mpirun's")


def test_cli_np_more_than_slots_is_one_line_error():
    one_line_error(toolkit("launch", "-np", "4", "-H", "localhost:2", "--", "true"), "-np 4", "slots")


def test_cli_propagates_exit_code_and_times_out():
    proc = toolkit("launch", "-np", "1", "--launcher", "mpirun", "--", "sh", "-c", "exit 3", timeout=60)
    assert proc.returncode == 3
    proc = toolkit("launch", "-np", "1", "--launcher", "mpirun", "--timeout", "2", "--", "sleep", "30", timeout=60)
    assert proc.returncode == 124
    one_line_error(proc, "--timeout 2s")


def test_tf_config_workers_on_this_host():
    ports = iter([4001, 4002])
    workers = tf_config.plan_workers(LaunchSpec(command=CMD, np=2, launcher="tf_config"),
                                  environ={"PATH": "/bin"}, port=lambda: next(ports))
    configs = [json.loads(env["TF_CONFIG"]) for _, env in workers]
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert all(c["cluster"] == {"worker": ["localhost:4001", "localhost:4002"]} for c in configs)
    assert all(argv == list(CMD) for argv, _ in workers)


def test_tf_config_workers_across_hosts_fill_slots_in_order():
    spec = LaunchSpec(command=CMD, np=3, hosts="a:2,b:2", launcher="tf_config")
    workers = tf_config.plan_workers(spec, environ={"PATH": "/bin", "TOOLKIT_EPOCHS": "3"})
    base = tf_config.TF_CONFIG_BASE_PORT
    cluster = [f"a:{base}", f"a:{base + 1}", f"b:{base}"]
    for index, (argv, env) in enumerate(workers):
        assert json.loads(env["TF_CONFIG"]) == {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}}
        assert argv[:3] == ["ssh", "-o", "BatchMode=yes"] and argv[3] == cluster[index].split(":")[0]
        remote = shlex.split(argv[4])        # the environment travels in the remote command line
        assert "TOOLKIT_EPOCHS=3" in remote and remote[-len(CMD):] == list(CMD)
        assert json.loads(next(a for a in remote if a.startswith("TF_CONFIG="))[10:])["task"]["index"] == index


def test_remote_tf_worker_runs_this_virtualenvs_python_and_only_tensorflows_variables(tmp_path):
    """The ssh line of a worker on another host, run by a shell with a node's bare PATH (as sshd
    gives it): a plain `python` there must be this virtualenv's, and another tool's TF_* stays home."""
    spec = LaunchSpec(command=("python", "-c", "import os, sys; print(sys.executable); "
                                      "print(os.environ.get('TF_CLI_CONFIG_FILE'))"),
                             np=2, hosts="localhost:1,b:1", launcher="tf_config")
    environ = {"PATH": "/usr/bin:/bin", "TF_CLI_CONFIG_FILE": "/home/u/.terraformrc", "TF_CPP_MIN_LOG_LEVEL": "1"}
    (_, _), (argv, _) = tf_config.plan_workers(spec, environ=environ, port=lambda: 4001)
    assert argv[:3] == ["ssh", "-o", "BatchMode=yes"] and argv[3] == "b"
    assert "TF_CPP_MIN_LOG_LEVEL=1" in argv[4] and "TF_CLI_CONFIG_FILE=" not in argv[4]
    out = subprocess.run(["sh", "-c", argv[4]], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [sys.executable, "None"]


@pytest.mark.parametrize("args, needle", [
    (["--backend", "native", "--launcher", "mpirun"], "drop --launcher mpirun"),
    (["--framework", "mxnet", "--backend", "native"], "--backend native is not available for --framework mxnet"),
    (["--backend", "native", "--gloo"], "drop it"),
])
def test_cli_native_launch_errors(args, needle):
    one_line_error(toolkit("launch", "-np", "2", *args, "--", "true"), needle)


@pytest.mark.parametrize("args, needle", [
    (["--launcher", "ray", "--backend", "native", "--framework", "tensorflow"], "--backend native on ray is torch's"),
    (["--launcher", "spark", "--emit", "slurm"], "--emit slurm writes a job for Slurm or Kubernetes"),
    (["--launcher", "ray", "--address", "nowhere"], "--address nowhere: expected HOST:PORT"),
])
def test_cli_engine_launch_errors(args, needle):
    one_line_error(toolkit("launch", "-np", "2", *args, "--", "true"), needle)


def test_cli_native_dry_run_sets_framework_and_backend():
    proc = toolkit("launch", "-np", "2", "--framework", "tensorflow", "--backend", "native", "--dry-run", "--", "true")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all("TOOLKIT_BACKEND=native TOOLKIT_FRAMEWORK=tensorflow" in ln for ln in lines)


# -- torchrun: `--backend native` for torch (launcher.plan_torchrun) ----------------------------------

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TEE = ["--tee", "3", "--log-line-prefix-template", torchrun.TORCHRUN_TAG]


@pytest.mark.parametrize("hosts_", [None, "localhost:2"])
def test_torchrun_on_one_host_is_one_standalone_torchrun(hosts_):
    spec = LaunchSpec(command=CMD, np=2, hosts=hosts_, launcher="torchrun")
    [(argv, env)] = torchrun.plan_torchrun(spec, environ={"PATH": "/bin"})
    # this Python's torch; the command runs as given (`python` is this virtualenv's, first on PATH)
    assert argv == TORCHRUN + ["--standalone", "--nproc-per-node", "2", *TEE, "--no-python", *CMD]
    assert env["PATH"] == f"{os.path.dirname(sys.executable)}{os.pathsep}/bin"
    assert env["OMP_NUM_THREADS"] == "1" and env["PYTHONUNBUFFERED"] == "1"   # torchrun's own default, without its banner


def test_torchrun_across_hosts_is_one_torchrun_per_host_over_ssh_meeting_at_the_first():
    spec = LaunchSpec(command=CMD, np=4, hosts="a:2,b:2", launcher="torchrun", network_interface="eth0",
                             start_timeout=30, ssh_port=2222)
    workers = torchrun.plan_torchrun(spec, environ={"PATH": "/bin", "TOOLKIT_EPOCHS": "3", "HOME": "/root"},
                                   job_id="job1")
    rendezvous = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                  f"a:{torchrun.TORCHRUN_PORT}", "--rdzv-id", "job1", "--rdzv-conf", "join_timeout=30"]
    assert [argv[:6] for argv, _ in workers] == [["ssh", "-o", "BatchMode=yes", "-p", "2222", host] for host in "ab"]
    for argv, env in workers:
        remote = shlex.split(argv[6])
        assert remote[:3] == ["cd", os.getcwd(), "&&"] and remote[4] == f"PATH={os.path.dirname(sys.executable)}:$PATH"
        assert {"TOOLKIT_EPOCHS=3", "GLOO_SOCKET_IFNAME=eth0", "NCCL_SOCKET_IFNAME=eth0", "OMP_NUM_THREADS=1"} <= set(remote)
        assert "HOME=/root" not in remote
        assert remote[remote.index(sys.executable):] == TORCHRUN + rendezvous + TEE + ["--no-python", *CMD]
    # the first host is this machine: its torchrun runs here, the others find it by name, on a free port
    spec = LaunchSpec(command=CMD, np=4, hosts="localhost:2,b:2", launcher="torchrun")
    (here, env), (there, _) = torchrun.plan_torchrun(spec, environ={}, port=lambda: 4001, job_id="job1")
    assert here[:len(TORCHRUN)] == TORCHRUN and here[here.index("--rdzv-endpoint") + 1] == f"{socket.gethostname()}:4001"
    assert there[0] == "ssh" and f"--rdzv-endpoint {socket.gethostname()}:4001" in there[-1]


def test_torchrun_fills_the_hosts_in_order_and_needs_the_same_ranks_on_each():
    def nodes(np_, hosts_):
        return torchrun.torchrun_nodes(LaunchSpec(command=CMD, np=np_, hosts=hosts_, launcher="torchrun"))

    assert nodes(4, "a:2,b:4") == [("a", 2), ("b", 2)]
    assert nodes(2, "a:2,b:2") == [("a", 2)]          # b is not used: one host, standalone (over ssh)
    [(argv, _)] = torchrun.plan_torchrun(LaunchSpec(command=CMD, np=2, hosts="a:2,b:2", launcher="torchrun"),
                                       environ={})
    assert argv[:4] == ["ssh", "-o", "BatchMode=yes", "a"] and "--standalone --nproc-per-node 2" in argv[4]
    for np_, hosts_, needle in [(3, "a:2,b:2", "-np 3 on -H a:2,b:2 puts 2+1 ranks on its hosts"),
                                (6, "a:4,b:2", "use -np 4")]:
        with pytest.raises(ToolkitError) as e:
            nodes(np_, hosts_)
        assert needle in str(e.value) and "--nproc-per-node" in str(e.value) and "\n" not in str(e.value)


def test_torchrun_elastic_counts_whole_hosts_and_its_bad_inputs(tmp_path):
    def argv(**kw):
        spec = LaunchSpec(command=CMD, launcher="torchrun", **kw)
        return " ".join(torchrun.plan_torchrun(spec, environ={}, port=lambda: 4001, job_id="j")[0][0])

    assert "--nnodes 1:3 --max-restarts 3 --nproc-per-node 2" in argv(np=4, hosts="a:2,b:2", min_np=2, max_np=6)
    assert "--nnodes 2:2 --max-restarts 3" in argv(np=4, hosts="a:2,b:2", min_np=4)
    one = argv(np=2, min_np=2)             # one host: the rendezvous, not --standalone, so it can restart
    assert "--standalone" not in one and "--nnodes 1:1 --max-restarts 3" in one and "--rdzv-endpoint localhost:4001" in one
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    script.chmod(0o755)
    for kw, needle in [(dict(np=4, hosts="a:2,b:2", min_np=3), "--min-np 3: torchrun's elastic unit is a node of 2"),
                       (dict(np=4, hosts="a:2,b:2", min_np=2, max_np=5), "--max-np 5"),
                       (dict(np=2, min_np=2, discovery=str(script)), "torchrun has none"),
                       (dict(np=2, max_np=4), "add --min-np"),
                       (dict(np=2, min_np=3), "--min-np (3) <= -np (2)"),
                       (dict(np=2, controller="gloo"), "its own rendezvous: drop it")]:
        with pytest.raises(ToolkitError) as e:
            LaunchSpec(command=CMD, launcher="torchrun", **kw)
        assert needle in str(e.value) and "\n" not in str(e.value), (kw, str(e.value))
    assert "discovery" not in str(e.value)


def test_cli_native_torch_dry_run_is_one_torchrun_per_host():
    proc = toolkit("launch", "-np", "2", "--framework", "torch", "--backend", "native", "--dry-run", "--", "python", "x.py")
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.splitlines()
    assert line.startswith("OMP_NUM_THREADS=1 TOOLKIT_BACKEND=native TOOLKIT_FRAMEWORK=torch ")
    assert f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node 2 " in line
    assert line.endswith(" --no-python python x.py")
    proc = toolkit("launch", "-np", "4", "-H", "a:2,b:2", "--framework", "torch", "--backend", "native", "--min-np", "2",
                   "--dry-run", "--", "python", "x.py")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all("--nnodes 1:2 --max-restarts 3" in ln for ln in lines)
    assert "TOOLKIT_ELASTIC_" not in proc.stdout     # torchrun restarts the ranks; no Horovod elastic on them


def test_cli_native_framework_is_the_ranks_own(tmp_path):
    """The command's --framework, TOOLKIT_FRAMEWORK, or its --config file's framework picks the launcher."""
    def launched(*args, env=None):
        proc = toolkit("launch", "-np", "2", "--backend", "native", "--dry-run", *args, env=env)
        assert proc.returncode == 0, proc.stderr
        return "torch.distributed.run" in proc.stdout, "TF_CONFIG=" in proc.stdout

    assert launched("--", "python", "t.py", "--framework", "torch") == (True, False)
    assert launched("--", "python", "t.py", "--framework=tensorflow") == (False, True)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("framework: torch\n")
    assert launched("--", "python", "t.py", "--config", cfg) == (True, False)
    from tests.conftest import clean_env
    assert launched("--", "python", "t.py", env=clean_env(TOOLKIT_FRAMEWORK="tensorflow")) == (False, True)


@pytest.mark.parametrize("args, needle", [
    (["--backend", "native"], "add --framework torch or --framework tensorflow"),
    (["--backend", "native", "--framework", "tensorflow", "--launcher", "torchrun"], "--launcher torchrun does not start"),
    (["--backend", "native", "--framework", "torch", "--launcher", "tf_config"], "torch uses torchrun"),
    (["--backend", "native", "--framework", "tensorflow", "--", "t.py", "--framework", "torch"],
     "the command's --framework torch wins"),
    (["--backend", "native", "--framework", "torch", "--fusion-threshold-mb", "8", "--timeline-file", "t.json"],
     "--fusion-threshold-mb --timeline-file: Horovod's tuning"),
    (["--backend", "native", "--framework", "torch", "--mpi"], "--mpi is a Horovod controller"),
    (["--backend", "native", "--framework", "torch", "--emit", "mpijob", "--image", "x"], "PyTorchJob"),
])
def test_cli_torchrun_errors(args, needle):
    argv = args if "--" in args else [*args, "--", "python", "t.py"]
    one_line_error(toolkit("launch", "-np", "2", *argv), needle)


def test_emit_slurm_with_torchrun_is_one_torchrun_per_node():
    proc = toolkit("launch", "-np", "8", "-H", "n1:4,n2:4", "--framework", "torch", "--backend", "native", "--emit",
                   "slurm", "--gpus", "--network-interface", "ib0", "--", "python", "examples/train.py")
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    sbatch = dict(line[len("#SBATCH --"):].split("=", 1) for line in script.splitlines() if line.startswith("#SBATCH"))
    assert sbatch == {"job-name": "toolkit", "nodes": "2", "ntasks": "2", "ntasks-per-node": "1", "time": "01:00:00",
                      "gpus-per-node": "4"}
    assert "export TOOLKIT_BACKEND=native" in script and "export GLOO_SOCKET_IFNAME=ib0 NCCL_SOCKET_IFNAME=ib0" in script
    assert script.rstrip().splitlines()[-1] == (
        "srun --kill-on-bad-exit=1 --cpu-bind=none torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d "
        '--rdzv-endpoint "$head:29400" --rdzv-id "$SLURM_JOB_ID" --no-python python examples/train.py')
    syntax = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True, timeout=10)
    assert syntax.returncode == 0, syntax.stderr


RANKS_SCRIPT = """\
import os, sys, time
if "FAIL_RANK" in os.environ:     # that rank fails at once (no torch import: quicker); torchrun stops the others
    if os.environ["RANK"] == os.environ["FAIL_RANK"]:
        print("rank failing on purpose", file=sys.stderr)
        sys.exit(3)
    time.sleep(60)
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("sum", int(t), os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"])
dist.destroy_process_group()
"""


def test_torchrun_job_runs_and_a_failed_ranks_code_is_the_jobs(tmp_path):
    """Two ranks through `toolkit launch --backend native --framework torch` (torchrun, Gloo): each line
    tagged with its rank; a rank exiting 3 makes the job exit 3, shown as its own lines and one line
    naming it, without torchrun's ChildFailedError traceback and report."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    argv = ["launch", "--backend", "native", "--framework", "torch", "-np", "2", "--timeout", "120", "--",
            "python", script]
    proc = toolkit(*argv, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0]<stdout>:sum 3 0 2", "[1]<stdout>:sum 3 1 2"]
    assert not proc.stderr, proc.stderr
    from tests.conftest import clean_env
    proc = toolkit(*argv, timeout=150, env=clean_env(FAIL_RANK="1"))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == ["[1]<stderr>:rank failing on purpose",
                                        "toolkit: error: launch: rank 1 exited with code 3 (its output is above)"]


def test_hostfile_formats_and_errors(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# cluster\nnode1 slots=4\nnode2:2   # a comment\n\nnode3 slots=1 max_slots=8\n")
    assert hosts.read_hostfile(str(f)) == "node1:4,node2:2,node3:1"
    f.write_text("node1 gpus=4\n")
    with pytest.raises(ToolkitError, match=r"line 1: 'gpus=4' not understood"):
        hosts.read_hostfile(str(f))
    f.write_text("# nothing\n")
    with pytest.raises(ToolkitError, match="no hosts"):
        hosts.read_hostfile(str(f))
    one_line_error(toolkit("launch", "-np", "2", "--hostfile", tmp_path / "missing", "--", "true"), "--hostfile", "not found")


def test_ssh_options_reach_every_launcher(tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text("key")
    common = dict(command=CMD, np=2, hosts="a:1,b:1", ssh_port=2222, ssh_identity_file=str(key))
    argv, _ = horovodrun.plan(LaunchSpec(**common), environ={})
    assert argv[argv.index("--ssh-port") + 1] == "2222" and argv[argv.index("--ssh-identity-file") + 1] == str(key)
    argv, _ = mpirun.plan(LaunchSpec(**common, launcher="mpirun"), environ={})
    assert argv[argv.index("plm_rsh_args") + 1] == f"-p 2222 -i {key}"
    workers = tf_config.plan_workers(LaunchSpec(**common, launcher="tf_config"), environ={})
    assert all(argv[3:7] == ["-p", "2222", "-i", str(key)] for argv, _ in workers)
    with pytest.raises(ToolkitError, match="--ssh-port 70000"):
        LaunchSpec(command=CMD, ssh_port=70000)
    with pytest.raises(ToolkitError, match="--ssh-identity-file .* not found"):
        LaunchSpec(command=CMD, ssh_identity_file=str(tmp_path / "nope"))


def test_tuning_flags_become_horovod_variables_for_every_rank():
    proc = toolkit("launch", "-np", "2", "--launcher", "mpirun", "--fusion-threshold-mb", "32", "--cycle-time-ms",
                   "2.5", "--autotune", "--timeline-file", "t.json", "--dry-run", "--", "true")
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout
    assert f"HOROVOD_FUSION_THRESHOLD={32 * 1024 * 1024}" in line and "HOROVOD_CYCLE_TIME=2.5" in line
    assert "HOROVOD_AUTOTUNE=1" in line and f"HOROVOD_TIMELINE={os.path.abspath('t.json')}" in line
    assert "-x HOROVOD_FUSION_THRESHOLD" in line      # mpirun forwards them
    one_line_error(toolkit("launch", "-np", "2", "--cycle-time-ms", "0", "--", "true"), "--cycle-time-ms 0")


def test_emit_slurm_script():
    proc = toolkit("launch", "-np", "8", "-H", "n1:4,n2:4", "--emit", "slurm", "--gpus", "--timeout", "5400",
                   "--env", "TOOLKIT_EPOCHS=3", "--framework", "torch", "--", "python", "examples/train.py", "--lr", "0.1")
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    sbatch = dict(line[len("#SBATCH --"):].split("=", 1) for line in script.splitlines() if line.startswith("#SBATCH"))
    assert sbatch == {"job-name": "toolkit", "nodes": "2", "ntasks": "8", "ntasks-per-node": "4",
                      "time": "01:30:00", "gpus-per-node": "4"}
    assert "export TOOLKIT_EPOCHS=3" in script and "export TOOLKIT_FRAMEWORK=torch" in script
    assert script.rstrip().splitlines()[-1] == ("srun --mpi=pmix --kill-on-bad-exit=1 --cpu-bind=none "
                                                "python examples/train.py --lr 0.1")
    syntax = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True, timeout=10)
    assert syntax.returncode == 0, syntax.stderr
    one_line_error(toolkit("launch", "-np", "3", "-H", "n1:2,n2:1", "--emit", "slurm", "--", "true"),
                   "different slot counts")


def test_emitted_slurm_script_requeues_a_preempted_job_and_the_next_run_resumes(tmp_path):
    """With --checkpoint-dir the script asks Slurm for SIGTERM 120 s before the limit, requeues the job
    when the ranks exit 75 (preempted, checkpointed) and passes --resume once a checkpoint exists. Run
    here with stand-ins for srun and scontrol that record their arguments."""
    ckpt = tmp_path / "ckpt"
    proc = toolkit("launch", "-np", "2", "--emit", "slurm", "--", "python", "examples/train.py", "--checkpoint-dir",
                   str(ckpt))
    script = proc.stdout
    assert "#SBATCH --signal=TERM@120" in script and "#SBATCH --requeue" in script
    (tmp_path / "bin").mkdir()
    for tool in ("srun", "scontrol"):
        stub = tmp_path / "bin" / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} $*" >> {tmp_path}/calls\nexit ${{STUB_EXIT:-0}}\n')
        stub.chmod(0o755)
    (tmp_path / "job.sh").write_text(script)

    def job(exit_code):
        env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", SLURM_JOB_ID="42",
                   STUB_EXIT=str(exit_code))
        rc = subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, timeout=30).returncode
        calls = (tmp_path / "calls").read_text().splitlines()
        (tmp_path / "calls").unlink()
        return rc, calls

    rc, calls = job(75)          # preempted before any checkpoint: requeued, no --resume
    assert rc == 75 and calls[0].endswith(f"--checkpoint-dir {ckpt}") and calls[1:] == ["scontrol requeue 42"]
    (ckpt / "ckpt-00000029").mkdir(parents=True)
    rc, calls = job(0)           # the requeued run resumes, and is not requeued again
    assert rc == 0 and calls == [calls[0]] and calls[0].endswith(f"--checkpoint-dir {ckpt} --resume")
    rc, calls = job(1)           # a failure is not a preemption
    assert rc == 1 and len(calls) == 1
    if shutil.which("shellcheck") or (Path(sys.executable).parent / "shellcheck").exists():
        sc = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
        check = subprocess.run([sc, "-"], input=script, text=True, capture_output=True)
        assert check.returncode == 0, check.stdout


def test_emit_slurm_reads_checkpoint_dir_from_the_config_the_command_names(tmp_path):
    """Issue 33: the README's own example (`--config examples/cfg.yaml`, whose checkpoint_dir is
    runs/exp1) got no --signal/--requeue: only a --checkpoint-dir on the command line counted. The
    ranks' precedence holds: the flag, then a TOOLKIT_CHECKPOINT_DIR given with --env, then the file."""
    def emitted(*args, command=("python", "examples/train.py")):
        proc = toolkit("launch", "-np", "2", *args, "--emit", "slurm", "--", *command)
        assert proc.returncode == 0, proc.stderr
        resumes = [line for line in proc.stdout.splitlines() if line.startswith("resume=()")]
        assert len(resumes) <= 1
        requeued = "#SBATCH --signal=TERM@120" in proc.stdout and "#SBATCH --requeue" in proc.stdout
        assert requeued == bool(resumes), proc.stdout
        return shlex.split(resumes[0])[3][:-len("/ckpt-*")] if resumes else None

    readme = ("python", "examples/train.py", "--config", "examples/cfg.yaml")
    assert emitted(command=readme) == "runs/exp1"
    other = tmp_path / "other.yaml"
    other.write_text("epochs: 2\n")
    assert emitted(command=("python", "examples/train.py", f"--config={other}")) is None
    assert emitted(command=(*readme, "--checkpoint-dir", "runs/mine")) == "runs/mine"
    assert emitted("--env", "TOOLKIT_CHECKPOINT_DIR=runs/env", command=readme) == "runs/env"
    one_line_error(toolkit("launch", "-np", "2", "--emit", "slurm", "--", "python", "t.py", "--config",
                           tmp_path / "missing.yaml"), "file not found")


def test_emit_mpijob_manifest():
    import yaml
    proc = toolkit("launch", "-np", "4", "-H", "n1:2,n2:2", "--emit", "mpijob", "--image", "example/toolkit:cpu",
                   "--gpus", "--timeout", "600", "--env", "TOOLKIT_EPOCHS=3", "--", "python", "examples/train.py")
    assert proc.returncode == 0, proc.stderr
    job = yaml.safe_load(proc.stdout)
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    spec = job["spec"]
    assert spec["slotsPerWorker"] == 2 and spec["runPolicy"]["activeDeadlineSeconds"] == 600
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    worker = spec["mpiReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 2 and spec["mpiReplicaSpecs"]["Launcher"]["replicas"] == 1
    assert worker["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    command = launcher["command"]
    assert command[:4] == ["mpirun", "--allow-run-as-root", "-np", "4"] and command[-2:] == ["python", "examples/train.py"]
    assert {"name": "TOOLKIT_EPOCHS", "value": "3"} in launcher["env"] and "TOOLKIT_EPOCHS" in command
    assert "&id" not in proc.stdout
    pod = worker["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 120, "time for a step and a checkpoint after SIGTERM"
    hook = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["/bin/sh", "-c"] and "pkill -TERM -f 'python examples/train.py'" in hook[2]
    one_line_error(toolkit("launch", "-np", "2", "--emit", "mpijob", "--", "true"), "--image")


def test_elastic_horovodrun_command_and_its_bad_inputs(tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    script.chmod(0o755)
    argv, _ = horovodrun.plan(LaunchSpec(command=("python", "t.py"), np=2, min_np=1, max_np=4,
                                            discovery=str(script), network_interface="lo"), environ={})
    line = " ".join(argv)
    assert f"--host-discovery-script {script}" in line and "--min-np 1 --max-np 4" in line and " -H " not in line
    argv, _ = horovodrun.plan(LaunchSpec(command=("t",), np=2, hosts="a:1,b:1", min_np=1), environ={})
    assert "-H a:1,b:1" in " ".join(argv) and "--min-np 1" in " ".join(argv)
    bad = [
        (dict(min_np=1, discovery=str(script), controller="mpi"), "Gloo only"),
        (dict(min_np=1, discovery=str(script), launcher="mpirun"), "drop --launcher mpirun"),
        (dict(min_np=3, discovery=str(script)), "--min-np (3) <= -np (2)"),
        (dict(min_np=1, max_np=1, discovery=str(script)), "<= --max-np (1)"),
        (dict(min_np=1), "at least two hosts"),
        (dict(discovery=str(tmp_path / "missing.sh")), "not an executable file"),
        (dict(max_np=4), "--max-np applies to elastic jobs"),
    ]
    for kw, needle in bad:
        with pytest.raises(ToolkitError, match=None) as e:
            LaunchSpec(command=("t",), np=2, **kw)
        assert needle in str(e.value) and "\n" not in str(e.value), (kw, str(e.value))


def test_launch_reads_the_elastic_block_of_the_commands_config(tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    script.chmod(0o755)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"elastic: {{min_np: 1, max_np: 2, discovery: {script}}}\nepochs: 3\n")
    out = toolkit("launch", "-np", "2", "--dry-run", "--", "python", "t.py", "--config", cfg)
    assert out.returncode == 0, out.stderr
    assert f"--host-discovery-script {script}" in out.stdout and "--min-np 1 --max-np 2" in out.stdout
    out = toolkit("launch", "-np", "2", "--max-np", "3", "--dry-run", "--", "python", "t.py", "--config", cfg)
    assert "--max-np 3" in out.stdout, out.stderr


# -- what `toolkit launch` prints of a failed job (toolkit/launch/output.py) ----------------------

HOROVODRUN_GLOO_FAILURE = """\
[0]<stderr>:toolkit: error: staleness=-1 must be >= 0
[1]<stderr>:toolkit: error: staleness=-1 must be >= 0
Process 0 exit with status code 2.
Terminating remaining workers after failure of Process 0.
[1]<stderr>:Terminated
Process 1 exit with status code 143.
Traceback (most recent call last):
  File "horovod/runner/launch.py", line 837, in run_commandline
RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the job to be terminated. The first process to do so was:
Process name: 0
Exit code: 2
"""

MPIRUN_FAILURE = """\
[1,1]<stderr>:Segmentation fault
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[18077,1],1]
  Exit code:    139
--------------------------------------------------------------------------
"""


def relay_of(text: str, returncode: int):
    import io

    from toolkit.launch.output import Relay
    out, err = io.StringIO(), io.StringIO()
    relay = Relay(out, err)
    for line in text.splitlines(keepends=True):
        relay.line(line, err)
    return relay.finish(returncode), err.getvalue()


def test_a_failed_rank_shows_its_line_and_its_exit_code_not_the_launchers_traceback():
    code, err = relay_of(HOROVODRUN_GLOO_FAILURE, 1)
    assert code == 2
    assert err.splitlines() == ["[0]<stderr>:toolkit: error: staleness=-1 must be >= 0",
                                "[1]<stderr>:toolkit: error: staleness=-1 must be >= 0"]


def test_a_rank_that_died_without_a_word_is_named_once():
    code, err = relay_of(MPIRUN_FAILURE, 139)
    assert code == 139
    assert err.splitlines() == ["[1,1]<stderr>:Segmentation fault",
                                "toolkit: error: launch: rank 1 exited with code 139 (its output is above)"]


MPIRUN_GARBLED_ABORTS = """\
[1,2]<stderr>:toolkit: error: step 3: the loss is nan (not finite)
[1,1]<stderr>:toolkit: error: step 3: the loss is nan (not finite)
[vm:08839] [[20089,0],0] ORTE_ERROR_LOG: Data unpack would read past end of buffer in file ../../../orte/util/show_help.c at line 513
[vm:08839] [[20089,0],0] ORTE_ERROR_LOG: Out of resource in file ../../../orte/util/show_help.c at line 507
"""


def test_open_mpis_garbled_report_of_two_aborts_is_dropped_when_the_ranks_said_why():
    """Seen in CI: two parameter-server workers called MPI_Abort together and mpirun's show_help
    failed to unpack their banners; the ranks' own lines are the report. Without them it is printed."""
    code, err = relay_of(MPIRUN_GARBLED_ABORTS, 2)
    assert code == 2 and err.splitlines() == MPIRUN_GARBLED_ABORTS.splitlines()[:2]
    alone = "".join(MPIRUN_GARBLED_ABORTS.splitlines(keepends=True)[2:])
    assert relay_of(alone, 2) == (2, alone)


def test_an_unexplained_launcher_failure_is_printed_as_it_came():
    text = "Traceback (most recent call last):\n  File 'x.py', line 1\nKeyError: 'mystery'\n"
    code, err = relay_of(text, 1)
    assert code == 1 and err == text
    assert relay_of("[0]<stdout>:{}\nsome launcher note\n", 0) == (0, "[0]<stdout>:{}\nsome launcher note\n")


MPIRUN_SSH_LOGIN_FAILED = """\
root@hostb: Permission denied (publickey).
--------------------------------------------------------------------------
ORTE was unable to reliably start one or more daemons.
This usually is caused by:

* not finding the required libraries and/or binaries on
  one or more nodes. Please check your PATH and LD_LIBRARY_PATH
  settings, or configure OMPI with --enable-orterun-prefix-by-default
--------------------------------------------------------------------------
"""


def test_mpiruns_ssh_banner_is_one_line_with_sshs_reason():
    """Recorded from `toolkit launch --launcher mpirun` with a key hostB refuses (tests/test_multihost.py
    runs it for real); the banner is shortened here. A job that succeeds prints what it held."""
    code, err = relay_of(MPIRUN_SSH_LOGIN_FAILED, 255)
    assert code == 255
    assert err.splitlines() == ["toolkit: error: launch: mpirun could not start on the other hosts over ssh "
                                "(root@hostb: Permission denied (publickey).); check that ssh to each of them "
                                "works without a password"]
    assert relay_of("ssh: a warning\n[1,0]<stdout>:{}\n", 0) == (0, "[1,0]<stdout>:{}\nssh: a warning\n")


# Recorded from torchrun 2.14 (`toolkit launch --backend native --framework torch -np 2`, rank 1 exits 3);
# the ranks' lines carry launcher.TORCHRUN_TAG's `[rank]<std>:`. (stream, line) pairs.
TORCHRUN_FAILURE = [("out", "[0]<std>:sum 3 0 2"), ("out", "[1]<std>:sum 3 1 2"),
                    ("err", "[1]<std>:rank 1 failing"),
                    ("err", "W1126 06:57:02.056000 19470 .venv/lib/python3.11/site-packages/torch/distributed/elastic/"
                            "multiprocessing/api.py:1028] Sending process 19478 closing signal SIGTERM"),
                    ("err", "E1126 06:57:02.245000 19470 .venv/lib/python3.11/site-packages/torch/distributed/elastic/"
                            "multiprocessing/api.py:1002] failed (exitcode: 3) local_rank: 1 (pid: 19479) of binary: "
                            "python")] + [("err", line) for line in """\
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1142, in <module>
    main()
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 386, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
ok.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-26_06:52:05
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 15946)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 15946
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-26_06:52:04
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 15947)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================""".splitlines()]


def test_torchruns_failure_report_becomes_the_failed_ranks_lines_and_its_exit_code():
    import io

    from toolkit.launch.output import Relay

    def relay(lines, returncode):
        out, err = io.StringIO(), io.StringIO()
        r = Relay(out, err)
        for stream, text in lines:
            r.line(text + "\n", out if stream == "out" else err)
        return r.finish(returncode), out.getvalue().splitlines(), err.getvalue().splitlines()

    code, out, err = relay(TORCHRUN_FAILURE, 1)
    assert code == 3      # the root cause's, not rank 0's -15 (stopped by torchrun) listed first, nor torchrun's 1
    assert out == ["[0]<stdout>:sum 3 0 2", "[1]<stdout>:sum 3 1 2"]
    assert err == ["[1]<stderr>:rank 1 failing", "toolkit: error: launch: rank 1 exited with code 3 (its output is above)"]
    said = [("err", "[1]<std>:toolkit: error: step 3: the loss is nan (not finite)")] + TORCHRUN_FAILURE[3:]
    assert relay(said, 1)[2] == ["[1]<stderr>:toolkit: error: step 3: the loss is nan (not finite)"]
    killed = [(s, t.replace("exitcode  : 3 ", "exitcode  : -9 ")) for s, t in TORCHRUN_FAILURE]
    assert relay(killed, 1)[0] == 128 + 9
    assert relay(TORCHRUN_FAILURE[:2], 0) == (0, ["[0]<stdout>:sum 3 0 2", "[1]<stdout>:sum 3 1 2"], [])


def test_torchruns_pieces_of_two_ranks_lines_on_one_line_come_out_as_each_ranks_whole_line():
    """Seen in CI: torchrun's tail threads copy a line's start as soon as a rank has written it (an
    unbuffered `print` writes word by word), each piece under the rank's tag, so rank 0's `sum` and
    rank 1's whole line shared one line and rank 0's rest came on the next."""
    import io

    from toolkit.launch.output import Relay
    out, err = io.StringIO(), io.StringIO()
    r = Relay(out, err)
    for text in ["[0]<std>:sum[1]<std>:sum 3 1 2\n", "[0]<std>: 3 0 2\n", "[1]<std>:last[0]<std>:x[0]<std>:y\n",
                 "[0]<std>:no newline at the end"]:
        r.line(text, out)
    assert r.finish(0) == 0
    assert out.getvalue().splitlines() == ["[1]<stdout>:sum 3 1 2", "[0]<stdout>:sum 3 0 2", "[0]<stdout>:xy",
                                           "[0]<stdout>:no newline at the end", "[1]<stdout>:last"]


def test_the_ssh_port_probe_follows_sshs_configuration(tmp_path, monkeypatch):
    """`ssh -G` says where a host's ssh really is; a host behind a ProxyJump/ProxyCommand is left to
    ssh. A stand-in ssh points `farhost` at a closed port on loopback."""
    from toolkit.launch.hosts import is_this_machine, ssh_port_answers

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    fake = tmp_path / "ssh"
    fake.write_text(f'#!/bin/sh\necho "hostname 127.0.0.1"\necho "port {closed}"\necho "proxyjump $PROXY"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    spec = LaunchSpec(command=("true",), np=2, hosts="localhost:1,farhost:1", start_timeout=5)
    monkeypatch.setenv("PROXY", "none")
    why = ssh_port_answers("farhost", spec)
    assert why.startswith(f"farhost: its ssh port (127.0.0.1:{closed}) refused the connection"), why
    monkeypatch.setenv("PROXY", "bastion")
    assert ssh_port_answers("farhost", spec) is None
    assert is_this_machine("127.0.0.2") and is_this_machine(socket.gethostname())
    assert not is_this_machine("nosuchhost.invalid")
