"""One module per `toolkit` subcommand, each with `register(subparsers)` (imports stay light)."""
