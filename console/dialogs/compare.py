"""The comparison table: one row per serving session and weight version, and per replay, newest
first (drafter, weight version, provenance, k) with what vLLM measured while serving it
(acceptance length, per-position acceptance, throughput, time watched). Below 100 columns it
keeps drafter, provenance, k, acceptance length and the first three positions, so an 80x24
terminal shows the number that compares drafters; the highlighted row is written out whole
under the table (drafter, version, provenance, and what is uncertain about it).

Opened with `m` from the Checkpoints pane. Sessions whose run still runs are scraped through
their host every few seconds in a worker (console/checkpoints/compare.py: Measurer); every scrape is
kept, so the table shows finished sessions from what was recorded.
"""

from __future__ import annotations

from typing import Any, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from console.checkpoints.compare import Measurer, Row, table_of
from console.checkpoints.journal import load, sessions
from console.errors import ConsoleError
from console.runs.service import list_runs
from console.scheduler.run_status import RunStatus
from console.ui.host_text import plain
from console.ui.keymap import bindings
from console.ui.services import services
from console.widgets.footer import Footer
from console.widgets.text_table import TextTable

MEASURE_EVERY_S = 5.0
COLUMNS = ("Drafter", "Provenance", "k", "Acc len", "Per position", "Gen tok/s", "Watched",
           "Version")
NARROW = 100   # below this many columns (80x24) the table keeps what compares drafters
# (drafter, provenance, version, positions shown) widths, and the columns kept, wide and narrow
LAYOUTS = {False: (28, 30, 20, 4, COLUMNS), True: (17, 20, 0, 3, COLUMNS[:5])}


def _cut(text: str, width: int, keep_end: bool = False) -> str:
    if len(text) <= width:
        return text
    return "…" + text[1 - width:] if keep_end else text[:width - 1] + "…"


def _cut_provenance(p: str, width: int) -> str:
    """RUN@STEP < SOURCE in `width`: the run's name gives way first (its step and source are
    what tell two rows apart)."""
    run, at, rest = p.partition("@") if "@" in p else p.partition(" < ")
    room = width - len(at + rest) - 1
    if len(p) <= width or room < 6:
        return _cut(p, width)
    return run[:room] + "…" + at + rest


def cells(r: Row, narrow: bool = False) -> tuple[str, ...]:
    """One row; on a narrow screen shorter names, three positions, no throughput, time or
    version. A version keeps its start and its hash's end (what tells two apart)."""
    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    name_w, prov_w, ver_w, positions, columns = LAYOUTS[narrow]
    v = r.weight_version or "-"
    version = v if len(v) <= ver_w else v[:ver_w - 10] + "…" + v[-9:]
    row = (_cut(r.drafter, name_w, keep_end=True) + (" !" if r.note else ""),
           _cut_provenance(r.provenance, prov_w) or "-", "-" if r.k is None else str(r.k),
           f(r.acceptance_length, ".2f"),
           " ".join(f"{p:.2f}" for p in r.per_position[:positions]) or "-",
           f(r.generation_tokens_per_s, ".1f"), f"{r.seconds:.0f} s" if r.seconds else "-",
           version)
    return row[:len(columns)]


def detail(r: Row) -> str:
    """The highlighted row, whole."""
    out = f"{r.drafter} · version {r.weight_version or 'not recorded'} · provenance " \
          f"{r.provenance or 'none recorded'} · {r.run_id} on {r.host}"
    return out + (f"\n! {r.note}" if r.note else "")


class CompareScreen(ModalScreen[None]):
    """The comparison table (module docstring)."""

    KEY_SECTION: ClassVar[str] = "compare"   # its keys in console/ui/keymap.py
    BINDINGS: ClassVar[list[BindingType]] = list(bindings("compare"))

    def __init__(self, measure: bool = True) -> None:
        super().__init__()
        self.measure = measure
        self.measurer = Measurer()
        self.rows: list[Row] = []
        self.measured = 0   # rounds of scrapes done (tests wait on it)
        self.narrow: bool | None = None   # the layout the table has (None: no columns yet)

    def compose(self) -> ComposeResult:
        with Vertical(id="compare-box", classes="dialog"):
            yield Static("Served drafters, as vLLM measured them", id="compare-title")
            yield TextTable(id="compare-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="compare-detail")
            yield Static("", id="compare-status")
        yield Footer()   # its own keys: the Checkpoints pane's footer below is not for it

    def on_mount(self) -> None:
        self.redraw()
        if self.measure:
            self.set_interval(MEASURE_EVERY_S, self.scrape)
            self.scrape()

    def on_resize(self) -> None:
        if (self.size.width < NARROW) != self.narrow:
            self.redraw()

    def redraw(self) -> None:
        journal = load()
        self.rows = table_of(journal)
        t = self.query_one(DataTable)
        narrow = self.size.width < NARROW
        t.clear(columns=narrow != self.narrow)
        if narrow != self.narrow:
            t.add_columns(*LAYOUTS[narrow][4])
            self.narrow = narrow
        for r in self.rows:   # no row keys: a run has a row per version and per replay
            t.add_row(*cells(r, narrow))
        self.show_detail()
        errors = [f"{r.run_id}: {r.error}" for r in self.rows if r.error]
        status = (f"{len(self.rows)} serving session{'s' if len(self.rows) != 1 else ''}; "
                  "acceptance length = 1 + accepted / drafts; ! marks a row with a note")
        if not self.rows:
            status = "no serving sessions yet: `v` on a checkpoint serves it in vLLM"
        if (said := journal.notice()) is not None:
            status += f"\n{said}"
        self.query_one("#compare-status", Static).update(
            plain(status + ("\n" + "; ".join(errors[:2]) if errors else "")))

    def show_detail(self) -> None:
        t = self.query_one(DataTable)
        row = t.cursor_row
        self.query_one("#compare-detail", Static).update(
            plain(detail(self.rows[row]) if 0 <= row < len(self.rows) else ""))

    def on_data_table_row_highlighted(self) -> None:
        self.show_detail()

    def action_refresh(self) -> None:
        self.scrape(say=True)

    @work(exclusive=True, group="compare-measure", exit_on_error=False)
    async def scrape(self, say: bool = False) -> None:
        pool: Any = services(self).pool
        recorded = sessions()
        running = 0
        for s in recorded:
            if s.host not in pool.hosts:
                continue
            try:
                host = await pool.ensure(s.host)
                recs = await list_runs(host, s.run_id)
                if recs and recs[0].status == RunStatus.RUNNING:
                    running += 1
                    await self.measurer.measure(s, host)
            except ConsoleError:
                continue  # the host's state shows in the hosts list; the row keeps its figures
        self.measured += 1
        self.redraw()
        if say and not running:
            self.notify("Nothing to measure: " + (
                "no serving session is recorded (`v` on a checkpoint serves one)"
                if not recorded else f"none of the {len(recorded)} recorded serving sessions "
                "is running on a reachable host (the table shows what was recorded)"),
                severity="warning")

    def action_close(self) -> None:
        self.dismiss(None)
