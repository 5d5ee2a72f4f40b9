"""Break each claim on purpose and check that its test fails (mutation testing, by hand-picked mutants).

    .venv/bin/python tests/break_claims.py              # every mutant (about 30 minutes on 2 cores)
    .venv/bin/python tests/break_claims.py resume ssp   # those whose id starts with one of the words
    .venv/bin/python tests/break_claims.py --list

Each mutant is a small edit to the toolkit's code that makes one README claim false (resume
silently retraining from step 0, the SSP server loosening its bound, ...). The script applies it,
runs the tests that guard the claim, restores the file (always, also on Ctrl-C) and prints whether
the tests failed, as they must. docs/TESTING.md lists the claims, their tests and these mutants.
Not part of `make test` (each mutant reruns real multi-rank jobs); nothing here is committed broken.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    id: str
    claim: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = [
    Mutant("checkpoint-gap", "a writer killed at any moment leaves the newest checkpoint whole",
           "toolkit/checkpoint.py", 'for p in root.glob(f".{PREFIX}*.{REPLACED}-*"):', "for p in []:",
           ("tests/test_checkpoint.py::test_a_writer_killed_while_replacing_a_step_leaves_the_old_checkpoint",)),
]


def run(mutant: Mutant) -> tuple[bool, float, str]:
    """(the tests failed, seconds, last lines of pytest's output) with the mutant applied."""
    path = ROOT / mutant.file
    original = path.read_text()
    if original.count(mutant.old) != 1:
        raise SystemExit(f"{mutant.id}: the text to change occurs {original.count(mutant.old)} times in "
                         f"{mutant.file}; update the mutant")
    path.write_text(original.replace(mutant.old, mutant.new))
    try:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests],
                              cwd=ROOT, capture_output=True, text=True)
        seconds = time.monotonic() - t0
    finally:
        path.write_text(original)
    tail = [ln for ln in proc.stdout.splitlines() if ln.strip()][-1:] or [""]
    return proc.returncode not in (0, 5), seconds, tail[0]      # 5: no test collected


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ids", nargs="*", help="run only mutants whose id starts with one of these")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = p.parse_args()
    chosen = [m for m in MUTANTS if not args.ids or m.id.startswith(tuple(args.ids))]
    if args.list:
        for m in chosen:
            print(f"{m.id:28} {m.file:34} {m.claim}")
        return 0
    survived = []
    print("| mutant | claim broken | tests | caught | seconds |\n|---|---|---|---|---|")
    for m in chosen:
        caught, seconds, tail = run(m)
        if not caught:
            survived.append(m.id)
        tests = ", ".join(t.split("::")[-1] for t in m.tests)
        print(f"| {m.id} | {m.claim} | {tests} | {'yes' if caught else 'NO: ' + tail} | {seconds:.0f} |", flush=True)
    if survived:
        print(f"survived (their tests passed with the claim broken): {', '.join(survived)}", file=sys.stderr)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
