"""Textual's key footer, rebuilt only when the keys it shows change.

The stock footer re-mounts all its keys on every bindings signal, and a pane switch sends
several (focus leaving, focus arriving, the tab's own): each re-mount restyles every key and
lays the screen out again. Here the signals of one refresh are folded into one check, and the
keys are rebuilt only if what they show differs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.widgets import Footer as _Footer

if TYPE_CHECKING:
    from textual.screen import Screen


class Footer(_Footer):
    """The key footer (same look and behaviour), without redundant rebuilds."""

    _pending = False
    _shown: tuple[object, ...] | None = None

    def bindings_changed(self, screen: Screen) -> None:
        self._bindings_ready = True
        if not screen.app.app_focus:
            return
        if self.is_attached and screen is self.screen and not self._pending:
            self._pending = True
            self.call_after_refresh(self._rebuild_if_changed)

    def _keys(self) -> tuple[object, ...]:
        """Everything compose() reads, as one comparable value."""
        app = self.app
        return (self.show_command_palette, tuple(
            (binding, app.get_key_display(binding), enabled, tooltip)
            for _node, binding, enabled, tooltip in self.screen.active_bindings.values()))

    async def _rebuild_if_changed(self) -> None:
        self._pending = False
        keys = self._keys()
        if keys != self._shown:
            self._shown = keys
            await self.recompose()
