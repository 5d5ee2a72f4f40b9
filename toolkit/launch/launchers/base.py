"""The interface of a launcher: one way of starting the ranks, one module in this folder each, one row in
the table (`LAUNCHERS` in __init__.py). The LaunchSpec (toolkit/launch/spec.py) checks the rules common to
every launcher, then asks its launcher's `check`; `toolkit launch` runs `run`, `--dry-run` prints `commands`.

A launcher reads the spec's fields and nothing else of it, so this folder imports no spec: `spec` below is a
LaunchSpec, already checked when `commands` or `run` get it.
"""
from __future__ import annotations

from typing import Mapping, Optional

from toolkit.errors import ToolkitError

Command = tuple[list[str], dict[str, str]]      # one process: argv and its environment


class Launcher:
    name = ""               # what --launcher takes
    engine = False          # a cluster engine that places the workers itself (--cpus/--gpus-per-worker)
    elastic = False         # runs elastic jobs (--min-np/--max-np)
    elastic_flags = "--min-np or --host-discovery-script"   # what makes its job elastic (said of a lone --max-np)
    flags: dict[str, str] = {}          # spec field -> the flag that is this launcher's alone (Ray's --address)
    title = ""              # its name in a sentence: "--address is Ray's"
    backends: tuple[str, ...] = ("horovod",)     # what the ranks it starts run: Horovod, or the framework's own engine ("native")

    def output_flags(self, verbose: bool, output: str | None) -> list[str]:
        """This launcher's own flags for horovodrun's `--verbose` (more of what the launcher does) and
        `--output-filename DIR` (each rank's output in its own files under DIR); a launcher without them
        refuses in one line."""
        if verbose or output:
            flag = "--verbose" if verbose else "--output-filename"
            raise ToolkitError(f"{flag}: {self.title or self.name} has no such option here; it is horovodrun's and "
                               "mpirun's (--output-filename also torchrun's, as --log-dir)")
        return []

    def check(self, spec) -> None:
        """Refuse, in one line, a spec this launcher cannot run (the spec's common rules have passed)."""

    def commands(self, spec, environ: Mapping[str, str] | None = None) -> list[Command]:
        """Every process `run` starts, (argv, env) each, for `--dry-run` to print."""
        raise NotImplementedError

    def run(self, spec, timeout: Optional[float] = None, environ: Mapping[str, str] | None = None) -> int:
        """Start the ranks; the job's exit code. A job over `timeout` seconds is stopped (124)."""
        raise NotImplementedError
