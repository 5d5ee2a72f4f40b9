"""`toolkit launch`: start N ranks with horovodrun, plain mpirun, as TensorFlow workers or with torchrun, with timeouts.

--backend native starts the framework's own workers: torchrun for torch, TF_CONFIG workers for TensorFlow.
The framework is the ranks' own: the command's --framework, else TOOLKIT_FRAMEWORK, else this --framework,
else the `framework` of the YAML file the command passes with --config; unknown, it is an error."""
import argparse
import os
import sys


class LauncherNames:
    """--launcher's choices: the names of toolkit.launch.launchers.LAUNCHERS, imported only when argparse looks
    (a --launcher given, or --help), so building the parser stays quick for every other command."""

    def __iter__(self):
        from toolkit.launch.launchers import LAUNCHERS
        return iter(LAUNCHERS)

    def __contains__(self, name) -> bool:
        return name in list(self)


def register(sub) -> None:
    p = sub.add_parser("launch", help="start a command on N ranks: horovodrun (default), mpirun, torchrun, "
                                      "TF_CONFIG workers, Ray or Spark",
                       usage="toolkit launch -np N [-H host:slots,...|--hostfile FILE] [--gloo|--mpi] [--framework F] "
                             "[--backend horovod|native] [--launcher ray [--address ADDR]|spark [--master URL]] [--dry-run|--emit slurm|mpijob] -- COMMAND ...")
    p.add_argument("-np", "--np", "--num-proc", dest="np", type=int, default=None,
                   help="number of ranks (required, or torchrun's --nproc-per-node on one host)")
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", type=int, default=None,
                   help="torchrun's spelling: ranks on this one host (the same as -np N; several hosts: -H)")
    p.add_argument("--nnodes", default=None, help="torchrun's: 1 (one host) with --nproc-per-node; several hosts "
                                                  "are -H host:N,...; elastic MIN:MAX is --min-np/--max-np")
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", default=None, help="host:slots,... (default localhost:N)")
    hosts.add_argument("--hostfile", default=None, help="one `host slots=N` (or host:N) a line")
    p.add_argument("--launcher", default=None, choices=LauncherNames(),
                   help="default horovodrun; with --backend native: torchrun (torch) or tf_config (tensorflow); "
                        "ray or spark: the workers run on that engine (docs/CLUSTERS.md)")
    p.add_argument("--framework", default=None, help="sets TOOLKIT_FRAMEWORK for the ranks (unless set)")
    p.add_argument("--backend", default=None, choices=("horovod", "native"),
                   help="native: no Horovod; torch ranks started by torchrun (torch.distributed), TensorFlow "
                        "workers with TF_CONFIG (MultiWorkerMirroredStrategy)")
    ctl = p.add_mutually_exclusive_group()
    ctl.add_argument("--gloo", dest="controller", action="store_const", const="gloo", help="Gloo controller")
    ctl.add_argument("--mpi", dest="controller", action="store_const", const="mpi", help="MPI controller")
    p.add_argument("--network-interface", default=None, help="NIC for rank traffic, e.g. lo or eth0")
    p.add_argument("-p", "--ssh-port", type=int, default=None, help="ssh port of the other hosts (horovodrun's -p)")
    p.add_argument("--ssh-identity-file", default=None, help="private key for ssh to the other hosts")
    tune = p.add_argument_group("Horovod tuning (as HOROVOD_* variables for every rank)")
    tune.add_argument("--fusion-threshold-mb", type=float, default=None, help="tensor fusion buffer, MiB (0: off)")
    tune.add_argument("--cycle-time-ms", type=float, default=None, help="background cycle time, ms")
    tune.add_argument("--autotune", action="store_true", help="Horovod's autotuner (HOROVOD_AUTOTUNE=1)")
    tune.add_argument("--timeline-file", "--timeline-filename", dest="timeline_file", default=None,
                      help="Horovod timeline file (rank 0 writes it); the same as the config key timeline_file")
    el = p.add_argument_group("elastic (Horovod elastic over Gloo, or torchrun's --nnodes MIN:MAX in whole hosts; "
                              "also the `elastic:` block of the command's --config)")
    el.add_argument("--min-np", type=int, default=None, help="fewest workers the job goes on with")
    el.add_argument("--max-np", type=int, default=None, help="most workers")
    el.add_argument("--host-discovery-script", default=None, help="executable printing `host:slots` lines")
    el.add_argument("--max-restarts", type=int, default=None,
                    help="torchrun's (--backend native): restarts of the workers after a failure before the job "
                         "fails (elastic default 3, else none)")
    eng = p.add_argument_group("Ray and Spark (--launcher ray|spark; docs/CLUSTERS.md)")
    eng.add_argument("--address", default=None, help="Ray: the cluster (HEAD:6379 or auto); none: a local Ray for "
                                                     "the job")
    eng.add_argument("--master", default=None, help="Spark: the master URL (spark://HOST:7077); none: local[N]")
    eng.add_argument("--cpus-per-worker", type=float, default=1, help="CPUs the engine reserves per worker (1)")
    eng.add_argument("--gpus-per-worker", type=float, default=0, help="GPUs the engine reserves per worker (0)")
    p.add_argument("--start-timeout", type=int, default=60, help="seconds for all ranks to start (default 60)")
    p.add_argument("--timeout", type=float, default=None, help="stop the whole job after this many seconds")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra variable for every rank")
    p.add_argument("-x", dest="export", action="append", default=[], metavar="NAME[=VALUE]",
                   help="mpirun's: a variable for every rank; NAME alone passes its value here")
    p.add_argument("--verbose", action="store_true", help="horovodrun's and mpirun's: the launcher says more")
    p.add_argument("--output-filename", default=None, metavar="DIR",
                   help="horovodrun's: each rank's stdout and stderr in files under DIR (also on the terminal); "
                        "mpirun's own; torchrun's --log-dir")
    p.add_argument("--dry-run", action="store_true", help="print the command and environment, run nothing")
    p.add_argument("--emit", default=None, choices=("slurm", "mpijob"),
                   help="print the same launch as an sbatch script or a Kubeflow MPIJob manifest, run nothing")
    p.add_argument("--image", default=None, help="--emit mpijob: the container image of every pod")
    p.add_argument("--gpus", action="store_true", help="one GPU per rank: --emit asks for them")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs, after --")
    p.set_defaults(func=run)


HOROVOD_TUNING = ("fusion_threshold_mb", "cycle_time_ms", "autotune", "timeline_file")


def run(args) -> int:
    from toolkit import config, registry
    from toolkit.errors import ToolkitError
    from toolkit.launch import launcher as launch
    from toolkit.launch.hosts import read_hostfile
    from toolkit.launch.launchers import LAUNCHERS
    from toolkit.launch.spec import LaunchSpec, choose_launcher
    from toolkit.tuning import tuning_env

    args.np = _ranks(args)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    found = config.command_keys(command)
    framework = _framework(args, command, found)
    if framework is not None and args.backend is not None and args.backend not in registry.spec(framework).backends:
        raise ToolkitError(f"--backend {args.backend} is not available for --framework {framework}; "
                           f"use one of: {', '.join(registry.spec(framework).backends)}")
    launcher = choose_launcher(args.launcher, args.backend, framework, args.controller)
    env = list(args.env) + [_exported(item) for item in args.export]
    for key, value in (("framework", args.framework), ("backend", args.backend)):
        if value is not None and f"TOOLKIT_{key.upper()}" not in os.environ:
            env.append(f"TOOLKIT_{key.upper()}={value}")
    tuning = ["--" + name.replace("_", "-") for name in HOROVOD_TUNING
              if getattr(args, name) is not None and getattr(args, name) is not False]
    if launcher == "torchrun" and tuning:
        raise ToolkitError(f"{' '.join(tuning)}: Horovod's tuning, and torchrun's ranks run torch.distributed "
                           f"without Horovod: drop {'it' if len(tuning) == 1 else 'them'}")
    env += tuning_env(args.fusion_threshold_mb, args.cycle_time_ms, args.autotune, args.timeline_file)
    hosts = read_hostfile(args.hostfile) if args.hostfile else args.hosts
    elastic = _elastic_settings(args, found)
    horovod = "horovod" in LAUNCHERS[launcher].backends
    for key, value in elastic.items():     # the ranks learn they run Horovod elastic, from flags too
        # (not under torchrun: it restarts the ranks, which resume from a checkpoint, no Horovod elastic)
        if value is not None and f"TOOLKIT_ELASTIC_{key.upper()}" not in os.environ and horovod:
            env.append(f"TOOLKIT_ELASTIC_{key.upper()}={value}")
    spec = LaunchSpec(min_np=elastic["min_np"], max_np=elastic["max_np"], discovery=elastic["discovery"],
                      command=tuple(command), np=args.np, hosts=hosts, launcher=launcher,
                      max_restarts=args.max_restarts,
                      controller=args.controller, start_timeout=args.start_timeout,
                      network_interface=args.network_interface, env=tuple(env),
                      ssh_port=args.ssh_port, ssh_identity_file=args.ssh_identity_file,
                      address=args.address, master=args.master, cpus_per_worker=args.cpus_per_worker,
                      gpus_per_worker=args.gpus_per_worker, backend=args.backend or "horovod",
                      extra=tuple(LAUNCHERS[launcher].output_flags(args.verbose, args.output_filename)))
    if args.emit and LAUNCHERS[launcher].engine:
        raise ToolkitError(f"--emit {args.emit} writes a job for Slurm or Kubernetes; --launcher {launcher} runs on a "
                           f"{LAUNCHERS[launcher].title} cluster instead: drop one of them")
    if args.emit:
        from toolkit.launch import recipes
        if args.emit == "slurm":
            sys.stdout.write(recipes.slurm(spec, args.timeout, args.gpus))
        else:
            import yaml
            sys.stdout.write(yaml.safe_dump(recipes.mpijob(spec, args.image, args.timeout, args.gpus), sort_keys=False))
        return 0
    if args.dry_run:
        for argv, command_env in launch.commands(spec):
            print(launch.format_command(argv, command_env, os.environ))
        return 0
    return launch.run(spec, timeout=args.timeout)    # a failed rank's own line says why, its code is the job's


def _ranks(args) -> int:
    """-np, or torchrun's --nproc-per-node on one host (--nnodes 1 or unset)."""
    from toolkit.errors import ToolkitError
    if args.nnodes not in (None, "1"):
        raise ToolkitError(f"--nnodes {args.nnodes}: toolkit launch names the hosts instead: -H host1:N,host2:N "
                           "(N ranks on each); elastic MIN:MAX is --min-np MIN --max-np MAX")
    if args.nproc_per_node is not None and args.np is not None and args.nproc_per_node != args.np:
        raise ToolkitError(f"-np {args.np} and --nproc-per-node {args.nproc_per_node} disagree on one host: give one")
    if args.np is None and args.nproc_per_node is None:
        raise ToolkitError("toolkit launch needs the number of ranks: -np N (or torchrun's --nproc-per-node N)")
    if args.nproc_per_node is not None and (args.hosts or args.hostfile):
        raise ToolkitError("--nproc-per-node is ranks on this one host; with -H or --hostfile give -np (the total)")
    return args.np if args.np is not None else args.nproc_per_node


def _exported(item: str) -> str:
    """mpirun's `-x NAME=VALUE`, or `-x NAME`: NAME with its value in this environment."""
    from toolkit.errors import ToolkitError
    if "=" in item:
        return item
    if item not in os.environ:
        raise ToolkitError(f"-x {item}: {item} is not set here; give its value, -x {item}=VALUE")
    return f"{item}={os.environ[item]}"


def _framework(args, command, found) -> str | None:
    """The framework the ranks will run, by their own precedence: the command's --framework, TOOLKIT_FRAMEWORK
    (this --framework becomes it unless it is set), the `framework` of the command's --config file; None if
    none says. Under --backend native a --framework that the ranks would not run is an error."""
    from toolkit.errors import ToolkitError

    flag = _flag(command, "--framework")
    ranks = flag or os.environ.get("TOOLKIT_FRAMEWORK") or args.framework or found.get("framework")
    if args.backend == "native" and args.framework is not None and ranks != args.framework:
        said = f"the command's --framework {flag}" if flag else f"TOOLKIT_FRAMEWORK={ranks} in the environment"
        raise ToolkitError(f"--framework {args.framework}, but {said} wins on the ranks; make them the same")
    return str(ranks) if ranks else None


def _flag(command, name: str) -> str | None:
    """The value of `name` on the command line (`name VALUE` or `name=VALUE`; the last one, as argparse)."""
    value = None
    for i, arg in enumerate(command):
        if arg == name and i + 1 < len(command):
            value = command[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def _elastic_settings(args, found) -> dict:
    """min_np/max_np/discovery from the flags, else TOOLKIT_ELASTIC_*, else the `elastic:` block of the
    YAML file the command passes with --config (`found`: one config for the launcher and the ranks)."""
    flags = {"min_np": args.min_np, "max_np": args.max_np, "discovery": args.host_discovery_script}
    out = {}
    for key, flag_value in flags.items():
        value = flag_value if flag_value is not None else \
            os.environ.get(f"TOOLKIT_ELASTIC_{key.upper()}", found.get(f"elastic_{key}"))
        out[key] = int(value) if value is not None and key != "discovery" else value
    return out
