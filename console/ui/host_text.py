"""What a host sent, for a widget: text, never markup.

A run id, a path, a log line or a host's stderr put inside a markup string is read as markup:
`[/b]` ended the app with a MarkupError, and a folder named `[@click=app.quit]x` quit it when
clicked. Widgets get host text as Textual `Content` or rich `Text`, made here, with control
characters shown as `^X` (console/text.py): `plain(text)` for a string on its own, `markup(
template, name=value)` for our markup around host values (Textual substitutes `$name` as text),
`cell(value)` for a DataTable cell.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.content import Content

from console.text import terminal_text


def plain(text: str) -> Content:
    """text shown as written (no markup), its control characters visible."""
    return Content(terminal_text(text))


def markup(template: str, **values: object) -> Content:
    """Our markup `template` with each `$name` replaced by the text of values[name]: the
    template's tags apply, nothing in a value is read as markup."""
    return Content.from_markup(template, **{k: terminal_text(str(v)) for k, v in values.items()})


def cell(value: Any) -> Any:
    """A DataTable cell: a str becomes Text (a DataTable reads a str as markup); Text, Content
    and numbers stay as they are."""
    return Text(terminal_text(value)) if isinstance(value, str) else value
