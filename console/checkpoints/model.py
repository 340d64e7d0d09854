"""What the Checkpoints pane shows and may do, decided apart from how it is drawn.

`CheckpointsModel` keeps, per host, the checkpoints as last scanned (and the configured folders
the scan could not read), the host's root, and what the user last gave there (the verifier
served or converted for, the held-out data evaluated on), so the dialogs propose it again; the
inspect reports per (path, mtime), so going back to a checkpoint shows its report at once; the
conversion in progress (one at a time; no rescan or inspect meanwhile); and which checkpoint's
report or outcome is on screen. It holds no widget and does no I/O: the pane's workers call the
services (console/checkpoints/service.py) and hand the answers here.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

from console.checkpoints.results import Checkpoint, InspectReport
from console.demo.config import HELD_OUT_DATA
from console.errors import ConsoleError, describe_error, on_host
from console.settings.config import LOCAL, Config


def flag_value(command: str, flag: str) -> str | None:
    """The value of `flag` in a shell command line (`--target X` or `--target=X`)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for i, w in enumerate(words):
        if w == flag and i + 1 < len(words):
            return words[i + 1]
        if w.startswith(flag + "="):
            return w.split("=", 1)[1]
    return None


@dataclass
class HostCheckpoints:
    """One host's side of the pane: its last scan and what was last given there."""

    found: list[Checkpoint] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)  # configured folder, why
    root: str = ""
    verifier: str = ""       # the verifier last served, converted for or evaluated with
    eval_data: str = ""      # the data folder last evaluated on


class CheckpointsModel:
    """Scans, reports, the convert lock and what is on screen (module docstring)."""

    def __init__(self) -> None:
        self._hosts: dict[str, HostCheckpoints] = {}
        self._reports: dict[tuple[str, float], InspectReport] = {}
        self.scan_error: str | None = None
        self.scans = 0                    # how many scans have completed
        self.scanning = False
        self.converting: str | None = None   # the source of the conversion running
        # the checkpoint whose report is shown (None: something else is)
        self.shown_path: str | None = None
        # an outcome (serve refused or started, swap) stays on screen while the cursor rests on
        # this checkpoint: a rescan does not replace it; moving, `i` or enter go back to reports
        self.pinned: str | None = None

    def of(self, host: str) -> HostCheckpoints:
        return self._hosts.setdefault(host, HostCheckpoints())

    # -- scanning ------------------------------------------------------------------------------
    def may_poll(self) -> bool:
        """Whether a timed rescan may start now: not during a conversion (its destination is
        half-written) nor while a scan is still out."""
        return self.converting is None and not self.scanning

    def scanned(self, host: str, found: list[Checkpoint], missing: list[tuple[str, str]],
                root: str) -> None:
        mine = self.of(host)
        mine.found, mine.missing, mine.root = found, missing, root
        self.scan_error = None
        self.scans += 1

    def scan_failed(self, host: str, e: ConsoleError) -> None:
        """What was found stays listed; the status says why it may be stale."""
        self.scan_error = on_host(host, describe_error(e))

    def find(self, host: str, path: str | None) -> Checkpoint | None:
        return next((c for c in self.of(host).found if c.path == path), None)

    def empty_hint(self, host: str) -> str | None:
        """What the report area says once a scan found nothing (None: not yet scanned, or
        something was found): a configured folder that could not be read is named first."""
        mine = self.of(host)
        if mine.found or not self.scans:
            return None
        if mine.missing:
            unread = "; ".join(f"the configured folder {f}: {why} on {host}"
                               for f, why in mine.missing)
            hint = f"{unread}; fix the host's `checkpoints = [...]`"
        else:
            hint = "list folders in the host's `checkpoints = [...]`"
        return f"No checkpoints yet: {hint}, or finish a training run."

    # -- reports -------------------------------------------------------------------------------
    def report_of(self, ck: Checkpoint) -> InspectReport | None:
        """The report read of this checkpoint as it is now (a rewrite changes its mtime)."""
        key = (ck.path, ck.mtime)
        return self._reports[key] if key in self._reports else None

    def keep_report(self, ck: Checkpoint, report: InspectReport) -> None:
        self._reports[(ck.path, ck.mtime)] = report

    def to_inspect(self, ck: Checkpoint, again: bool = False) -> bool:
        """Whether the cursor resting on `ck` shows its report now (and it becomes the one
        shown): not during a conversion, nor when it is shown already or an outcome is pinned
        over it, unless asked `again` (i, enter)."""
        if self.converting is not None:
            return False
        if not again and ck.path in (self.shown_path, self.pinned):
            return False
        self.pinned, self.shown_path = None, ck.path
        return True

    def show_outcome(self, under_cursor: str | None) -> None:
        """An outcome replaces the report and stays while the cursor rests where it is."""
        self.shown_path, self.pinned = None, under_cursor or ""

    def rescanned(self, host: str, found: list[Checkpoint], path: str,
                  report: InspectReport) -> None:
        """After a conversion: the new list, with `report` kept for the result at `path`,
        which is the one shown."""
        self.of(host).found = found
        for ck in matching(found, path):
            self.keep_report(ck, report)
        self.shown_path = path

    # -- converting ----------------------------------------------------------------------------
    def refusal(self, ck: Checkpoint | None) -> str | None:
        """Why a convert or an evaluation may not start on `ck` now (None: it may)."""
        if ck is None:
            return "No checkpoint selected"
        if self.converting is not None:
            return f"Busy converting {self.converting}"
        return None

    def begin_convert(self, src: str) -> None:
        self.converting, self.shown_path = src, None

    def end_convert(self) -> None:
        self.converting = None

    # -- what the dialogs propose --------------------------------------------------------------
    def known_verifier(self, host: str, ck: Checkpoint, config: Config) -> str:
        """The verifier to propose: the checkpoint's config names it, else the one last given
        on the host (served, or recorded by a conversion), else the target the host's profiles
        train against."""
        known = self.report_of(ck)
        if known is not None and known.verifier:
            return known.verifier
        if self.of(host).verifier:
            return self.of(host).verifier
        for profile in config.profiles.values():
            if host in profile.hosts:
                target = flag_value(profile.run, "--target")
                if target:
                    return target
        return ""

    def known_data(self, host: str, config: Config) -> str:
        """The held-out data to propose: the folder last evaluated on there, else the demo
        workspace's held-out set on the local host; never the data a profile trains on, whose
        samples the drafter has seen (its figure reads high)."""
        if self.of(host).eval_data:
            return self.of(host).eval_data
        demo = config.demo
        return posixpath.join(demo, HELD_OUT_DATA) if host == LOCAL and demo else ""

    def gave_verifier(self, host: str, verifier: str | None) -> None:
        if verifier:
            self.of(host).verifier = verifier

    def evaluated(self, host: str, target: str, data: str) -> None:
        mine = self.of(host)
        mine.verifier, mine.eval_data = target, data


def matching(found: Iterable[Checkpoint], path: str) -> list[Checkpoint]:
    """The checkpoints at `path` (spelled with or without a trailing slash, `a//b`, ...)."""
    want = posixpath.normpath(path)
    return [ck for ck in found if posixpath.normpath(ck.path) == want]
