"""User-facing errors: the CLI prints a :class:`PrivfedError` on one line and exits non-zero, without a traceback."""


class PrivfedError(Exception):
    """A problem the user can fix (bad option, missing file, unknown name)."""
