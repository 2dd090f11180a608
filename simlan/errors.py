"""The one exception simlan raises for problems a user can fix: the CLI prints it as one line."""


class SimlanError(Exception):
    """A problem with a clear message (what, where, how to fix) and the exit code the CLI returns.

    Exit codes: 2 for bad input or a missing requirement (root, a tool, an existing cluster),
    1 for a failure while doing the work (a host that did not come up, a command that failed).
    """

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code
