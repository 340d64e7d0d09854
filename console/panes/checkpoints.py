"""The checkpoints pane: the selected host's drafter checkpoints, inspected and converted.

    enter / i  inspect the selected checkpoint again (moving the cursor inspects it anyway)
    c          convert it (dialog: target style, destination, dtype); a progress bar follows the
               engine's progress events, then the result's own inspect report is shown
    v          serve it in vLLM (dialog: verifier, TP, k, port, extra args): checked, then
               started as a detached run (console/checkpoints/serve.py); the Runs pane follows and
               stops it. Once the server answers, what vLLM loaded is read back and a field that
               did not reach it is shown as a warning
    e          evaluate it: `engine eval` on the host (dialog: target, held-out data, k, samples,
               transformers or vLLM's engine); a progress bar, then the acceptance length and
               the rate at each draft position (console/checkpoints/evaluate.py)
    w          swap it into the host's running vLLM server without a restart, checked against
               the served drafter first (console/checkpoints/swap.py)
    m          compare the served drafters by vLLM's measured acceptance (dialogs/compare.py)
    r          scan the host again (configured folders, run outputs, ROOT/converted)

No I/O here: workers call console/checkpoints/service.py. Reports are kept per (path, mtime), so
going back to a checkpoint shows its report at once. Engine errors are shown whole in the report
area.
"""

from __future__ import annotations

import posixpath
import shlex
import time
from typing import Any, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical, VerticalScroll
from textual.widgets import DataTable, Static

from console.checkpoints.evaluate import EvalRequest, evaluate_checkpoint
from console.checkpoints.results import convert_line
from console.checkpoints.serve import ServeRequest, check_served, serve
from console.checkpoints.service import (
    Checkpoint,
    InspectReport,
    convert_checkpoint,
    converted_dir,
    find_checkpoints,
    inspect_checkpoint,
    scan_checkpoints,
)
from console.checkpoints.swap import swap
from console.demo.config import HELD_OUT_DATA
from console.dialogs.compare import CompareScreen
from console.dialogs.convert_dialog import (
    ConvertDialog,
    ConvertRequest,
    dialog_words,
    exists_message,
)
from console.dialogs.eval_dialog import EvalDialog
from console.dialogs.serve_dialog import ServeDialog
from console.errors import ConsoleError, describe_error, on_host
from console.panes.timers import ShownTimers
from console.settings.config import LOCAL
from console.ui.host_text import markup, plain
from console.ui.keymap import bindings
from console.ui.services import services
from console.widgets.inspect_view import InspectView
from console.widgets.meters import count, fmt_bytes
from console.widgets.progress import ProgressBar
from console.widgets.text_table import TextTable
from engine import events

SCAN_EVERY_S = 10.0
#: how a refusal that stays on screen is put away
DISMISS = "  (i, enter or another row: back to the inspect report)"
INSPECT_DELAY_S = 0.3   # the cursor rests this long before a report is asked for
COLUMNS = ("CHECKPOINT", "SIZE", "MODIFIED")


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


def display_path(ck: Checkpoint, root: str) -> str:
    """Run outputs and conversions relative to the host root (runs/..., converted/...);
    configured folders in full."""
    if ck.path.startswith(root.rstrip("/") + "/"):
        return ck.path[len(root.rstrip("/")) + 1:]
    return ck.path


def fit_path(path: str, room: int) -> str:
    """`path` in `room` columns: its end (the drafter's own name) kept, the start cut to `…`."""
    if room <= 0 or len(path) <= room:
        return path
    return "…" + path[len(path) - room + 1:]


def ckpt_row(ck: Checkpoint, root: str, room: int = 0) -> tuple[str, str, str]:
    """CHECKPOINT (fitted to `room` columns, 0: whole), SIZE, MODIFIED."""
    return (fit_path(display_path(ck, root), room), fmt_bytes(ck.bytes),
            time.strftime("%m-%d %H:%M", time.localtime(ck.mtime)))


def path_room(width: int, rows: list[tuple[str, str, str]]) -> int:
    """Columns left for CHECKPOINT in a table `width` wide (0: unknown, show whole paths):
    SIZE and MODIFIED as wide as their widest cell or header, each column padded 1 a side."""
    if width <= 0:
        return 0
    size_w = max([len(COLUMNS[1])] + [len(r[1]) for r in rows])
    mod_w = max([len(COLUMNS[2])] + [len(r[2]) for r in rows])
    return max(12, width - size_w - mod_w - 3 * 2)


class CheckpointTable(TextTable):
    """Checkpoints of the selected host; enter inspects the one under the cursor."""

    BINDINGS: ClassVar[list[BindingType]] = list(bindings("checkpoints", on="CheckpointTable"))

    def __init__(self, **kw: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kw)
        self.paths: list[str] = []
        self.rows_shown: list[tuple[str, ...]] = []

    def on_mount(self) -> None:
        self.add_columns(*COLUMNS)

    def show(self, paths: list[str], rows: list[tuple[str, ...]]) -> None:
        if paths == self.paths and rows == self.rows_shown:
            return
        selected = self.selected
        self.paths, self.rows_shown = paths, rows
        self.clear()
        for p, r in zip(paths, rows, strict=False):
            self.add_row(*r, key=p)
        if selected in paths:
            self.move_cursor(row=paths.index(selected))

    def select(self, path: str) -> None:
        if path in self.paths:
            self.move_cursor(row=self.paths.index(path))

    @property
    def selected(self) -> str | None:
        if not self.paths or self.cursor_row < 0:
            return None
        return self.paths[min(self.cursor_row, len(self.paths) - 1)]


class CheckpointsPane(ShownTimers, Vertical):
    """Checkpoints of the selected host (module docstring)."""

    BINDINGS: ClassVar[list[BindingType]] = list(bindings("checkpoints"))

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.host: str | None = None
        self.found: dict[str, list[Checkpoint]] = {}
        self.roots: dict[str, str] = {}
        self.missing: dict[str, list[tuple[str, str]]] = {}  # host -> configured folders unread
        self.reports: dict[tuple[str, float], InspectReport] = {}
        self.scan_error: str | None = None
        self.scans = 0
        self.converting: str | None = None
        self.last_verifier: dict[str, str] = {}  # host -> the verifier last served there
        self.last_eval_data: dict[str, str] = {}  # host -> the data folder last evaluated on
        self._scanning = False
        self._shown_path: str | None = None
        # an outcome (serve refused or started, swap) stays on screen while the cursor rests on
        # this checkpoint: a rescan does not replace it; moving, `i` or enter go back to reports
        self._pinned: str | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="ckpt-status")
        yield CheckpointTable(id="ckpt-table")
        yield ProgressBar(id="ckpt-bar", show_eta=False)
        with VerticalScroll(id="ckpt-report-box"):
            yield InspectView(id="ckpt-report")

    def on_mount(self) -> None:
        self.query_one("#ckpt-bar").display = False
        self.set_shown_interval(SCAN_EVERY_S, self._poll)

    def on_resize(self) -> None:
        self._draw()   # paths are fitted to the table's width

    # -- host and scanning -----------------------------------------------------------------
    def show_host(self, host: str) -> None:
        self.host = host
        self._shown_path = None
        self._draw()
        if self.is_on_screen:
            self.scan(host)

    def on_show(self) -> None:
        if self.host is not None:
            self.scan(self.host)

    def _poll(self) -> None:
        if self.host is not None and self.is_on_screen and self.converting is None \
                and not self._scanning:
            self.scan(self.host)

    def action_refresh(self) -> None:
        if self.host is not None:
            self.scan(self.host)

    @work(exclusive=True, group="ckpt-scan", exit_on_error=False)
    async def scan(self, host: str) -> None:
        self._scanning = True
        try:
            h = await services(self).pool.ensure(host)
            scanned = await scan_checkpoints(h)
            self.roots[host] = await h.root()
        except ConsoleError as e:
            self.scan_error = on_host(host, describe_error(e))
            self._draw()
            return
        finally:
            self._scanning = False
        self.scan_error = None
        self.found[host], self.missing[host] = scanned.checkpoints, scanned.missing
        self.scans += 1
        self._draw()
        self._inspect_selected()

    def _draw(self) -> None:
        host = self.host
        if host is None:
            return
        found = self.found.get(host, [])
        root = self.roots.get(host, "")
        self.query_one(InspectView).root = root
        table = self.query_one(CheckpointTable)
        whole = [ckpt_row(c, root) for c in found]
        width = table.scrollable_content_region.width
        most = table.styles.max_height   # more rows than it shows: a scrollbar takes columns
        if width and most is not None and len(found) + 1 > most.value \
                and not table.show_vertical_scrollbar:   # (a shown one is not in `width`)
            width -= table.styles.scrollbar_size_vertical
        room = path_room(width, whole)
        table.show([c.path for c in found], [ckpt_row(c, root, room) for c in found])
        config = services(self).config
        folders = ", ".join(config.hosts[host].checkpoints) or "none configured"
        text = markup("[b]$host[/b] · $n · folders: $folders", host=host,
                      n=count(len(found), 'checkpoint'), folders=folders)
        if root:
            text += plain(f" · runs and conversions under {root}")
        missing = self.missing.get(host, [])
        if missing:   # a typo in `checkpoints = [...]` would otherwise look like an empty folder
            text += markup("\n[$warning]$why[/]", why="; ".join(
                f"configured folder {f}: {why}" for f, why in missing))
        if self.scan_error:
            text += markup("\n[$error]$why[/]", why=self.scan_error)
        self.query_one("#ckpt-status", Static).update(text)
        if not found and self.scans:
            unread = "; ".join(f"the configured folder {f}: {why} on {host}"
                               for f, why in missing)
            hint = (f"{unread}; fix the host's `checkpoints = [...]`" if missing
                    else "list folders in the host's `checkpoints = [...]`")
            self.query_one(InspectView).show_text(
                f"No checkpoints yet: {hint}, or finish a training run.")

    def _pin(self) -> str:
        """The checkpoint an outcome shown now stays over (the row under the cursor)."""
        return self.query_one(CheckpointTable).selected or ""

    def selected(self) -> Checkpoint | None:
        path = self.query_one(CheckpointTable).selected
        return next((c for c in self.found.get(self.host or "", []) if c.path == path), None)

    # -- inspecting --------------------------------------------------------------------------
    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if isinstance(event.data_table, CheckpointTable):
            self._inspect_selected()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if isinstance(event.data_table, CheckpointTable):
            event.stop()
            self.action_inspect()

    def _inspect_selected(self, again: bool = False) -> None:
        ck = self.selected()
        if ck is None or self.host is None or self.converting is not None:
            return
        if ck.path == self._shown_path and not again:
            return
        if ck.path == self._pinned and not again:
            return
        self._pinned = None
        self._shown_path = ck.path
        cached = None if again else self.reports.get((ck.path, ck.mtime))
        if cached is not None:
            self.query_one(InspectView).show_report(cached.to_json(), ck.path)
            return
        self.query_one(InspectView).show_text(f"inspecting {ck.path} …")
        self.inspect(self.host, ck)

    def action_inspect(self) -> None:
        if self._free_selection() is not None:   # says why not (nothing selected, busy)
            self._inspect_selected(again=True)

    @work(exclusive=True, group="ckpt-inspect", exit_on_error=False)
    async def inspect(self, host: str, ck: Checkpoint) -> None:
        import asyncio
        await asyncio.sleep(INSPECT_DELAY_S)  # a cursor sweeping the list inspects the last row
        view = self.query_one(InspectView)
        try:
            h = await services(self).pool.ensure(host)
            report = await inspect_checkpoint(h, ck.path)
        except ConsoleError as e:
            if self._shown_path == ck.path:
                view.show_error(f"inspect failed: {describe_error(e)}", ck.path)
            return
        self.reports[(ck.path, ck.mtime)] = report
        if self._shown_path == ck.path:
            view.show_report(report.to_json(), ck.path)

    # -- converting --------------------------------------------------------------------------
    def _free_selection(self) -> Checkpoint | None:
        """The checkpoint under the cursor when a convert or an evaluation may start on it (not
        while a conversion runs); says why not otherwise."""
        ck = self.selected()
        if ck is None or self.host is None:
            self.notify("No checkpoint selected", severity="warning")
            return None
        if self.converting is not None:
            self.notify(f"Busy converting {self.converting}", severity="warning")
            return None
        return ck

    def action_convert(self) -> None:
        ck = self._free_selection()
        if ck is not None and self.host is not None:
            self.ask_convert(self.host, ck)

    @work(group="ckpt-convert", exit_on_error=False)
    async def ask_convert(self, host: str, ck: Checkpoint) -> None:
        """The dialog, then the conversion; a destination that is refused (it exists, or the
        engine will not replace it) reopens the dialog as it was, the reason under the field."""
        h = await services(self).pool.ensure(host)
        known = self.reports.get((ck.path, ck.mtime))
        step = known.step if known is not None else None
        req: ConvertRequest | None = None
        error: str | None = None
        while True:
            req = await self.app.push_screen_wait(ConvertDialog(
                ck.path, await converted_dir(h), verifier=self.known_verifier(host, ck),
                step=step, request=req, error=error))
            if req is None:
                return
            if req.verifier:
                self.last_verifier[host] = req.verifier   # the serve dialog proposes it too
            error = None if req.force or await h.stat(req.dst) is None else exists_message()
            if error is None:
                error = await self.run_convert(host, req)
            if error is None:
                return

    def known_verifier(self, host: str, ck: Checkpoint) -> str:
        """The verifier to propose: the checkpoint's config names it, else the one last given
        on the host (served, or recorded by a conversion), else the target the host's profiles
        train against."""
        known = self.reports.get((ck.path, ck.mtime))
        if known is not None and known.verifier:
            return known.verifier
        if self.last_verifier.get(host):
            return self.last_verifier[host]
        config = services(self).config
        for profile in config.profiles.values():
            if host in profile.hosts:
                target = flag_value(profile.run, "--target")
                if target:
                    return target
        return ""

    async def run_convert(self, host: str, req: ConvertRequest) -> str | None:
        """Convert and show the result's report; returns the engine's refusal of the
        destination (for the dialog), None otherwise (a failure is shown in the report area)."""
        view = self.query_one(InspectView)
        bar = self.query_one("#ckpt-bar", ProgressBar)
        heading = f"convert {req.src} → {req.dst} (--to {req.to}, --dtype {req.dtype})"
        self.converting = req.src
        self._shown_path = None
        view.show_text(heading + "\nstarting…")
        bar.display = True
        bar.update(total=None, progress=0)
        refused: list[str] = []

        def on_event(ev: events.Event) -> None:
            if isinstance(ev, events.Progress):
                bar.update(total=ev.total, progress=ev.done)
                view.show_text(f"{heading}\n{ev.desc or 'convert'} {ev.done}/"
                               f"{ev.total} {ev.unit}")
            elif isinstance(ev, events.Error) and ev.type == "DestinationError":
                refused.append(ev.msg)

        try:
            h = await services(self).pool.ensure(host)
            summary = await convert_checkpoint(h, req.src, req.dst, req.to, req.dtype,
                                               req.force, verifier=req.verifier,
                                               on_event=on_event)
            bar.update(total=1, progress=1)
            view.show_text(f"{heading}\nconverted; inspecting the result…")
            report = await inspect_checkpoint(h, summary.dst)
        except ConsoleError as e:
            if refused:   # nothing was written: back to the report, and to the dialog
                self.converting = None
                self._inspect_selected(again=True)
                return dialog_words(refused[0], req.dst)
            view.show_error(f"convert failed: {describe_error(e)}", heading)
            return None
        finally:
            self.converting = None
            bar.display = False
        dst = summary.dst
        view.show_report(report.to_json(), convert_line(summary, req.to))
        self._shown_path = dst
        await self._rescan_and_select(host, dst, report)
        return None

    # -- serving -----------------------------------------------------------------------------
    def action_serve(self) -> None:
        ck = self.selected()
        if ck is None or self.host is None:
            self.notify("No checkpoint selected", severity="warning")
            return
        self.ask_serve(self.host, ck, self.known_verifier(self.host, ck))

    @work(group="ckpt-serve", exit_on_error=False)
    async def ask_serve(self, host: str, ck: Checkpoint, verifier: str) -> None:
        req = await self.app.push_screen_wait(ServeDialog(ck.path, verifier))
        if req is not None:
            await self.run_serve(host, req)

    async def run_serve(self, host: str, req: ServeRequest) -> None:
        view = self.query_one(InspectView)
        heading = f"serve {req.ckpt} with {req.verifier} (k={req.k}, TP {req.tp}, port {req.port})"
        self._shown_path, self._pinned = None, self._pin()
        view.show_text(heading + "\nchecking the checkpoint and the verifier…")
        self.last_verifier[host] = req.verifier
        pool = services(self).pool
        try:
            await pool.ensure(host)
            run = await serve(services(self).config, host, req, pool)
        except ConsoleError as e:
            view.show_error(f"serve refused: {describe_error(e)}", heading + DISMISS)
            return
        started = (f"{heading}\nstarted as run {run.id} ({run.status}); follow or stop it in "
                   f"the Runs pane (5); metrics at http://127.0.0.1:{req.port}/metrics")
        view.show_text(started + "\nwaiting for the server to read back what vLLM loaded…")
        self.notify(f"Serving {req.ckpt} as run {run.id}")

        def waiting(seconds: float, line: str) -> None:
            if self._pinned == pinned:   # still the serve shown (not another checkpoint)
                view.show_text(f"{started}\nwaiting for vLLM ({seconds:.0f} s): "
                               f"{line or 'nothing logged yet'}")

        pinned = self._pinned
        try:
            checked = await check_served(pool[host], req, run, on_wait=waiting)
        except ConsoleError as e:
            view.show_text(f"{started}\nserved config not checked: {describe_error(e)}")
            return
        view.show_text("\n".join([started, checked.summary(),
                                  *(f"warning: {w}" for w in checked.warnings)]))
        if checked.warnings:
            self.notify(f"served config: {len(checked.warnings)} warning(s): "
                        f"{checked.warnings[0]}", severity="warning")

    def action_swap(self) -> None:
        ck = self.selected()
        if ck is None or self.host is None:
            self.notify("No checkpoint selected", severity="warning")
            return
        self.run_swap(self.host, ck.path)

    @work(group="ckpt-swap", exit_on_error=False)
    async def run_swap(self, host: str, path: str) -> None:
        view = self.query_one(InspectView)
        heading = f"swap {path} into the vLLM server on {host}"
        self._shown_path, self._pinned = None, self._pin()
        view.show_text(heading + "\nchecking it against the served drafter…")
        try:
            done = await swap(await services(self).pool.ensure(host), path)
        except ConsoleError as e:
            view.show_error(f"swap: {describe_error(e)}", heading + DISMISS)
            return
        notes = "".join(f"\nnote: {n}" for n in (done["note"],
                                                  done["server"]["records_disagree"]) if n)
        view.show_text(f"{heading}\n{done['url']} now serves weight version "
                       f"{done['weight_version']} (was {done['previous_version']}), swapped in "
                       f"{done['seconds']:.3f} s; `bench` measures it{notes}")
        self.notify(f"Swapped in {done['weight_version']}")

    # -- evaluating ----------------------------------------------------------------------------
    def action_evaluate(self) -> None:
        ck = self._free_selection()
        if ck is not None and self.host is not None:
            self.ask_evaluate(self.host, ck)

    @work(group="ckpt-eval", exit_on_error=False)
    async def ask_evaluate(self, host: str, ck: Checkpoint) -> None:
        req = await self.app.push_screen_wait(EvalDialog(
            ck.path, self.known_verifier(host, ck), self.known_data(host)))
        if req is not None:
            await self.run_evaluate(host, req)

    def known_data(self, host: str) -> str:
        """The held-out data to propose: the folder last evaluated on there, else the demo
        workspace's held-out set on the local host; never the data a profile trains on, whose
        samples the drafter has seen (its figure reads high)."""
        if self.last_eval_data.get(host):
            return self.last_eval_data[host]
        demo = services(self).config.demo
        return posixpath.join(demo, HELD_OUT_DATA) if host == LOCAL and demo else ""

    async def run_evaluate(self, host: str, req: EvalRequest) -> None:
        view = self.query_one(InspectView)
        bar = self.query_one("#ckpt-bar", ProgressBar)
        how = "vLLM's engine" if req.vllm_engine else "transformers"
        heading = f"evaluate {req.draft} on {req.data} (k={req.k}, target {req.target}, {how})"
        self.last_verifier[host], self.last_eval_data[host] = req.target, req.data
        self._shown_path = None
        view.show_text(heading + "\nloading the target and the drafter…")
        bar.display = True
        bar.update(total=None, progress=0)

        def on_event(ev: events.Event) -> None:
            if isinstance(ev, events.Progress):
                bar.update(total=ev.total, progress=ev.done)
                view.show_text(f"{heading}\n{ev.desc or 'eval'} {ev.done}/{ev.total} {ev.unit}")

        try:
            result = await evaluate_checkpoint(await services(self).pool.ensure(host), req,
                                               on_event=on_event)
        except ConsoleError as e:
            view.show_error(f"evaluate failed: {describe_error(e)}", heading)
            return
        finally:
            bar.display = False
        view.show_text(f"{heading}\n{result.line()}")
        self.notify(f"{req.draft}: acceptance length {result.acceptance_length:.2f}")

    def action_compare(self) -> None:
        self.app.push_screen(CompareScreen())

    async def _rescan_and_select(self, host: str, path: str, report: InspectReport) -> None:
        try:
            h = await services(self).pool.ensure(host)
            self.found[host] = await find_checkpoints(h)
        except ConsoleError:
            return
        for ck in self.found[host]:
            if posixpath.normpath(ck.path) == posixpath.normpath(path):
                self.reports[(ck.path, ck.mtime)] = report
        self._shown_path = path
        self._draw()
        self.query_one(CheckpointTable).select(path)
