"""`toolkit launch`: start N ranks with horovodrun, plain mpirun, or as TensorFlow workers, with timeouts."""
import argparse
import os
import sys


def register(sub) -> None:
    p = sub.add_parser("launch", help="start a command on N ranks via horovodrun or mpirun",
                       usage="toolkit launch -np N [-H host:slots,...|--hostfile FILE] [--gloo|--mpi] [--framework F] "
                             "[--backend horovod|native] [--dry-run|--emit slurm|mpijob] -- COMMAND ...")
    p.add_argument("-np", "--num-proc", dest="np", type=int, required=True, help="number of ranks")
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", default=None, help="host:slots,... (default localhost:N)")
    hosts.add_argument("--hostfile", default=None, help="one `host slots=N` (or host:N) a line")
    p.add_argument("--launcher", default=None, choices=("horovodrun", "mpirun", "tf_config"),
                   help="default horovodrun; tf_config with --backend native")
    p.add_argument("--framework", default=None, help="sets TOOLKIT_FRAMEWORK for the ranks (unless set)")
    p.add_argument("--backend", default=None, choices=("horovod", "native"),
                   help="native: TensorFlow workers with TF_CONFIG (MultiWorkerMirroredStrategy), no Horovod")
    ctl = p.add_mutually_exclusive_group()
    ctl.add_argument("--gloo", dest="controller", action="store_const", const="gloo", help="Gloo controller")
    ctl.add_argument("--mpi", dest="controller", action="store_const", const="mpi", help="MPI controller")
    p.add_argument("--network-interface", default=None, help="NIC for rank traffic, e.g. lo or eth0")
    p.add_argument("--ssh-port", type=int, default=None, help="ssh port of the other hosts")
    p.add_argument("--ssh-identity-file", default=None, help="private key for ssh to the other hosts")
    tune = p.add_argument_group("Horovod tuning (as HOROVOD_* variables for every rank)")
    tune.add_argument("--fusion-threshold-mb", type=float, default=None, help="tensor fusion buffer, MiB (0: off)")
    tune.add_argument("--cycle-time-ms", type=float, default=None, help="background cycle time, ms")
    tune.add_argument("--autotune", action="store_true", help="Horovod's autotuner (HOROVOD_AUTOTUNE=1)")
    tune.add_argument("--timeline-file", "--timeline-filename", dest="timeline_file", default=None,
                      help="Horovod timeline file (rank 0 writes it); the same as the config key timeline_file")
    el = p.add_argument_group("elastic (Horovod elastic over Gloo; also the `elastic:` block of the command's --config)")
    el.add_argument("--min-np", type=int, default=None, help="fewest workers the job goes on with")
    el.add_argument("--max-np", type=int, default=None, help="most workers")
    el.add_argument("--host-discovery-script", default=None, help="executable printing `host:slots` lines")
    p.add_argument("--start-timeout", type=int, default=60, help="seconds for all ranks to start (default 60)")
    p.add_argument("--timeout", type=float, default=None, help="stop the whole job after this many seconds")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra variable for every rank")
    p.add_argument("--dry-run", action="store_true", help="print the command and environment, run nothing")
    p.add_argument("--emit", default=None, choices=("slurm", "mpijob"),
                   help="print the same launch as an sbatch script or a Kubeflow MPIJob manifest, run nothing")
    p.add_argument("--image", default=None, help="--emit mpijob: the container image of every pod")
    p.add_argument("--gpus", action="store_true", help="--emit: ask for one GPU per slot")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs, after --")
    p.set_defaults(func=run)


def run(args) -> int:
    from toolkit import registry
    from toolkit.errors import ToolkitError
    from toolkit.launch import launcher as launch
    from toolkit.launch.hosts import read_hostfile

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    launcher = args.launcher or ("tf_config" if args.backend == "native" else "horovodrun")
    if args.backend == "native" and launcher != "tf_config":
        raise ToolkitError(f"--backend native starts TensorFlow workers itself; drop --launcher {launcher}")
    env = list(args.env)
    for key, value in (("framework", args.framework), ("backend", args.backend)):
        if value is not None and f"TOOLKIT_{key.upper()}" not in os.environ:
            env.append(f"TOOLKIT_{key.upper()}={value}")
    if args.framework is not None and args.backend is not None and \
            args.backend not in registry.spec(args.framework).backends:
        raise ToolkitError(f"--backend {args.backend} is not available for --framework {args.framework}; "
                           f"use one of: {', '.join(registry.spec(args.framework).backends)}")
    env += launch.tuning_env(args.fusion_threshold_mb, args.cycle_time_ms, args.autotune, args.timeline_file)
    hosts = read_hostfile(args.hostfile) if args.hostfile else args.hosts
    elastic = _elastic_settings(args, command)
    for key, value in elastic.items():     # the ranks learn they run elastically, from flags too
        if value is not None and f"TOOLKIT_ELASTIC_{key.upper()}" not in os.environ:
            env.append(f"TOOLKIT_ELASTIC_{key.upper()}={value}")
    spec = launch.LaunchSpec(min_np=elastic["min_np"], max_np=elastic["max_np"], discovery=elastic["discovery"],
                             command=tuple(command), np=args.np, hosts=hosts, launcher=launcher,
                             controller=args.controller, start_timeout=args.start_timeout,
                             network_interface=args.network_interface, env=tuple(env),
                             ssh_port=args.ssh_port, ssh_identity_file=args.ssh_identity_file)
    if args.emit:
        from toolkit.launch import recipes
        if args.emit == "slurm":
            sys.stdout.write(recipes.slurm(spec, args.timeout, args.gpus))
        else:
            import yaml
            sys.stdout.write(yaml.safe_dump(recipes.mpijob(spec, args.image, args.timeout, args.gpus), sort_keys=False))
        return 0
    if args.dry_run:
        plans = launch.plan_workers(spec) if launcher == "tf_config" else [launch.command_line(spec)]
        for argv, env in plans:
            print(launch.format_command(argv, env, os.environ))
        return 0
    return launch.run(spec, timeout=args.timeout)    # a failed rank's own line says why, its code is the job's


def _elastic_settings(args, command) -> dict:
    """min_np/max_np/discovery from the flags, else TOOLKIT_ELASTIC_*, else the `elastic:` block of the
    YAML file the command passes with --config (one config for the launcher and the ranks)."""
    from toolkit import config

    found = config.command_keys(command)
    flags = {"min_np": args.min_np, "max_np": args.max_np, "discovery": args.host_discovery_script}
    out = {}
    for key, flag_value in flags.items():
        value = flag_value if flag_value is not None else \
            os.environ.get(f"TOOLKIT_ELASTIC_{key.upper()}", found.get(f"elastic_{key}"))
        out[key] = int(value) if value is not None and key != "discovery" else value
    return out
