"""The runs pane's two tables: the profiles that can start on the selected host, and its runs
(status, progress, best held-out figure, elapsed time, the code they ran). Rows are computed
by pure functions; the tables only draw them (status colours from the `runs--*` component
classes)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual.binding import BindingType
from textual.widgets import DataTable

from console.runs.pipeline import parts_text
from console.runs.progress import RunProgress
from console.scheduler.launch import fit_id
from console.scheduler.pipeline import PipelineRun
from console.scheduler.run_record import RunRecord
from console.scheduler.run_status import RunStatus
from console.settings.config import Profile
from console.ui.keymap import bindings
from console.widgets.text_table import TextTable

PROFILE_COLUMNS = ("PROFILE", "HOSTS", "COMMAND")
#: what a reader scans first comes first, so at 80 columns the run, its status (with the exit
#: code), progress, best held-out figure and elapsed time are on screen; CODE scrolls into view
RUN_COLUMNS = ("RUN", "STATUS", "PROGRESS", "HELD-OUT", "ELAPSED", "CODE")
COMMAND_WIDTH = 60
STATUS_MARK = {RunStatus.PENDING: "…", RunStatus.RUNNING: "▶", RunStatus.SUCCEEDED: "✔",
               RunStatus.FAILED: "✖", RunStatus.STOPPED: "■", RunStatus.LOST: "?",
               RunStatus.CORRUPT: "!"}
REASON_WIDTH = 48
#: the RUN cell's width: a longer id is cut in the middle (its start names the profile, its end
#: the time and suffix that tell runs apart), so every column up to ELAPSED fits 80 columns
#: (29: `finetune-YYYYMMDD-HHMMSS-xxxx` whole)
RUN_WIDTH = 29


def fmt_duration(seconds: float | None) -> str:
    """`1:02:03` / `2:03`; `-` for no time, a negative one, NaN or infinity (an engine's ETA
    before its rate is known can be either)."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def stop_outcome(run_id: str, status: RunStatus, refused: str = "", warning: str = "") -> str:
    """What a stop did, for the pane's activity line and run detail: `stopped`, or a run that
    had ended before the signal (nothing was sent); `warning`: what the command left undone."""
    if warning:
        return f"{run_id}: {status}; {warning}"
    if refused:
        return f"{run_id}: {status} ({refused})"
    if status == RunStatus.STOPPED or status.active:
        return f"{run_id}: {status}"
    return f"{run_id} had already ended ({status}): nothing was signalled"


def short_command(run: str, width: int = COMMAND_WIDTH) -> str:
    """The run string for a table cell: long absolute paths as …/last/two, then cut."""
    words = []
    for w in run.split(" "):
        parts = w.split("/")
        words.append("…/" + "/".join(parts[-2:]) if w.startswith("/") and len(parts) > 4 else w)
    text = " ".join(words)
    return text if len(text) <= width else text[:width - 1] + "…"


def profile_row(p: Profile) -> tuple[str, str, str]:
    if p.pipeline is not None:   # its parts: where each runs, and the trainer's command
        pl = p.pipeline
        trainer = pl.trainer
        return (p.name, f"store {pl.store_host} · producer {','.join(pl.producer.hosts)} · "
                        f"trainer {','.join(trainer.hosts)}"
                        + (f" ×{trainer.nproc_per_node}" if trainer.nproc_per_node > 1 else ""),
                "pipeline: " + short_command(trainer.run, COMMAND_WIDTH - 10))
    nodes = ",".join(p.hosts) + (f" ×{p.nproc_per_node}" if p.nproc_per_node > 1 else "")
    return p.name, nodes, short_command(p.run)


def code_of(rec: RunRecord) -> str:
    """The pushed code a run used: the manifest hash, and the git commit when there is one."""
    manifest = rec.push.manifest[:8] or "-"
    gits = list(rec.push.git.values())
    return manifest + (f" {gits[0][:7]}{'+' if gits[0].endswith('-dirty') else ''}"
                       if gits else "")


def progress_of(rec: RunRecord, prog: RunProgress | None) -> str:
    """`37/150 1:12` (steps and ETA) while running, `150/150` after, `-` without events."""
    if prog is None or prog.done is None:
        return "-"
    text = f"{prog.done}/{prog.total}" if prog.total else str(prog.done)
    if rec.status == RunStatus.RUNNING and prog.eta_s is not None and prog.total and \
            prog.done < prog.total:
        text += f" {fmt_duration(prog.eta_s)}"
    return text


def slurm_of(rec: RunRecord) -> str:
    """A Slurm run's job id, partition and nodes for the RUN cell ("" for other runs)."""
    if not rec.job_id:
        return ""
    part = rec.partition
    nodes = rec.nodelist or (f"{rec.nnodes} nodes" if rec.nnodes > 1 else "")
    return " · job " + " ".join(str(x) for x in (rec.job_id, part, nodes) if x)


def status_text(rec: RunRecord) -> str:
    """`failed 127`: the status, with the exit code when it says more than the status does
    (no brackets: the two columns they took let ELAPSED fit 80 columns)."""
    quiet = rec.exit_code in (None, 0) or rec.status == RunStatus.STOPPED
    return rec.status.value + ("" if quiet else f" {rec.exit_code}")


def run_row(rec: RunRecord, prog: RunProgress | None, now: float) -> tuple[str, ...]:
    if rec.job_id:  # a Slurm job: one record for all its nodes, the scheduler's facts
        why = f" ({rec.reason})" if rec.reason and rec.status != RunStatus.RUNNING else ""
        status = status_text(rec) + why
        end = rec.end if rec.end else (now if rec.status == RunStatus.RUNNING else None)
        dur = fmt_duration(end - rec.start) if rec.start and end else "-"
        job = slurm_of(rec)
        return (fit_id(rec.id, max(16, RUN_WIDTH - len(job))) + job,
                f"{STATUS_MARK.get(rec.status, ' ')} {status}",
                progress_of(rec, prog), rec.best_cell(), dur, code_of(rec))
    node = f" [{rec.node_rank}/{rec.nnodes}]" if rec.nnodes > 1 else ""
    status = status_text(rec)
    if rec.status == RunStatus.CORRUPT:  # only why the record cannot be trusted, cut to a cell
        reason = rec.error if len(rec.error) <= REASON_WIDTH else \
            rec.error[:REASON_WIDTH - 1] + "…"
        return (fit_id(rec.id, RUN_WIDTH), f"{STATUS_MARK[rec.status]} {rec.status} ({reason})",
                *("-",) * (len(RUN_COLUMNS) - 2))
    took = rec.elapsed(now)      # a resumed run's: every attempt's running time
    dur = fmt_duration(took) if took is not None else "-"
    return (fit_id(rec.id, RUN_WIDTH - len(node)) + node,
            f"{STATUS_MARK.get(rec.status, ' ')} {status}",
            progress_of(rec, prog), rec.best_cell(), dur, code_of(rec))


def pipeline_row(pipe: PipelineRun, prog: RunProgress | None, now: float) -> tuple[str, ...]:
    """One row for a pipeline: its id (with its trainer's Slurm job, if it is one), its status
    with each part's (`▶ running (store▶ producer▶ trainer…) Priority`: why a trainer job
    waits), and its trainer's progress and held-out figure."""
    trainer = pipe.part("trainer")
    lead = trainer[0] if trainer else pipe.records[0]
    start, end = pipe.start, pipe.end or (now if pipe.status.active else None)
    dur = fmt_duration(end - start) if start and end else "-"
    why = f" {lead.reason}" if trainer and lead.reason and lead.status == RunStatus.PENDING \
        else ""
    status = f"{STATUS_MARK.get(pipe.status, ' ')} {pipe.status.value} " \
             f"({parts_text(pipe, STATUS_MARK)}){why}"
    job = slurm_of(lead) if trainer else ""
    return (fit_id(pipe.id, max(16, RUN_WIDTH - len(job))) + job, status,
            progress_of(lead, prog), lead.best_cell(), dur, code_of(lead))


class ProfileTable(TextTable):
    """Profiles runnable on the selected host; enter opens the profile's newest run."""

    BINDINGS: ClassVar[list[BindingType]] = list(bindings("runs", on="ProfileTable"))

    def __init__(self, **kw: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kw)
        self.rows_shown: list[tuple[str, ...]] = []

    def on_mount(self) -> None:
        self.add_columns(*PROFILE_COLUMNS)

    def show(self, rows: list[tuple[str, ...]]) -> None:
        if rows == self.rows_shown:
            return
        keep = self.cursor_row
        self.rows_shown = rows
        self.clear()
        for r in rows:
            self.add_row(*r, key=r[0])
        if rows:
            self.move_cursor(row=min(keep, len(rows) - 1))

    @property
    def selected(self) -> str | None:
        if not self.rows_shown or self.cursor_row < 0:
            return None
        return self.rows_shown[min(self.cursor_row, len(self.rows_shown) - 1)][0]


class RunTable(TextTable):
    """Runs of the selected host, newest first; enter opens the one under the cursor."""

    BINDINGS: ClassVar[list[BindingType]] = list(bindings("runs", on="RunTable"))
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        *DataTable.COMPONENT_CLASSES, *(f"runs--{s.value}" for s in STATUS_MARK)}

    def __init__(self, **kw: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kw)
        self.rows_shown: list[tuple[str, ...]] = []
        self.ids: list[str] = []

    def on_mount(self) -> None:
        for col in RUN_COLUMNS:
            self.add_column(col, key=col)

    def _status_style(self, status: str) -> Style:
        name = status.split()[1] if " " in status else status
        if f"runs--{name}" not in self.COMPONENT_CLASSES:
            return Style()
        return self.get_component_rich_style(f"runs--{name}", partial=True)

    def show(self, ids: list[str], rows: list[tuple[str, ...]]) -> None:
        if rows == self.rows_shown and ids == self.ids:
            return
        selected = self.selected
        same_rows = ids == self.ids
        self.rows_shown, self.ids = rows, ids
        if same_rows:  # only cells changed: update in place, the cursor stays put
            for rid, r in zip(ids, rows, strict=False):
                for col, value in zip(RUN_COLUMNS, r, strict=False):
                    cell: Any = Text(value, self._status_style(value)) if col == "STATUS" \
                        else value
                    self.update_cell(rid, col, cell, update_width=True)
            return
        self.clear()
        for rid, r in zip(ids, rows, strict=False):
            self.add_row(r[0], Text(r[1], self._status_style(r[1])), *r[2:], key=rid)
        if selected in ids:
            self.move_cursor(row=ids.index(selected))

    def select(self, run_id: str) -> None:
        if run_id in self.ids:
            self.move_cursor(row=self.ids.index(run_id))

    @property
    def selected(self) -> str | None:
        if not self.ids or self.cursor_row < 0:
            return None
        return self.ids[min(self.cursor_row, len(self.ids) - 1)]
