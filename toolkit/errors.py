"""The one exception users see: a one-line message that names the field or flag and the fix."""


class ToolkitError(Exception):
    """A user-facing error. The CLI prints `toolkit: error: <message>` and exits `code`, no traceback."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code

