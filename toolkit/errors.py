"""The one exception users see: a one-line message that names the field or flag and the fix."""


class ToolkitError(Exception):
    """A user-facing error. The CLI prints `toolkit: error: <message>` and exits `code`, no traceback."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def print_error(error: Exception) -> None:
    """The one `toolkit: error: <message>` line, in one write (launchers tag output by the chunk)."""
    import sys
    sys.stderr.write(f"toolkit: {getattr(error, 'label', 'error')}: {error}\n")
    sys.stderr.flush()
