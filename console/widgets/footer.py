"""Textual's key footer, relabelled in place when the keys it shows change.

The stock footer removes and re-mounts all its keys on every bindings signal, and a pane switch
sends several: each re-mount restyles every key and lays the screen out again, two or three
extra screen updates after the switch itself. Here the keys are compared first (nothing to do
when they are the same), and a different set relabels the key widgets already mounted, at once,
so the change is laid out in the same frame as the switch; keys left over are hidden, kept for
the next pane that has more. Only a footer that must grow, or one with grouped keys, is rebuilt
the stock way.

Below NARROW columns (an 80-column terminal) the footer is compact: less space between keys,
the palette key without its label, and no `q Quit` (q still quits; help lists it). At any width,
keys that would not fit get the key map's short labels (`Stop` for `Stop run`), and if that is
not enough `[ ] Host` goes (the header names the host; `[` and `]` still switch), so every key of
a pane and `? Help` fit."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from itertools import groupby

from rich.cells import cell_len
from textual import events
from textual.app import ComposeResult
from textual.binding import ActiveBinding, Binding
from textual.screen import Screen
from textual.widgets import Footer as _Footer
from textual.widgets._footer import FooterKey

from console.ui.keymap import SHORT

# what one key shows: key, key display, description, action, disabled, tooltip
Spec = tuple[str, str, str, str, bool, str]
NARROW = 100                       # columns: below this the main screen folds its hosts list
_NARROW_HIDDEN = {"quit", "app.quit"}   # actions a narrow footer leaves out
_SPARE = {"cycle_host(-1)"}              # left out where a pane's keys need the room


class Footer(_Footer):
    """The key footer (same look and behaviour), without the re-mounts."""

    _pending = False
    _shown: tuple[object, ...] | None = None
    _narrow = False

    def on_resize(self, event: events.Resize) -> None:
        narrow = event.size.width < NARROW
        if narrow != self._narrow:
            self._narrow = self.compact = narrow
            self.bindings_changed(self.screen)

    def bindings_changed(self, screen: Screen) -> None:
        self._bindings_ready = True
        if not screen.app.app_focus or not self.is_attached or screen is not self.screen:
            return
        keys = self._specs()
        if keys is not None and keys == self._shown:
            return
        if keys is not None and self._shown is not None and self._relabel(*keys):
            self._shown = keys
        elif not self._pending:
            self._pending = True
            self.call_after_refresh(self._rebuild)

    def compose(self) -> ComposeResult:
        """The stock keys, from _specs (so a narrow footer's rules hold from the start)."""
        specs = self._specs() if self._bindings_ready else None
        if specs is None:
            yield from super().compose()
            return
        keys, palette = specs
        for key, display, description, action, disabled, tooltip in keys:
            yield FooterKey(key, display, description, action, disabled=disabled,
                            tooltip=tooltip).data_bind(compact=_Footer.compact)
        if palette is not None:
            key, display, description, action, disabled, tooltip = palette
            yield FooterKey(key, display, description, action, classes="-command-palette",
                            disabled=disabled, tooltip=tooltip)

    async def _rebuild(self) -> None:
        self._pending = False
        keys = self._specs()
        if keys != self._shown or keys is None:
            self._shown = keys
            await self.recompose()

    def _specs(self) -> tuple[tuple[Spec, ...], Spec | None] | None:
        """The keys compose() would make (its rules), or None when it would group some."""
        app = self.app
        active = self.screen.active_bindings
        by_action: defaultdict[str, list[tuple[Binding, bool, str]]] = defaultdict(list)
        for _node, binding, enabled, tooltip in _app_keys_first(active.values(), app):
            if binding.show and not (self._narrow and binding.action in _NARROW_HIDDEN):
                by_action[binding.action].append((binding, enabled, tooltip))
        keys: list[Spec] = []
        for group, runs in groupby(by_action.values(), lambda bindings: bindings[0][0].group):
            same_group = list(runs)
            if group is not None and len(same_group) > 1:
                return None
            for bindings in same_group:
                binding, enabled, tooltip = bindings[0]
                keys.append((binding.key, app.get_key_display(binding), binding.description,
                             binding.action, not enabled, tooltip))
        palette: Spec | None = None
        if self.show_command_palette and app.ENABLE_COMMAND_PALETTE \
                and app.COMMAND_PALETTE_BINDING in active:
            _node, binding, enabled, _tooltip = active[app.COMMAND_PALETTE_BINDING]
            palette = (binding.key, app.get_key_display(binding),
                       "" if self._narrow else binding.description,
                       binding.action, not enabled, binding.tooltip or binding.description)
        keys = _fit(keys, palette, self.size.width or app.size.width, self._narrow)
        return tuple(keys), palette

    def _relabel(self, keys: tuple[Spec, ...], palette: Spec | None) -> bool:
        """Show keys on the mounted key widgets; False if there are too few (or others)."""
        pool: list[FooterKey] = []
        palette_key: FooterKey | None = None
        for child in self.children:
            if not isinstance(child, FooterKey):
                return False                      # a group or label: the stock rebuild
            if child.has_class("-command-palette"):
                palette_key = child
            else:
                pool.append(child)
        if len(keys) > len(pool) or (palette is None) != (palette_key is None):
            return False
        for widget, spec in zip(pool, keys, strict=False):
            _set_key(widget, spec)
        for widget in pool[len(keys):]:
            widget.display = False
        if palette_key is not None and palette is not None:
            _set_key(palette_key, palette)
        return True


def _app_keys_first(active: Iterable[ActiveBinding], app: object) -> list[ActiveBinding]:
    """The app's keys (q) before the screen's `?`, where its own q stood: `q Quit  ? Help`."""
    entries = list(active)
    own = [e for e in entries if e[0] is app]
    rest = [e for e in entries if e[0] is not app]
    at = next((i for i, e in enumerate(rest) if e[1].action == "app.help"), len(rest))
    return rest[:at] + own + rest[at:]


def _fit(keys: list[Spec], palette: Spec | None, width: int, compact: bool) -> list[Spec]:
    """The keys as they fit `width`: whole; else with the key map's short labels; else also
    without the spare ones (`[ ] Host`)."""
    def used(specs: list[Spec]) -> int:
        # a compact key: display, space, label and a column before the next; a wide one has a
        # column of padding each side instead
        cols = sum(cell_len(d) + cell_len(label) + (2 if compact else 3)
                   for _k, d, label, *_r in specs) - (1 if compact else 0)
        if palette is not None:
            cols += cell_len(palette[1]) + 2 + (cell_len(palette[2]) + 1 if palette[2] else 0)
        return cols

    if used(keys) <= width:
        return keys
    keys = [(k, d, SHORT.get(label, label), action, off, tip)
            for k, d, label, action, off, tip in keys]
    if used(keys) <= width:
        return keys
    return [k for k in keys if k[3] not in _SPARE]


def _set_key(widget: FooterKey, spec: Spec) -> None:
    key, key_display, description, action, disabled, tooltip = spec
    if (widget.key, widget.key_display, widget.description, widget.action,
            widget._disabled) != (key, key_display, description, action, disabled):
        widget.key, widget.key_display = key, key_display
        widget.description, widget.action = description, action
        widget._disabled = disabled                   # what FooterKey's click checks
        widget.set_class(disabled, "-disabled")
        widget.refresh(layout=True)                   # its width follows its text
    if widget.tooltip != (tooltip or None):
        widget.tooltip = tooltip or None
    widget.display = True
