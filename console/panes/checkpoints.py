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

No I/O here and no decisions: a CheckpointsModel (console/checkpoints/model.py) holds the scans,
the reports (per path and mtime, so going back to a checkpoint shows its report at once), the
convert lock and what the dialogs propose; workers call console/checkpoints/service.py and the
pane draws what the model holds. Engine errors are shown whole in the report area.
"""

from __future__ import annotations

from typing import Any, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical, VerticalScroll
from textual.widgets import DataTable, Static

from console.checkpoints.evaluate import EvalRequest, evaluate_checkpoint
from console.checkpoints.model import CheckpointsModel
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
from console.dialogs.compare import CompareScreen
from console.dialogs.convert_dialog import (
    ConvertDialog,
    ConvertRequest,
    dialog_words,
    exists_message,
)
from console.dialogs.eval_dialog import EvalDialog
from console.dialogs.serve_dialog import ServeDialog
from console.errors import ConsoleError, describe_error
from console.panes.timers import ShownTimers
from console.settings.config import Config
from console.ui.host_text import markup, plain
from console.ui.keymap import bindings
from console.ui.services import services
from console.widgets.checkpoint_table import CheckpointTable
from console.widgets.inspect_view import InspectView
from console.widgets.meters import count
from console.widgets.progress import ProgressBar
from engine import events

__all__ = ["CheckpointTable", "CheckpointsPane"]

SCAN_EVERY_S = 10.0
#: how a refusal that stays on screen is put away
DISMISS = "  (i, enter or another row: back to the inspect report)"
INSPECT_DELAY_S = 0.3   # the cursor rests this long before a report is asked for


class CheckpointsPane(ShownTimers, Vertical):
    """Checkpoints of the selected host (module docstring)."""

    BINDINGS: ClassVar[list[BindingType]] = list(bindings("checkpoints"))

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.host: str | None = None
        self.model = CheckpointsModel()

    @property
    def converting(self) -> str | None:
        return self.model.converting

    @property
    def scan_error(self) -> str | None:
        return self.model.scan_error

    @property
    def scans(self) -> int:
        return self.model.scans

    @property
    def config(self) -> Config:
        return services(self).config

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
        self.model.shown_path = None
        self._draw()
        if self.is_on_screen:
            self.scan(host)

    def on_show(self) -> None:
        if self.host is not None:
            self.scan(self.host)

    def _poll(self) -> None:
        if self.host is not None and self.is_on_screen and self.model.may_poll():
            self.scan(self.host)

    def action_refresh(self) -> None:
        if self.host is not None:
            self.scan(self.host)

    @work(exclusive=True, group="ckpt-scan", exit_on_error=False)
    async def scan(self, host: str) -> None:
        self.model.scanning = True
        try:
            h = await services(self).pool.ensure(host)
            scanned = await scan_checkpoints(h)
            root = await h.root()
        except ConsoleError as e:
            self.model.scan_failed(host, e)
            self._draw()
            return
        finally:
            self.model.scanning = False
        self.model.scanned(host, scanned.checkpoints, scanned.missing, root)
        self._draw()
        self._inspect_selected()

    def _draw(self) -> None:
        host = self.host
        if host is None:
            return
        mine = self.model.of(host)
        self.query_one(InspectView).root = mine.root
        self.query_one(CheckpointTable).show_checkpoints(mine.found, mine.root)
        folders = ", ".join(self.config.hosts[host].checkpoints) or "none configured"
        text = markup("[b]$host[/b] · $n · folders: $folders", host=host,
                      n=count(len(mine.found), 'checkpoint'), folders=folders)
        if mine.root:
            text += plain(f" · runs and conversions under {mine.root}")
        if mine.missing:   # a typo in `checkpoints = [...]` would look like an empty folder
            text += markup("\n[$warning]$why[/]", why="; ".join(
                f"configured folder {f}: {why}" for f, why in mine.missing))
        if self.model.scan_error:
            text += markup("\n[$error]$why[/]", why=self.model.scan_error)
        self.query_one("#ckpt-status", Static).update(text)
        hint = self.model.empty_hint(host)
        if hint is not None:
            self.query_one(InspectView).show_text(hint)

    def selected(self) -> Checkpoint | None:
        return self.model.find(self.host or "", self.query_one(CheckpointTable).selected)

    def _show_outcome(self) -> str | None:
        """An outcome is shown now, pinned over the row under the cursor; returns the pin."""
        self.model.show_outcome(self.query_one(CheckpointTable).selected)
        return self.model.pinned

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
        if ck is None or self.host is None or not self.model.to_inspect(ck, again):
            return
        cached = None if again else self.model.report_of(ck)
        if cached is not None:
            self.query_one(InspectView).show_report(cached, ck.path)
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
            if self.model.shown_path == ck.path:
                view.show_error(f"inspect failed: {describe_error(e)}", ck.path)
            return
        self.model.keep_report(ck, report)
        if self.model.shown_path == ck.path:
            view.show_report(report, ck.path)

    # -- converting --------------------------------------------------------------------------
    def _free_selection(self) -> Checkpoint | None:
        """The checkpoint under the cursor when a convert or an evaluation may start on it (not
        while a conversion runs); says why not otherwise."""
        ck = self.selected()
        why = self.model.refusal(ck) if self.host is not None else "No checkpoint selected"
        if why is not None:
            self.notify(why, severity="warning")
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
        known = self.model.report_of(ck)
        step = known.step if known is not None else None
        req: ConvertRequest | None = None
        error: str | None = None
        while True:
            req = await self.app.push_screen_wait(ConvertDialog(
                ck.path, await converted_dir(h), verifier=self.known_verifier(host, ck),
                step=step, request=req, error=error))
            if req is None:
                return
            self.model.gave_verifier(host, req.verifier)   # the serve dialog proposes it too
            error = None if req.force or await h.stat(req.dst) is None else exists_message()
            if error is None:
                error = await self.run_convert(host, req)
            if error is None:
                return

    def known_verifier(self, host: str, ck: Checkpoint) -> str:
        return self.model.known_verifier(host, ck, self.config)

    async def run_convert(self, host: str, req: ConvertRequest) -> str | None:
        """Convert and show the result's report; returns the engine's refusal of the
        destination (for the dialog), None otherwise (a failure is shown in the report area)."""
        view = self.query_one(InspectView)
        bar = self.query_one("#ckpt-bar", ProgressBar)
        heading = f"convert {req.src} → {req.dst} (--to {req.to}, --dtype {req.dtype})"
        self.model.begin_convert(req.src)
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
                self.model.end_convert()
                self._inspect_selected(again=True)
                return dialog_words(refused[0], req.dst)
            view.show_error(f"convert failed: {describe_error(e)}", heading)
            return None
        finally:
            self.model.end_convert()
            bar.display = False
        dst = summary.dst
        view.show_report(report, convert_line(summary, req.to))
        self.model.shown_path = dst
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
        pinned = self._show_outcome()
        view.show_text(heading + "\nchecking the checkpoint and the verifier…")
        self.model.gave_verifier(host, req.verifier)
        pool = services(self).pool
        try:
            await pool.ensure(host)
            run = await serve(self.config, host, req, pool)
        except ConsoleError as e:
            view.show_error(f"serve refused: {describe_error(e)}", heading + DISMISS)
            return
        started = (f"{heading}\nstarted as run {run.id} ({run.status}); follow or stop it in "
                   f"the Runs pane (5); metrics at http://127.0.0.1:{req.port}/metrics")
        view.show_text(started + "\nwaiting for the server to read back what vLLM loaded…")
        self.notify(f"Serving {req.ckpt} as run {run.id}")

        def waiting(seconds: float, line: str) -> None:
            if self.model.pinned == pinned:   # still the serve shown (not another checkpoint)
                view.show_text(f"{started}\nwaiting for vLLM ({seconds:.0f} s): "
                               f"{line or 'nothing logged yet'}")

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
        self._show_outcome()
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
            ck.path, self.known_verifier(host, ck), self.model.known_data(host, self.config)))
        if req is not None:
            await self.run_evaluate(host, req)

    async def run_evaluate(self, host: str, req: EvalRequest) -> None:
        view = self.query_one(InspectView)
        bar = self.query_one("#ckpt-bar", ProgressBar)
        how = "vLLM's engine" if req.vllm_engine else "transformers"
        heading = f"evaluate {req.draft} on {req.data} (k={req.k}, target {req.target}, {how})"
        self.model.evaluated(host, req.target, req.data)
        self.model.shown_path = None
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
            found = await find_checkpoints(h)
        except ConsoleError:
            return
        self.model.rescanned(host, found, path, report)
        self._draw()
        self.query_one(CheckpointTable).select(path)
