"""Writing the console's own files on this machine (config.toml, known_hosts) without ever
leaving one half-written and without breaking the user's symlinks.

Dotfile managers keep `~/.ssh/known_hosts` or the config as a symlink into a repository. A
rename over the link itself would replace it with a regular file (and the repository would
silently stop receiving changes), so the link is resolved first and the new content is written
to a temp file in the *target's* directory, then renamed over the target: atomic, the link
untouched, the target's permission bits kept.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def real_target(path: Path) -> Path:
    """Where writing `path` must go: symlinks resolved (a dangling one names the file to create)."""
    return Path(os.path.realpath(os.path.expanduser(path)))


def write_atomic(path: Path, data: bytes, *, new_mode: int = 0o600,
                 parent_mode: int = 0o700) -> Path:
    """Replace the file `path` names (through symlinks) with data, atomically.

    An existing target keeps its permission bits; a new one gets new_mode (and missing parent
    folders parent_mode). Returns the path actually written."""
    target = real_target(path)
    target.parent.mkdir(parents=True, exist_ok=True, mode=parent_mode)
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = new_mode
    tmp = target.with_name(f".{target.name}.tmp-{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)  # exact, whatever the umask
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return target
