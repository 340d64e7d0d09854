"""The main screen: hosts on the left, the panes of the selected host as tabs, key footer.

`[` / `]` switch to the previous / next host from any pane (the hosts list is there for the
mouse). Below NARROW columns the hosts list is hidden (the `-narrow` class, themes/base.tcss):
the header names the selected host and its state, as it does at any width."""

from __future__ import annotations

import contextlib
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal
from textual.reactive import Reactive
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Header, TabbedContent, TabPane

from console.dialogs.confirm import ConfirmScreen
from console.errors import ConsoleError
from console.hosts.host import HostView
from console.hosts.hostkeys import offered_key, record
from console.panes.checkpoints import CheckpointsPane
from console.panes.fleet import FleetPane
from console.panes.gpu import GpuPane
from console.panes.logs import LogsPane
from console.panes.overview import OverviewPane
from console.panes.runs import RunsPane
from console.screens.run_detail import RunDetailScreen
from console.ui.keymap import PANES as PANE_TITLES
from console.ui.keymap import bindings
from console.ui.messages import HostSelected, HostStateChanged, OpenRun
from console.ui.services import services
from console.widgets.footer import NARROW, Footer
from console.widgets.host_list import HostList, state_text

_CLASSES: dict[str, type] = {
    "gpu": GpuPane, "overview": OverviewPane, "fleet": FleetPane, "logs": LogsPane,
    "runs": RunsPane, "checkpoints": CheckpointsPane,
}
# (tab id, title, pane class) in tab order (console/ui/keymap.py's PANES): keys 1-6 select them
PANES: list[tuple[str, str, type]] = [(i, title, _CLASSES[i]) for i, title in PANE_TITLES]


class MainScreen(Screen):
    """Hosts list + tabbed panes."""

    # Screen repaints all of itself whenever focus moves; what focus changes (:focus styles,
    # the footer's keys, the widgets' own cursors) repaints itself, so a pane switch need not
    # draw the whole screen twice
    focused: Reactive[Widget | None] = Reactive(None, repaint=False)
    KEY_SECTION: ClassVar[str] = "main"   # its keys in console/ui/keymap.py
    BINDINGS: ClassVar[list[BindingType]] = list(bindings("main"))
    # below NARROW columns the hosts list gives its 24 columns to the panes
    HORIZONTAL_BREAKPOINTS = [
        (0, "-narrow"), (NARROW, "-wide")]
    # below 30 lines (80x24) the panes drop their spacer lines (themes/*.tcss)
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]

    def __init__(self, hosts: list[str], selected: str,
                 notes: dict[str, str] | None = None) -> None:
        super().__init__()
        self.host_names = hosts
        self.selected = selected
        self.notes = notes or {}   # host -> "(this machine)" where it has no ssh

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            yield HostList(self.host_names, self.notes, id="hosts")
            with TabbedContent(id="panes"):
                for tab_id, title, cls in PANES:
                    with TabPane(title, id=f"tab-{tab_id}"):
                        yield cls(id=f"pane-{tab_id}")
        yield Footer()

    def on_mount(self) -> None:
        hosts = self.query_one(HostList)
        hosts.index = self.host_names.index(self.selected)
        self._show_states()  # states set before this screen existed
        self._select(self.selected)
        # a silent host's "no answer for N s" counts up without a state change
        self.set_interval(1.0, self._show_states)
        # keys go to the pane on screen from the start (hosts switch with [ and ]), not to the
        # hosts list, which is hidden on a narrow screen
        self.call_after_refresh(self._focus_shown_pane)

    def on_host_selected(self, message: HostSelected) -> None:
        if message.host != self.selected:
            self._select(message.host)

    def on_host_state_changed(self, message: HostStateChanged) -> None:
        view = services(self).pool.view(message.host)
        self.query_one(HostList).show_state(message.host, view)
        if message.host == self.selected:
            self._title(view)
            self.query_one(GpuPane).refresh_view()   # its state line says the same, now

    def _show_states(self) -> None:
        """Every host's state in the list and the header, from the pool's one view of it (read
        once: two reads a second boundary apart would say "no answer for 5 s" and "6 s")."""
        pool, hosts = services(self).pool, self.query_one(HostList)
        views = {name: pool.view(name) for name in self.host_names}
        for name, view in views.items():
            hosts.show_state(name, view)
        self._title(views.get(self.selected))

    def action_cycle_host(self, step: int) -> None:
        """`[` / `]`: the previous / next host, in the hosts list's order (wrapping)."""
        names = self.host_names
        if len(names) == 1:
            self.notify(f"{self.selected} is the only configured host: add [hosts.NAME] to the "
                        "config to switch between hosts", timeout=4)
            return
        host = names[(names.index(self.selected) + step) % len(names)]
        self.query_one(HostList).index = names.index(host)  # the list follows, quietly
        self._select(host)

    def action_trust_host(self) -> None:
        """K: the selected host's key, checked and trusted here as `trust` does."""
        self.trust_host(self.selected)

    @work(group="trust", exclusive=True, exit_on_error=False)
    async def trust_host(self, host: str) -> None:
        """Fetch the key the host presents, show its fingerprint, ask, and only on a yes add it
        to known_hosts (console/hosts/hostkeys.py); then connect again."""
        try:
            offer = await offered_key(services(self).config.hosts[host])
        except ConsoleError as e:   # this machine, unreachable, a changed key: why, as said
            self.notify(f"cannot trust {host}'s key: {e}", severity="error", timeout=15)
            return
        if offer.trusted:
            self.notify(f"{host}: {offer.fingerprint} is already trusted ({offer.file})")
            return
        yes = await self.app.push_screen_wait(ConfirmScreen(
            f"{offer.presents()}\n\nTrust it and add it to {offer.file}?", yes="Trust it"))
        if not yes:
            self.notify(f"{host}: not trusted; nothing written")
            return
        record(offer)
        self.notify(f"added {offer.name} to {offer.file}; connecting to {host}")
        with contextlib.suppress(ConsoleError):   # the pool says how that went
            await services(self).pool.ensure(host)

    def on_open_run(self, message: OpenRun) -> None:
        self.app.push_screen(RunDetailScreen(message.feed, message.pipeline))

    def action_show_pane(self, tab_id: str) -> None:
        self.query_one(TabbedContent).active = f"tab-{tab_id}"
        self._focus_pane(tab_id)

    def _focus_shown_pane(self) -> None:
        if self.focused is None or isinstance(self.focused, HostList):
            self._focus_pane(self.query_one(TabbedContent).active.removeprefix("tab-"))

    def _focus_pane(self, tab_id: str) -> None:
        """Keys go to the pane just shown: focus its first focusable widget, now, so the tab
        switch and the focus change are drawn in one frame. With nothing to focus, focus is
        dropped: a widget left focused in the old tab would pull its tab back."""
        pane = self.query_one(f"#pane-{tab_id}")
        target = next((w for w in [pane, *pane.query("*")] if w.focusable and w.display), None)
        self.set_focus(target)

    def _select(self, host: str) -> None:
        self.selected = host
        self._title()
        for tab_id, _title, _cls in PANES:
            self.query_one(f"#pane-{tab_id}").show_host(host)  # type: ignore[attr-defined]

    def _title(self, view: HostView | None = None) -> None:
        """The header's host line: `gpu1 ● connected` (all a narrow screen has of the list)."""
        if view is None:
            view = services(self).pool.view(self.selected)
        title = f"{self.selected} {state_text(view)}"
        if title != self.sub_title:
            self.sub_title = title
