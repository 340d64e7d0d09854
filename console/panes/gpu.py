"""The GPU pane: the selected host's GPUs (one row each, a detail view, history), its GPU
processes and its CPU/memory/disk/network, from the monitor service.

The pane never does I/O: it asks the hub to watch the host and redraws from the host's
HostMonitor on a one-second timer (only when the data changed or the age text moved), so a burst
of samples costs one redraw and a dead host cannot block the screen."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical

from console.hosts.host import HostState, HostView
from console.monitor.service import HostMonitor, MonitorState
from console.panes.timers import ShownTimers
from console.ui.keymap import bindings
from console.ui.services import services
from console.widgets.gpu_detail import GpuDetail
from console.widgets.gpu_table import GpuRow, GpuTable
from console.widgets.host_list import TRUST_HINT, state_text
from console.widgets.host_strip import HostStrip
from console.widgets.meters import fmt_age
from console.widgets.process_table import ProcessTable
from console.widgets.status_line import StatusLine

WINDOW_S = 300.0  # what the history lines span


def gpu_rows(mon: HostMonitor, now: float) -> list[GpuRow]:
    """The table's rows: last good data per GPU, greyed when stale or when the host is down."""
    down = mon.state is MonitorState.RECONNECTING or mon.stale(now)
    return [GpuRow(g, stale=down or mon.gpu_stale(g.index, now), error=mon.gpu_error.get(g.index),
                   history=list(mon.history.get(g.index, ()))) for g in mon.gpu_list()]


def is_down(view: HostView) -> bool:
    """The pool says the host is not answering: (re)connecting, failed or silent."""
    return view.silent_s is not None or view.state in (
        HostState.CONNECTING, HostState.RECONNECTING, HostState.FAILED)


def status_parts(mon: HostMonitor, now: float, view: HostView) -> list[tuple[str, str]]:
    """The status line: host, state, source, GPUs, driver, sample age. The state is the pool's
    (`view`, console/hosts/host.py), as the header and the hosts list say it, with the age of the
    last data; a host connected again whose monitor has not sent its first sample yet reads
    `● connected · starting the monitor agent…`, never a state of its own."""
    s = mon.sample
    parts: list[tuple[str, str]] = [(f"{mon.name} ", "header")]
    age = fmt_age(mon.age(now))
    last = (f"  · last data {age}" if s else "", "stale")
    if is_down(view):
        retry = " (retrying)" if view.state is HostState.FAILED else ""
        state, detail = state_text(view) + retry, view.detail or mon.detail
        if view.unknown_key is not None:   # retrying cannot help: say what does
            state, detail = state_text(view), f"{view.unknown_key} · {TRUST_HINT}"
        return parts + [(state, "alert"), last, (f" · {detail}" if detail else "", "label")]
    if view.state is HostState.CONNECTED and (mon.state is MonitorState.RECONNECTING
                                              or s is None):
        return parts + [(state_text(view), "low"), last,
                        (" · starting the monitor agent…", "label")]
    if s is None:
        return parts + [("◌ starting the monitor agent…", "label")]
    if mon.stale(now):
        parts.append((f"● STALE: last sample {age}", "alert"))
    else:
        parts.append(("● live", "low"))
    source = "engine agent" if s.source == "engine" else "nvidia-smi fallback"
    parts.append((f"  · {source}", "label"))
    names = sorted({g.name for g in mon.gpus.values() if g.name})
    if mon.gpus:
        parts.append((f" · {len(mon.gpus)} × {', '.join(names) or 'GPU'}", "label"))
    if s.driver:
        parts.append((f" · driver {s.driver}", "label"))
    if not mon.stale(now):
        parts.append((f" · {age}", "label"))
    if mon.detail:
        parts.append((f" · {mon.detail}", "mid"))
    return parts


def no_data(mon: HostMonitor, view: HostView) -> tuple[str, str] | None:
    """Why a host has no samples to show (None: the first is on its way): its state as the pool
    says it, and its error (the connection's, else the monitor's)."""
    if mon.sample is not None:
        return None
    if view.unknown_key is not None:
        return (f"{state_text(view)} {view.unknown_key}", TRUST_HINT)
    if view.state is HostState.FAILED:
        return (f"{state_text(view)}, retrying", view.detail)
    if is_down(view):
        return (state_text(view), view.detail or mon.detail or "no answer")
    if mon.state is MonitorState.RECONNECTING:
        return (state_text(view), f"starting the monitor agent… ({mon.detail or 'no answer'})")
    return None


class GpuPane(ShownTimers, Vertical):
    """GPUs, processes and host of the selected host; `d` toggles the GPU detail view."""

    BINDINGS: ClassVar[list[BindingType]] = list(bindings("gpu"))

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.host: str | None = None
        self._drawn: tuple[object, ...] = ()

    def compose(self) -> ComposeResult:
        yield StatusLine(id="gpu-status")
        yield HostStrip(id="gpu-host")
        yield GpuTable(id="gpu-table")
        yield GpuDetail(id="gpu-detail")
        yield ProcessTable(id="gpu-procs")

    def on_mount(self) -> None:
        self.query_one(GpuDetail).display = False
        self.set_shown_interval(1.0, self.refresh_view)

    def show_host(self, host: str) -> None:
        self.host = host
        services(self).monitors.watch(host)
        self.refresh_view(force=True)

    def on_show(self) -> None:
        self.refresh_view(force=True)

    def action_toggle_detail(self) -> None:
        detail = self.query_one(GpuDetail)
        detail.display = not detail.display
        self.refresh_view(force=True)

    def action_cycle_sort(self) -> None:
        self.query_one(ProcessTable).action_cycle_sort()

    def on_gpu_table_cursor_moved(self, _event: GpuTable.CursorMoved) -> None:
        self.refresh_view(force=True)

    def refresh_view(self, force: bool = False) -> None:
        """Redraw from the host's monitor (skipped when hidden or when nothing changed)."""
        if self.host is None or not (force or self.is_on_screen):
            return
        mon: HostMonitor = services(self).monitors[self.host]
        now: float = services(self).clock()
        view = services(self).pool.view(self.host)
        key = (self.host, mon.version, int(now), mon.state, view)
        if key == self._drawn and not force:
            return
        self._drawn = key
        down = mon.state is MonitorState.RECONNECTING or mon.stale(now) or is_down(view)
        self.set_class(down, "-down")
        self.query_one(StatusLine).show(status_parts(mon, now, view))
        s = mon.sample
        why = no_data(mon, view)
        self.query_one(HostStrip).show(s.host if s else None, s.host_reason if s else
                                       why and f"no data ({why[0]})", down)
        rows = gpu_rows(mon, now)
        window = (now - WINDOW_S, now)
        empty = f"No GPUs: {s.reason}" if s and s.reason else \
            f"No data: {self.host} {why[0]}\n{why[1]}" if why else "Waiting for the first sample…"
        table = self.query_one(GpuTable)
        table.show(rows, window, "UTIL, LAST 5 MIN", empty)
        detail = self.query_one(GpuDetail)
        if detail.display:
            detail.show(table.selected, window, "5 min")
        procs = [p for g in mon.gpu_list() for p in g.procs]
        self.query_one(ProcessTable).show(procs, down)
