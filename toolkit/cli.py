"""`toolkit <command>`: the entry only registers the commands (one module each in commands/)."""
from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading

from toolkit.commands import bench, build_horovod, doctor, export, launch, plan, profile, setup, shards, train
from toolkit.commands import config as config_cmd
from toolkit.errors import ToolkitError
from toolkit.messages import print_error

COMMANDS = (setup, build_horovod, doctor, config_cmd, launch, train, bench, plan, shards, export, profile)


EXAMPLES = """\
examples:
  toolkit setup                                        # the environment: Open MPI, .venv, frameworks, Horovod
  toolkit doctor --framework all                       # what works here, and the fix for what does not
  toolkit train --framework torch --epochs 5           # one process (the same as python examples/train.py)
  toolkit launch -np 2 --gloo -- toolkit train --framework tensorflow
  toolkit launch -np 2 --dry-run -- python examples/train.py --config examples/cfg.yaml
  toolkit launch -np 8 -H a:4,b:4 -- python train.py      # two hosts, 4 ranks each (horovodrun)
  toolkit launch --backend native --framework torch -np 4 -- python train.py   # torchrun + DDP
  toolkit build-horovod --frameworks torch             # Horovod built for the torch installed here
  toolkit config show --config examples/cfg.yaml       # every key, resolved
  toolkit bench --np 1,2 --framework torch             # samples/s per worker and scaling efficiency
  toolkit plan --bench runs/bench --gpus 8,64,512 --inter-node 25gbit   # predicted scaling per method
  toolkit export runs/ckpt model.safetensors           # a checkpoint's model for the framework's own loader
  toolkit profile merge runs/prof                      # the ranks' traces (--profile-dir) as one timeline
  toolkit shards imagefolder:data/images data/shards --framework torch   # then --dataset shards:data/shards

`toolkit COMMAND --help` lists each command's flags; every config key is also a flag of train,
bench and config show (accumulation_steps -> --accumulation-steps) and a TOOLKIT_<KEY> variable."""


class CommandParser(argparse.ArgumentParser):
    """The parser of `toolkit` and of each command (and of `config show`: subparsers inherit the class).

    Flags are never abbreviated: `toolkit launch --gpu` is an error, not `--gpus` (and a new flag cannot
    silently change what an old abbreviation meant). An unknown flag is the command's own error: its usage
    line and one `toolkit COMMAND: error:` line, exit 2, where argparse would hand it up to the top level and
    print `usage: toolkit [-h] COMMAND ...`."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self.suggestion(extras)}")
        return namespace, extras

    def suggestion(self, extras: list[str]) -> str:
        """` (did you mean --epochs?)` for the first unknown flag that begins exactly one of this parser's
        flags (flags are never abbreviated), or is close to one (difflib's ratio 0.8: `--epoch`, `--glo`)."""
        import difflib
        flags = [s for action in self._actions for s in action.option_strings if s.startswith("--")]
        for extra in extras:
            if extra.startswith("--"):
                name = extra.split("=", 1)[0]
                longer = [f for f in flags if f.startswith(name)]
                close = longer if len(longer) == 1 else difflib.get_close_matches(name, flags, n=1, cutoff=0.8)
                if close:
                    return f" (did you mean {close[0]}?)"
        return ""


def version() -> str:
    """`horovod-toolkit 0.2.0 (builds Horovod 0.28.1; Python 3.11.7 at /usr/bin/python3.11)`: the
    distribution's name and version, the Horovod it builds, the Python; no framework imported."""
    from toolkit import __version__
    from toolkit.install import pins, support

    return (f"{support.DISTRIBUTION} {__version__} (builds Horovod {pins.HOROVOD}; "
            f"Python {sys.version.split()[0]} at {sys.executable})")


def parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="toolkit", description="Horovod that works today: "
                      "data-parallel training for PyTorch, TensorFlow/Keras 3 and MXNet.",
                      epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=version())
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(sub)
    for name, command_parser in sub.choices.items():     # each command's --help ends with its examples
        lines = [ln for ln in EXAMPLES.splitlines() if ln.startswith(f"  toolkit {name} ")]
        if lines and not command_parser.epilog:
            command_parser.epilog = "examples:\n" + "\n".join(lines)
            command_parser.formatter_class = argparse.RawDescriptionHelpFormatter
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ToolkitError as e:
        print_error(e)
        return e.code


def run(argv: list[str] | None = None):
    """The `toolkit` command (and `python -m toolkit`, examples/train.py): main(), then the exit.

    The process ends once its atexit handlers ran (Horovod's shutdown and timeline, multiprocessing's
    loader workers, logging's flush) and MPI is finalized, without Python's teardown of every module:
    a rank that imported a framework spends up to a second there (2 ranks, 1 epoch of digits, medians
    of 5: 7.0 -> 6.3 s torch, 8.4 -> 7.3 s TensorFlow; tests/README.md). Files the toolkit writes are
    closed before main() returns. With another Python thread still running, the normal exit (which
    waits for it); in a TensorFlow multi-worker job (TF_CONFIG) too: a worker's last collective can
    be done on its side while a peer still pulls its part (RecvBuf), and TensorFlow's coordination
    service holds every worker at a shutdown barrier only when its context is torn down (seen in
    the README's 2-worker test: `Socket closed` at rank 0's last allgather, 2 of 3 runs of the file)."""
    code = main(argv)
    if threading.active_count() > 1 or os.environ.get("TF_CONFIG"):
        sys.exit(code)
    atexit._run_exitfuncs()
    mpi = sys.modules.get("mpi4py.MPI")      # mpi4py finalizes MPI in a C-level exit hook, not atexit
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):       # a closed pipe or stream: nothing left to say
            pass
    os._exit(code)
