"""The log view: a virtual scroll over a LogModel. Only the visible rows are rendered, so the cost
of a redraw does not depend on how many lines the model holds; `sync()` (called by the pane at
most a few times a second) picks up everything added since the last call in one refresh.

Following: the view sticks to the newest line; scrolling up (or jumping to an error) pauses it,
and `f` / End resume. Error and warning lines and filter matches are coloured through component
classes (theme variables in themes/logs.tcss)."""

from __future__ import annotations

from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from console.log_model import LogModel, severity

DISPLAY_LIMIT = 2000   # characters of one line drawn (the model keeps the whole line)


class LogView(ScrollView, can_focus=True):
    """Lines of a LogModel, virtual-scrolled."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "log-view--error", "log-view--warning", "log-view--match", "log-view--cursor",
    }
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "move(-1)", "Up", show=False),
        Binding("down,j", "move(1)", "Down", show=False),
        Binding("pageup", "move(-20)", "Page up", show=False),
        Binding("pagedown", "move(20)", "Page down", show=False),
        Binding("home", "home", "Top", show=False),
        Binding("end", "end", "Follow", show=False),
    ]

    following: reactive[bool] = reactive(True)
    cursor: reactive[int] = reactive(-1)   # view row of the highlighted line (-1: none)

    class FollowChanged(Message):
        """Follow mode was switched on or off (by a key or by scrolling)."""

        def __init__(self, following: bool) -> None:
            super().__init__()
            self.following = following

    def __init__(self, model: LogModel, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.model = model
        self._seen = -1

    # -- updates (from the pane's timer) ------------------------------------------------------
    def sync(self, force: bool = False) -> None:
        """Take in what the model gained since the last call: one refresh however many lines."""
        if self.model.version == self._seen and not force:
            return
        self._seen = self.model.version
        rows = self.model.visible()
        self.virtual_size = Size(0, rows)  # no horizontal scroll: long lines are cut
        if self.following:
            self.cursor = rows - 1
            self.scroll_to(y=max(0, rows - self.size.height), animate=False, immediate=True)
        self.refresh()

    # -- drawing --------------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row = scroll_y + y
        width = self.size.width
        base = self.rich_style
        entry = self.model.at(row)
        if entry is None:
            return Strip.blank(width, base)
        text = Text(entry.text[:DISPLAY_LIMIT], style=base, no_wrap=True, end="")
        level = severity(entry.text)
        if level:
            text.stylize(self.get_component_rich_style(f"log-view--{level}", partial=True))
        if self.model.query:
            self._highlight(text, self.model.query)
        if row == self.cursor and not self.following:
            text.stylize(self.get_component_rich_style("log-view--cursor", partial=True))
        segments = [Segment(s.text, s.style) for s in text.render(self.app.console)]
        strip = Strip(segments).crop_extend(scroll_x, scroll_x + width, base)
        return strip.apply_offsets(scroll_x, row)

    def _highlight(self, text: Text, query: str) -> None:
        style: Style = self.get_component_rich_style("log-view--match", partial=True)
        low, q, start = text.plain.lower(), query.lower(), 0
        while (i := low.find(q, start)) >= 0:
            text.stylize(style, i, i + len(q))
            start = i + len(q)

    # -- moving ---------------------------------------------------------------------------------
    def set_following(self, on: bool) -> None:
        if on != self.following:
            self.following = on
            self.post_message(self.FollowChanged(on))
        if on:
            self.sync(force=True)
        else:
            self.refresh()

    def go_to(self, row: int) -> None:
        """Pause following and put row in view, highlighted."""
        self.set_following(False)
        self.cursor = max(0, min(row, self.model.visible() - 1))
        top = self.cursor - self.size.height // 2
        self.scroll_to(y=max(0, top), animate=False, immediate=True)
        self.refresh()

    def action_move(self, delta: int) -> None:
        if self.following:
            self.cursor = self.model.visible() - 1
        self.set_following(False)
        self.cursor = max(0, min(self.cursor + delta, self.model.visible() - 1))
        if self.cursor < self.scroll_offset.y:
            self.scroll_to(y=self.cursor, animate=False, immediate=True)
        elif self.cursor >= self.scroll_offset.y + self.size.height:
            self.scroll_to(y=self.cursor - self.size.height + 1, animate=False, immediate=True)
        self.refresh()

    def action_home(self) -> None:
        self.go_to(0)

    def action_end(self) -> None:
        self.set_following(True)

    def on_mouse_scroll_up(self, _event: object) -> None:
        self.set_following(False)  # reading back pauses the tail
