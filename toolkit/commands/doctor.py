"""`toolkit doctor`: what works in this environment, and the fix for what does not."""


def register(sub) -> None:
    p = sub.add_parser("doctor", help="check Python, frameworks, Horovod extensions, MPI and GPUs")
    p.add_argument("--framework", default=None,
                   help="exit non-zero unless this framework can train; `all`: every one (default: from config/TOOLKIT_FRAMEWORK)")
    p.set_defaults(func=run)


def run(args) -> int:
    from toolkit import config
    from toolkit.install import doctor

    framework = args.framework or config.resolve({}).framework
    return doctor.report(framework)
