"""TextTable: a frame drawn between a cell's update and the table's measuring of it does not
keep the old column widths on screen."""

from __future__ import annotations

from textual.app import App, ComposeResult

from console.widgets.text_table import TextTable


class TableApp(App[None]):
    def compose(self) -> ComposeResult:
        yield TextTable()


async def test_a_wider_cell_redraws_every_row_at_the_new_width() -> None:
    app = TableApp()
    async with app.run_test(size=(60, 8)) as pilot:
        table = app.query_one(TextTable)
        table.add_column("A", key="A")
        table.add_column("B", key="B")
        table.add_row("x", "y", key="r1")
        table.add_row("x", "y", key="r2")
        await pilot.pause()
        table.update_cell("r2", "A", "a much longer value", update_width=True)
        # a frame drawn before the table is idle again caches its rows at the old widths
        assert [table.render_line(y).text.split()[0] for y in range(3)] == ["A", "x", "a"]
        await pilot.pause()
        lines = [table.render_line(y).text for y in range(3)]
        assert [line.index(b) for line, b in zip(lines, "Byy", strict=True)] == [22, 22, 22], lines
        assert "a much longer value" in lines[2]
