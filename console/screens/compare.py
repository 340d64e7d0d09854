"""The comparison table: one row per serving session, newest first (drafter, provenance, k) with
what vLLM measured while serving it (acceptance length, per-position acceptance, throughput, time
watched). Below 100 columns it keeps drafter, provenance, k, acceptance length and the first
three positions, so an 80x24 terminal shows the number that compares drafters.

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

from console.checkpoints.compare import Measurer, Row, table
from console.checkpoints.serve import read_sessions
from console.errors import ConsoleError
from console.runs.service import list_runs
from console.scheduler.run_status import RunStatus
from console.ui.host_text import plain
from console.ui.keymap import bindings
from console.ui.services import services
from console.widgets.footer import Footer
from console.widgets.text_table import TextTable

MEASURE_EVERY_S = 5.0
COLUMNS = ("Drafter", "Provenance", "k", "Acc len", "Per position", "Gen tok/s", "Watched")
NARROW = 100   # below this many columns (80x24) the table keeps what compares drafters
# (drafter, provenance, positions shown) widths, and the columns kept, wide and narrow
LAYOUTS = {False: (32, 30, 4, COLUMNS), True: (17, 20, 3, COLUMNS[:5])}


def cells(r: Row, narrow: bool = False) -> tuple[str, ...]:
    """One row; on a narrow screen shorter names, three positions, no throughput or time."""
    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    name_w, prov_w, positions, columns = LAYOUTS[narrow]
    name = r.drafter if len(r.drafter) <= name_w else "…" + r.drafter[1 - name_w:]
    prov = r.provenance if len(r.provenance) <= prov_w else r.provenance[:prov_w - 1] + "…"
    row = (name, prov or "-", "-" if r.k is None else str(r.k),
           f(r.acceptance_length, ".2f"),
           " ".join(f"{p:.2f}" for p in r.per_position[:positions]) or "-",
           f(r.generation_tokens_per_s, ".1f"), f"{r.seconds:.0f} s" if r.seconds else "-")
    return row[:len(columns)]


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
            yield Static("", id="compare-status")
        yield Footer()   # its own keys: the Checkpoints pane's footer below is not for it

    def on_mount(self) -> None:
        self.redraw()
        if self.measure:
            self.set_interval(MEASURE_EVERY_S, self.action_refresh)
            self.action_refresh()

    def on_resize(self) -> None:
        if (self.size.width < NARROW) != self.narrow:
            self.redraw()

    def redraw(self) -> None:
        self.rows = table()
        t = self.query_one(DataTable)
        narrow = self.size.width < NARROW
        t.clear(columns=narrow != self.narrow)
        if narrow != self.narrow:
            t.add_columns(*LAYOUTS[narrow][3])
            self.narrow = narrow
        for r in self.rows:
            t.add_row(*cells(r, narrow), key=r.run_id)
        errors = [f"{r.run_id}: {r.error}" for r in self.rows if r.error]
        status = (f"{len(self.rows)} serving session{'s' if len(self.rows) != 1 else ''}; "
                  "acceptance length = 1 + accepted / drafts since the server started")
        if not self.rows:
            status = "no serving sessions yet: `v` on a checkpoint serves it in vLLM"
        self.query_one("#compare-status", Static).update(
            plain(status + ("\n" + "; ".join(errors[:2]) if errors else "")))

    def action_refresh(self) -> None:
        self.scrape()

    @work(exclusive=True, group="compare-measure", exit_on_error=False)
    async def scrape(self) -> None:
        pool: Any = services(self).pool
        for s in read_sessions():
            name = str(s.get("host"))
            if name not in pool.hosts:
                continue
            try:
                host = await pool.ensure(name)
                recs = await list_runs(host, str(s.get("run_id")))
                if recs and recs[0].status == RunStatus.RUNNING:
                    await self.measurer.measure(s, host)
            except ConsoleError:
                continue  # the host's state shows in the hosts list; the row keeps its figures
        self.measured += 1
        self.redraw()

    def action_close(self) -> None:
        self.dismiss(None)
