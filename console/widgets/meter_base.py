"""MeterWidget: the base of the widgets that draw meters as text (GPU table and detail, host
strip, fleet, log charts). It declares the shared component classes, so one block of
themes/meters.tcss colours all of them from theme variables."""

from __future__ import annotations

from typing import ClassVar

from rich.style import Style
from textual.widget import Widget


class MeterWidget(Widget):
    """A widget that renders Rich text coloured by the `meter--*` component classes."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "meter--low", "meter--mid", "meter--high",   # a value's level (bars, numbers)
        "meter--empty",                              # the unfilled part of a bar
        "meter--stale",                              # data too old to trust: greyed
        "meter--alert",                              # STALE / LOST / error tags
        "meter--label", "meter--header",             # field names, column headers
        "meter--spark", "meter--spark2",             # history lines (two series)
        "meter--cursor",                             # the selected row
    }

    def mstyle(self, name: str) -> Style:
        """The Rich style of component class `meter--<name>` (only what the theme sets)."""
        return self.get_component_rich_style(f"meter--{name}", partial=True)
