"""The log view: a virtual scroll over a LogModel. Only the visible rows are rendered, so the cost
of a redraw does not depend on how many lines the model holds; `sync()` (called by the pane at
most a few times a second) picks up everything added since the last call in one refresh.

Following: the view sticks to the newest line; scrolling up (or jumping to an error) pauses it,
and `f` / End resume. A line longer than the view is cut at its edge; left / right pan the view
half its width, as far as the longest line (a vLLM `SpecDecoding metrics` line is 260 columns,
its acceptance figures at the end). Error and warning lines and filter matches are coloured
through component classes (theme variables in themes/logs.tcss)."""

from __future__ import annotations

from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.binding import BindingType
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from console.logs.log_model import LogModel
from console.ui.keymap import bindings


class LogView(ScrollView, can_focus=True):
    """Lines of a LogModel, virtual-scrolled."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "log-view--error", "log-view--warning", "log-view--match", "log-view--cursor",
    }
    BINDINGS: ClassVar[list[BindingType]] = list(bindings("logs", on="LogView"))

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
        # rendered lines by (seq, width, pan, query, highlighted): following a busy log redraws
        # mostly lines already drawn one row lower; a few screens' worth is all that is reused
        # (more only held memory: a thousand strips was a megabyte or two)
        self._strips: LRUCache[tuple[int, int, int, str, bool], Strip] = LRUCache(256)
        self._style_cache: dict[str, Style] = {}

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()  # a theme change recolours every line
        self._style_cache.clear()

    # -- updates (from the pane's timer) ------------------------------------------------------
    def sync(self, force: bool = False) -> None:
        """Take in what the model gained since the last call: one refresh however many lines."""
        if self.model.version == self._seen and not force:
            return
        self._seen = self.model.version
        rows = self.model.visible()
        self._set_rows(rows, self.model.widest)
        if self.following:
            self.cursor = rows - 1
            self._to_end()
        self.refresh()

    def _to_end(self) -> None:
        """Show the newest line. Forced: Textual drops a scroll while the view shows no
        scrollbar (rows that just outgrew it, before _set_rows updated the scrollbar, left
        the view on line 1)."""
        self.scroll_to(y=self.max_scroll_y, animate=False, immediate=True, force=True)

    def on_resize(self) -> None:
        # the view changes height (the filter box opens, the terminal resizes): keep the end
        if self.following:
            self._to_end()

    def _set_rows(self, rows: int, widest: int = 0) -> None:
        """Grow the scroll range. Assigning virtual_size makes Textual lay out the whole screen;
        while the scrollbar is shown before and after (and the width, so the horizontal one,
        is the same), updating it alone is enough. Either way the scrollbar is updated at once,
        so that a scroll to the end right after lands, and its thumb with it. The width is the
        longest line's, plus a tab's expansion: how far left / right pan."""
        new = Size(widest + 8 if widest > self.size.width else 0, rows)
        if new == self.virtual_size:
            return
        height = self.size.height
        if self.virtual_size.height > height and rows > height \
                and new.width == self.virtual_size.width:
            self.set_reactive(LogView.virtual_size, new)
        else:
            self.virtual_size = new
        self._scroll_update(new)

    # -- drawing --------------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row = scroll_y + y
        width = self.size.width
        entry = self.model.at(row)
        if entry is None:
            return Strip.blank(width, self._style("base"))
        key = (entry.seq, width, scroll_x, self.model.query,
               row == self.cursor and not self.following)
        strip = self._strips.get(key)
        if strip is None:
            strip = self._render_entry(entry.text, entry.level, key[4], width, scroll_x)
            self._strips[key] = strip
        return strip.apply_offsets(scroll_x, row)

    def _style(self, name: str) -> Style:
        """The widget's own style ("base") or a component's, cached until the styles change
        (at a thousand lines a second every visible line is new on every redraw)."""
        style = self._style_cache.get(name)
        if style is None:
            style = self.rich_style if name == "base" else self.get_component_rich_style(
                f"log-view--{name}", partial=True)
            self._style_cache[name] = style
        return style

    def _render_entry(self, line: str, level: str, highlighted: bool, width: int,
                      pan: int = 0) -> Strip:
        """One line as segments, built directly (no Rich layout: lines are cut at the view's
        edge, `pan` columns in, never wrapped)."""
        text = line[:pan + max(width, 1) * 2 + 8].expandtabs(4)
        style = self._style("base")
        if level:
            style += self._style(level)
        if highlighted:
            style += self._style("cursor")
        base = self._style("base")
        if not self.model.query and text.isascii() and text.isprintable():
            # one cell per character: cut and pad here, one Strip instead of two
            text = text[pan:pan + width]
            segments = [Segment(text, style)] if text else []
            if len(text) < width:
                segments.append(Segment(" " * (width - len(text)), base))
            return Strip(segments, width)
        segments = [Segment(text, style)]
        if self.model.query:
            segments = self._highlight(text, self.model.query, style)
        return Strip(segments).crop_extend(pan, pan + width, base)

    def _highlight(self, text: str, query: str, style: Style) -> list[Segment]:
        match = style + self._style("match")
        low, q, start, out = text.lower(), query.lower(), 0, []
        while (i := low.find(q, start)) >= 0:
            out += [Segment(text[start:i], style), Segment(text[i:i + len(q)], match)]
            start = i + len(q)
        out.append(Segment(text[start:], style))
        return [s for s in out if s.text]

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

    def action_pan(self, direction: int) -> None:
        """Left / right: half the view's width along long lines (following goes on)."""
        step = max(1, self.size.width // 2)
        # forced: no horizontal scrollbar (themes/logs.tcss), the status line says where it is
        self.scroll_to(x=max(0, self.scroll_offset.x + direction * step), animate=False,
                       immediate=True, force=True)
        self.refresh()

    def action_home(self) -> None:
        self.go_to(0)

    def action_end(self) -> None:
        self.set_following(True)

    def on_mouse_scroll_up(self, _event: object) -> None:
        self.set_following(False)  # reading back pauses the tail
