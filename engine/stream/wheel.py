"""Whether this host can use the stream extra (Mooncake's store), and what to install if not.

Mooncake ships its one Python package, `mooncake`, in wheels that exclude each other: the CUDA
wheels (`mooncake-transfer-engine`, built for CUDA 12, and `mooncake-transfer-engine-cuda13`),
for a GPU host, whose transfer engine can register GPU memory; and the non-CUDA wheel, the one
that installs where there is no CUDA (CPU hosts, CI). Our streams move host memory over TCP,
which any of them does. Every one links, even for TCP, against the RDMA, NUMA and netlink
libraries of `APT_LIBS`; each is loaded here by its soname, so a missing one is named by the
Debian/Ubuntu package that provides it. Standard library only: doctor runs without torch.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
from collections.abc import Callable
from dataclasses import dataclass

VERSION = "0.3.13.post1"  # every wheel at the same release: pyproject's stream extras pin it
NON_CUDA = "mooncake-transfer-engine-non-cuda"
CUDA12 = "mooncake-transfer-engine"
CUDA13 = "mooncake-transfer-engine-cuda13"
WHEELS = (CUDA12, CUDA13, NON_CUDA)
EXTRAS = {NON_CUDA: "stream", CUDA12: "stream-cuda", CUDA13: "stream-cuda13"}
APT_LIBS = (("libibverbs1", "libibverbs.so.1"), ("librdmacm1", "librdmacm.so.1"),
            ("libnuma1", "libnuma.so.1"), ("libnl-3-200", "libnl-3.so.200"),
            ("libnl-route-3-200", "libnl-route-3.so.200"))


def wheel_for(cuda: str | None) -> str:
    """The wheel for a host whose torch runs CUDA `cuda` (torch.version.cuda, None without a
    usable GPU)."""
    if not cuda:
        return NON_CUDA
    major = cuda.split(".")[0]
    return CUDA13 if major.isdigit() and int(major) >= 13 else CUDA12


def installed_wheels() -> tuple[tuple[str, str], ...]:
    """(distribution, version) of each Mooncake wheel installed in this Python."""
    out = []
    for dist in WHEELS:
        try:
            out.append((dist, importlib.metadata.version(dist)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return tuple(out)


def missing_apt(load: Callable[[str], object] = ctypes.CDLL) -> tuple[str, ...]:
    """The packages of APT_LIBS whose library does not load here. A library that fails because
    another of them is missing (libibverbs needs libnl-route-3) blames that one: the loader's
    message starts with the file it could not load."""
    by_soname = dict((so, package) for package, so in APT_LIBS)
    gone = set()
    for package, soname in APT_LIBS:
        try:
            load(soname)
        except OSError as e:
            failed = os.path.basename(str(e).split(":")[0].strip())
            gone.add(by_soname.get(failed, package))
    return tuple(p for p, _so in APT_LIBS if p in gone)


def store_error() -> str | None:
    """Why `mooncake.store` does not import here (None: it does)."""
    try:
        import mooncake.store  # noqa: F401
    except (ImportError, OSError) as e:
        return f"{type(e).__name__}: {e}".splitlines()[0][:240]
    return None


@dataclass(frozen=True)
class StreamCheck:
    installed: tuple[tuple[str, str], ...]
    cuda: str | None
    missing_apt: tuple[str, ...]
    error: str | None  # why mooncake.store does not import; None when it does

    @property
    def want(self) -> str:
        return wheel_for(self.cuda)

    @property
    def usable(self) -> bool:
        return bool(self.installed) and self.error is None

    def advice(self, python: str) -> list[str]:
        """What to do here, one line each (empty when the right wheel loads)."""
        out = []
        pip = f"{python} -m pip install {self.want}=={VERSION}"
        others = [d for d, _v in self.installed if d != self.want]
        if not self.installed:
            out.append(f"streaming (`train --from-stream`) needs Mooncake: `{pip}`")
        elif others:
            host = f"a CUDA {self.cuda} host" if self.cuda else "a host without CUDA"
            out.append(f"{host} wants {self.want}, not {', '.join(others)} (they share the "
                       f"`mooncake` package): `{python} -m pip uninstall -y {' '.join(others)}`"
                       f" then `{pip}`")
        if self.missing_apt:
            out.append("Mooncake loads these libraries even over TCP: `apt-get install "
                       f"{' '.join(self.missing_apt)}`")
        elif self.installed and self.error is not None:
            out.append(f"Mooncake is installed but its store does not load ({self.error})")
        return out

    def summary(self) -> str:
        """One line: the wheel, whether it loads, the one this host wants."""
        wheels = ", ".join(f"{d} {v}" for d, v in self.installed) or "not installed"
        state = "usable" if self.usable else "not usable"
        if self.missing_apt:
            state += f", missing {' '.join(self.missing_apt)}"
        return f"{wheels} ({state}; this host wants {self.want})"

    def as_dict(self, python: str) -> dict[str, object]:
        """The doctor report's `stream` entry (`summary` and `advice`: the lines both doctor
        views print)."""
        return {"summary": self.summary(),
                "installed": [{"dist": d, "version": v} for d, v in self.installed],
                "cuda": self.cuda, "want": self.want, "want_version": VERSION,
                "extra": EXTRAS[self.want], "missing_apt": list(self.missing_apt),
                "error": self.error, "usable": self.usable, "advice": self.advice(python)}


def check(cuda: str | None) -> StreamCheck:
    """This host, as it is."""
    installed = installed_wheels()
    return StreamCheck(installed, cuda, missing_apt(),
                       store_error() if installed else "no Mooncake wheel installed")
