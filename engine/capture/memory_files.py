"""The captured states' way from TP rank 0's vLLM worker to the capture's driver: anonymous
memory files (memfd) of the worker's, mapped by the driver through /proc/PID/fd/FD, and handed
back to be written again.

Rank 0 stacks a step's states straight into a memory file and only its name crosses to the
driver, [pid, fd, nbytes] (engine/capture/step_channel.py); the driver maps it and views the
same pages, so the states are copied once and never through vLLM's sockets.

A fresh file's pages are allocated and zeroed by the kernel at their first write, one fault per
4 KiB page: measured here, 25 ms of a 16k-token step of the demo target (17 MB of states)
against 3 ms for the same stack into pages already there, and the write happens inside the
forward. A large target's step is 0.9 GB (Kimi-K2.5, 16k tokens). So the files are reused:
`FilePool` (the worker's) hands a file out with a step and keeps its own map of it; the driver
(`Released`) notes a file once the last tensor viewing its map is gone, and gives it back with
the next call it receives; a file given back is written again through the worker's map,
without a fault. At most `keep` files wait in the pool, the others are closed. Nothing outlives
the two processes: the pages go with the last descriptor and the last map.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref

#: a file grows in steps of this much, so steps of slightly more tokens do not grow it each time
_GROW = 8 << 20


def memory_file(nbytes: int) -> tuple[int, mmap.mmap]:
    """An anonymous shared memory file of `nbytes` (at least 1) and this process's map of it."""
    fd = os.memfd_create("eagle3-capture", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(nbytes, 1))
        return fd, mmap.mmap(fd, max(nbytes, 1))
    except BaseException:
        os.close(fd)
        raise


class FilePool:
    """The worker's memory files: free ones to write a step into, and those handed out."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self.free: dict[int, mmap.mmap] = {}
        self.out: dict[int, mmap.mmap] = {}
        self.created = 0  # files made in all (the capture's summary reports it)

    def take(self, nbytes: int) -> tuple[int, mmap.mmap]:
        """A file of at least `nbytes` and the worker's map of it, now handed out: the
        smallest free one that fits, else the largest grown, else a new one."""
        fits = [fd for fd, mm in self.free.items() if len(mm) >= nbytes]
        if fits:
            fd = min(fits, key=lambda f: len(self.free[f]))
            mm = self.free.pop(fd)
        else:
            size = -(-max(nbytes, 1) // _GROW) * _GROW
            got = self._grown(size) if self.free else None
            if got is None:
                got = memory_file(size)
                self.created += 1
            fd, mm = got
        self.out[fd] = mm
        return fd, mm

    def _grown(self, size: int) -> tuple[int, mmap.mmap] | None:
        fd = max(self.free, key=lambda f: len(self.free[f]))
        try:
            self.free[fd].close()
        except BufferError:  # a tensor still views it (none should): left as it is
            return None
        del self.free[fd]
        try:
            os.ftruncate(fd, size)
            return fd, mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise

    def give_back(self, fds: list[int]) -> None:
        """Files the driver no longer maps: free again (beyond `keep`, closed)."""
        for fd in fds:
            mm = self.out.pop(int(fd), None)
            if mm is None:
                continue  # not one of ours handed out: nothing to do
            if len(self.free) < self.keep:
                self.free[int(fd)] = mm
            else:
                _close(int(fd), mm)

    def close(self) -> None:
        for files in (self.free, self.out):
            for fd, mm in files.items():
                _close(fd, mm)
            files.clear()


def _close(fd: int, mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        pass  # a tensor still views it: the map goes with that tensor
    os.close(fd)


def map_worker_file(ref: list[int] | tuple[int, ...],
                    released: Released | None = None) -> mmap.mmap:
    """A worker's memory file [pid, fd, nbytes] mapped read-only here (the driver's side);
    with `released`, the file is noted there once this map is gone."""
    pid, fd, n = (int(x) for x in ref)
    with open(f"/proc/{pid}/fd/{fd}", "rb") as f:
        mm = mmap.mmap(f.fileno(), max(n, 1), access=mmap.ACCESS_READ)
    if released is not None:
        weakref.finalize(mm, released.add, fd)
    return mm


class Released:
    """The driver's list of worker files whose maps are gone (noted from whichever thread
    drops the last tensor), given back with the next call received."""

    def __init__(self) -> None:
        self._fds: list[int] = []
        self._lock = threading.Lock()

    def add(self, fd: int) -> None:
        with self._lock:
            self._fds.append(fd)

    def drain(self) -> list[int]:
        with self._lock:
            out, self._fds = self._fds, []
        return out
