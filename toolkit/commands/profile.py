"""`toolkit profile merge DIR`: the per-rank Chrome traces a run wrote with `profile_dir` (torch, MXNet) joined
into one timeline, one process row per rank (toolkit/run/profile.py)."""
from pathlib import Path

EXAMPLES = """\
examples:
  toolkit train --profile-dir runs/prof --profile-steps 5:8    # every rank writes runs/prof/trace-rank{R}.json
  toolkit profile merge runs/prof                              # -> runs/prof/trace-merged.json (Perfetto, chrome://tracing)
  toolkit profile merge runs/prof --out all.json
"""


def register(sub) -> None:
    import argparse
    p = sub.add_parser("profile", help="per-rank profiles: `profile merge DIR` joins the ranks' traces into one",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="verb", metavar="merge", required=True)
    m = verbs.add_parser("merge", help="every trace-rank*.json in DIR as one Chrome/Perfetto trace",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("folder", metavar="DIR", help="the run's profile_dir")
    m.add_argument("--out", default=None, metavar="FILE", help="where to write it (default DIR/trace-merged.json)")
    m.set_defaults(func=run)


def run(args) -> int:
    from toolkit.run.profile import merge, traces
    out = merge(Path(args.folder), args.out)
    print(f"profile: {len(traces(Path(args.folder)))} ranks' traces merged into {out}")
    return 0
