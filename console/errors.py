"""The console's own small set of errors. Transports translate library errors into these at the
boundary, with the original exception chained (`raise X(...) from e`)."""

from __future__ import annotations


class ConsoleError(Exception):
    """Base: the message is the one line shown to the user."""


class ConfigError(ConsoleError):
    """The config file is wrong: the message names the file, key or line, and what was expected."""


class TransportError(ConsoleError):
    """Talking to a host failed."""

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host


class Unreachable(TransportError):
    """The host could not be reached (DNS, refused, timeout, connection lost)."""


class NoSFTP(TransportError):
    """The host's sshd refuses the SFTP subsystem, which every file the console reads or writes
    on a host goes through (commands still run)."""

    def __init__(self, host: str, op: str) -> None:
        super().__init__(host, f"its sshd offers no SFTP subsystem, which the console needs for "
                               f"files ({op}); enable it in the host's sshd_config "
                               "(`Subsystem sftp internal-sftp`) and reload sshd")


class AuthFailed(TransportError):
    """The host refused our credentials."""


class HostKeyUnknown(TransportError):
    """The host's key is not in known_hosts: never trusted silently."""

    def __init__(self, host: str, fingerprint: str, hint: str) -> None:
        super().__init__(host, f"unknown host key {fingerprint}; {hint}")
        self.fingerprint = fingerprint


class HostKeyChanged(TransportError):
    """The host presented a key different from the one in known_hosts: always refused."""

    def __init__(self, host: str, fingerprint: str, known_hosts: str) -> None:
        super().__init__(host, f"HOST KEY CHANGED (now {fingerprint}); refusing to connect. "
                               f"If this is expected, remove the old entry from {known_hosts}")
        self.fingerprint = fingerprint


class HostKeyTypeMismatch(TransportError):
    """known_hosts records keys for the host, but only of types the server no longer offers:
    no recorded key can verify it, so the connection is refused (never trusted silently)."""

    def __init__(self, host: str, recorded: list[str], fingerprint: str, known_hosts: str,
                 trust: str) -> None:
        """trust: how to record the new key, e.g. "run `eagle3-console trust h1`"."""
        super().__init__(host, f"host key type mismatch: {known_hosts} records only "
                               f"{', '.join(recorded)} for it, and the server offers none of "
                               f"those (it presents {fingerprint}); refusing to connect. If the "
                               f"server's keys were replaced, check that fingerprint, remove the "
                               f"old entry from {known_hosts} and {trust}")
        self.fingerprint = fingerprint
        self.recorded = recorded


def shown_command(words: list[str], room: int = 120) -> str:
    """A command in one line of an error: whole words until `room` columns are passed (the
    word that passes it is kept whole: a path is never cut in the middle), then `… (N more)`."""
    out: list[str] = []
    for i, w in enumerate(words):
        if len(" ".join(out)) >= room:
            return " ".join(out) + f" … ({len(words) - i} more)"
        out.append(w)
    return " ".join(out)


class CommandFailed(TransportError):
    """A remote/local command exited non-zero when success was required."""

    def __init__(self, host: str, argv: list[str] | str, returncode: int | None,
                 stderr: str) -> None:
        cmd = shown_command(argv.split() if isinstance(argv, str) else argv)
        last = (stderr.strip().splitlines() or [""])[-1]
        how = "failed" if returncode is None else f"exited {returncode}"
        super().__init__(host, f"`{cmd}` {how}" + (f": {last}" if last else ""))
        self.returncode = returncode
        self.stderr = stderr


def describe_error(e: BaseException) -> str:
    """One line for a failed call, as the panes and subcommands show it: our own errors carry
    their message, anything else is named by its type."""
    if isinstance(e, ConsoleError):
        return str(e)
    return f"{type(e).__name__}: {e}"


def on_host(host: str, what: str) -> str:
    """`host: what`, naming the host once (a TransportError's message already starts with it)."""
    return what if what.startswith(f"{host}: ") else f"{host}: {what}"
