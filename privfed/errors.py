"""User-facing errors.

Anything raised as :class:`PrivfedError` is a problem with the user's input or
environment, not a bug: the CLI prints its message on one line and exits with a
non-zero status instead of showing a traceback.
"""


class PrivfedError(Exception):
    """A problem the user can fix (bad option, missing file, unknown name)."""
