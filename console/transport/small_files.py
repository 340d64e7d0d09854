"""A small file of a host read whole, within a limit: regular files only (a FIFO would block the
read, `/dev/zero` or a huge file would grow the console's memory without bound)."""

from __future__ import annotations

import stat as stat_mod

from console.errors import ConsoleError
from console.transport.base import Transport


class FileRefused(ConsoleError):
    """The file is not one to read whole: not a regular file, or larger than the limit."""


async def read_small(transport: Transport, path: str, limit: int) -> bytes | None:
    """The file's bytes (symlinks followed); None when it does not exist; FileRefused naming
    host and path when it is not a regular file or holds more than `limit` bytes."""
    st = await transport.stat(path)
    if st is None:
        return None
    if not stat_mod.S_ISREG(st.mode):
        raise FileRefused(f"{transport.name}:{path}: not a regular file")
    if st.size > limit:
        raise FileRefused(f"{transport.name}:{path}: larger than {_size(limit)}")
    data = await transport.read_range(path, 0, limit + 1)
    if len(data) > limit:  # it grew since the stat
        raise FileRefused(f"{transport.name}:{path}: larger than {_size(limit)}")
    return data


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def json_why(e: BaseException) -> str:
    """Why json.loads refused a text, in one line (RecursionError: nested past Python's depth)."""
    return "nested too deep" if isinstance(e, RecursionError) else str(e).splitlines()[0]
