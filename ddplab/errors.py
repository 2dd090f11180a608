"""The one exception the control-side tools raise for bad input: printed as one line, exit code 2."""


class DdplabError(Exception):
    """Bad input or state, with a message that names the thing and the fix."""
