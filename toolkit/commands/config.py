"""`toolkit config show`: the resolved config (defaults < YAML < TOOLKIT_* < flags) as YAML.
`toolkit config docs`: docs/CONFIG.md, generated from the config's fields."""
import sys


def register(sub) -> None:
    from toolkit import config

    p = sub.add_parser("config", help="show the resolved configuration")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    show = verbs.add_parser("show", help="print the resolved config as YAML",
                            usage=f"toolkit config show {config.USAGE}")
    config.add_arguments(show)
    show.set_defaults(func=run)
    docs = verbs.add_parser("docs", help="print docs/CONFIG.md (every key, generated from the fields)")
    docs.set_defaults(func=run_docs)


def run(args) -> int:
    from toolkit import config

    sys.stdout.write(config.resolve(args).to_yaml())
    return 0


def run_docs(args) -> int:
    from toolkit.config import docs

    sys.stdout.write(docs.render())
    return 0
