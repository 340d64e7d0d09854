"""The one error type engine commands raise for bad input: its message is the one line the user
sees."""


class EngineError(Exception):
    """A user-facing failure: message names the file, key, field or line that is wrong."""


class UsageError(EngineError):
    """Wrong arguments (exit status 2)."""
