"""Errors of the operations layer: one sentence that says what is wrong and what exists instead.

`code` is the exit status the CLI ends with (scripts rely on it): 0 done, 1 failed or not found,
2 bad usage, 3 etcd or the diagnosis service unreachable, 4 the controller did not answer a request
in time. The console maps the classes to HTTP statuses instead (NotFound is a 404).
"""

from __future__ import annotations

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_TIMEOUT = 4


class OpsError(Exception):
    """A failure to report in one line; `code` is the CLI's exit status for it."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


class NotFound(OpsError):
    """The job, node, rank or incident named does not exist; the message lists what does.

    The console turns it into a 404 page, the CLI into exit 1 like any other failure."""
