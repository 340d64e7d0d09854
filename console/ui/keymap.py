"""Every key of the console, declared once: which key, which action, its label, where it shows.

The panes' and screens' BINDINGS, the key footer (via those bindings), `?` help
(dialogs/help.py) and the command palette (commands_palette.py) are all built from KEYS; no
module finds keys by looking into screen classes. A key is bound on a class in a section: the
section is where help lists it and where the palette runs it (a pane's tab, or a screen); `on`
names the widget class that holds the binding (empty: the pane or screen itself), so a key a
widget handles (the log view's arrows) is still listed under its pane.

Data only: this module imports nothing of the console, so anything may import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True)
class Key:
    keys: str              # Textual key names, comma separated ("up,k")
    action: str            # the action the binding runs on its class
    label: str             # footer and palette label
    section: str           # a SECTIONS id: where help lists it and the palette runs it
    on: str = ""           # class name that binds it inside the section ("" = the section's)
    footer: bool = True    # shown in the key footer (False: a cursor key, or one whose
                           # label another shown key already says; tests hold it to that)
    palette: bool = True   # a palette command ("Runs: Launch")
    help: str = ""         # the longer help text (the label when empty)
    bound: bool = True     # False: Textual's own key (tab, ctrl+p), listed in help only
    display: str = ""      # how the footer shows the key ("" = Textual's own rendering)
    priority: bool = False  # checked before the focused widget's and past a modal screen
    short: str = ""        # the label a narrow (80-column) footer shows ("" = the label)

    @property
    def text(self) -> str:
        """What help says the key does: its help, else its label in lower case."""
        return self.help or self.label[0].lower() + self.label[1:]


# (tab id, title) of the main screen's panes, in tab order: keys 1..6 select them
PANES: list[tuple[str, str]] = [
    ("gpu", "GPUs"),
    ("overview", "Host"),
    ("fleet", "Fleet"),
    ("logs", "Logs"),
    ("runs", "Runs"),
    ("checkpoints", "Checkpoints"),
]

# section id -> help heading, in help order
SECTIONS: dict[str, str] = {
    "main": "Everywhere",
    **{tab_id: f"{title} pane" for tab_id, title in PANES},
    "run_detail": "Run detail (enter on a run)",
    "convert": "Convert dialog (c on a checkpoint)",
    "serve": "Serve dialog (v on a checkpoint)",
    "evaluate": "Evaluate dialog (e on a checkpoint)",
    "compare": "Compare (m on the Checkpoints pane)",
    "confirm": "Questions",
    "help": "This help",
}

KEYS: list[Key] = [
    # -- the main screen --------------------------------------------------------------------
    # bound on the app, with priority (a modal screen hides the app's other bindings): q quits
    # from every screen and dialog, except where a focused Input takes it as a letter
    Key("q", "quit", "Quit", "main", on="Eagle3App", palette=False, priority=True,
        help="quit (runs keep running on their hosts), from any screen or dialog; in a text "
             "field it is the letter q"),
    Key("question_mark", "app.help", "Help", "main", palette=False,
        help="every key, by pane (this screen)"),
    *[Key(str(n), f"show_pane('{tab_id}')", title, "main", footer=False, palette=False,
          help=f"show the {title} pane") for n, (tab_id, title) in enumerate(PANES, start=1)],
    Key("ctrl+p", "command_palette", "Palette", "main", bound=False,
        help="command palette: every action by name, and the themes"),
    # one footer entry for the pair ("[ ] Host"): the footer is short of columns at 80
    Key("left_square_bracket", "cycle_host(-1)", "Host", "main", palette=False, display="[ ]",
        help="switch host: the previous one (in the hosts list's order)"),
    Key("right_square_bracket", "cycle_host(1)", "Next host", "main", footer=False,
        palette=False, help="switch host: the next one"),
    Key("K", "trust_host", "Trust host key", "main", footer=False,
        help="trust the selected host's SSH key: shows its fingerprint, asks, then adds it to "
             "known_hosts (as `eagle3-console trust`)"),
    Key("shift+tab", "", "Hosts", "main", bound=False,
        help="focus the Hosts list (or click a host there)"),
    Key("tab", "", "Next", "main", bound=False, help="next widget"),
    Key("ctrl+q", "", "Quit", "main", bound=False, help="quit"),
    # -- GPUs --------------------------------------------------------------------------------
    Key("d", "toggle_detail", "GPU detail", "gpu",
        help="detail view of the selected GPU (clocks, PCIe, ECC)"),
    # on the pane, not the process table: the footer shows it whichever table has the focus
    Key("s", "cycle_sort", "Sort", "gpu",
        help="sort the process table by its next column"),
    Key("up,k", "move(-1)", "GPU up", "gpu", on="GpuTable", footer=False, palette=False,
        help="previous GPU"),
    Key("down,j", "move(1)", "GPU down", "gpu", on="GpuTable", footer=False, palette=False,
        help="next GPU"),
    # -- Host --------------------------------------------------------------------------------
    Key("r", "refresh_report", "Refresh", "overview", help="run doctor on the host again"),
    # -- Logs --------------------------------------------------------------------------------
    Key("f", "toggle_follow", "Follow/pause", "logs", help="follow / pause the log"),
    Key("slash", "filter", "Filter", "logs",
        help="filter: lines containing… (enter keeps it, esc clears)"),
    Key("e", "error(1)", "Next error", "logs"),
    Key("E", "error(-1)", "Prev error", "logs"),
    Key("l", "next_log", "Next log", "logs", help="next configured log file"),
    Key("up,k", "move(-1)", "Up", "logs", on="LogView", footer=False, palette=False,
        help="line up (pauses following)"),
    Key("down,j", "move(1)", "Down", "logs", on="LogView", footer=False, palette=False,
        help="line down"),
    Key("pageup", "move(-20)", "Page up", "logs", on="LogView", footer=False, palette=False),
    Key("pagedown", "move(20)", "Page down", "logs", on="LogView", footer=False,
        palette=False),
    Key("left", "pan(-1)", "Left", "logs", on="LogView", footer=False, palette=False,
        help="pan left along long lines (half a screen)"),
    Key("right", "pan(1)", "Right", "logs", on="LogView", footer=False, palette=False,
        help="pan right: the rest of a line longer than the screen"),
    Key("home", "home", "Top", "logs", on="LogView", footer=False, palette=False),
    Key("end", "end", "Follow", "logs", on="LogView", footer=False, palette=False,
        help="back to following"),
    # -- Runs --------------------------------------------------------------------------------
    Key("p", "push", "Push", "runs",
        help="push the engine and the host's sync sets (files and bytes sent)"),
    Key("t", "launch", "Launch", "runs",
        help="launch the selected profile (pushes first; asks before a second copy)"),
    Key("x", "stop", "Stop run", "runs", short="Stop",
        help="stop the selected run (SIGTERM to its process group, SIGKILL later)"),
    Key("enter", "open", "Open run", "runs", short="Open",
        help="open the run (on a profile: its newest run)"),
    # the focused table's enter is the one the footer shows (once: one key, one label); on a
    # profile it says what it opens, so the footer tells the two tables apart
    Key("enter", "select_cursor", "Newest run", "runs", on="ProfileTable", palette=False,
        short="Newest",
        help="open the profile's newest run"),
    Key("enter", "select_cursor", "Open run", "runs", on="RunTable", palette=False,
        short="Open",
        help="open the run under the cursor"),
    Key("r", "refresh", "Refresh", "runs", help="re-read the host's run registry"),
    Key("R", "resume", "Resume", "runs",
        help="start the selected stopped or failed run again in its run directory with "
             "--resume (engine train runs)"),
    # tab stays in the pane (it left for the hosts list and the tabs, whose footer has only
    # q and ?): the profiles table, the runs table, and back
    Key("tab", "next_table", "Tables", "runs", palette=False, short="Table",
        help="the other table: profiles / runs (enter opens what its cursor is on)"),
    Key("P", "prune", "Prune", "runs",
        help="forget the host's ended runs (asks first): their records and logs are deleted, "
             "files they wrote (out/) stay; nothing is signalled"),
    # -- Checkpoints -------------------------------------------------------------------------
    # not in the footer: `i Inspect` is, and one label is shown once
    Key("enter", "select_cursor", "Inspect", "checkpoints", on="CheckpointTable",
        footer=False, palette=False,
        help="inspect the selected checkpoint (moving the cursor inspects it too)"),
    Key("i", "inspect", "Inspect", "checkpoints", help="inspect the selected checkpoint"),
    Key("c", "convert", "Convert", "checkpoints",
        help="convert (style, destination, verifier, dtype)"),
    Key("v", "serve", "Serve", "checkpoints",
        help="serve it in vLLM (verifier, TP, k, port, extra args)"),
    Key("m", "compare", "Compare", "checkpoints",
        help="compare the served drafters by vLLM's measured acceptance"),
    Key("e", "evaluate", "Evaluate", "checkpoints", short="Eval",
        help="measure its acceptance on held-out data on the host (engine eval: target, data, "
             "k; transformers or vLLM's engine)"),
    Key("w", "swap", "Swap in", "checkpoints", short="Swap",
        help="swap it into the host's running vLLM server (no restart; checked first)"),
    Key("r", "refresh", "Rescan", "checkpoints", short="Scan",
        help="scan the host for checkpoints again"),
    # -- screens on top ----------------------------------------------------------------------
    Key("escape", "close", "Back", "run_detail",
        help="back to the runs (the run keeps being followed)"),
    Key("x", "stop", "Stop run", "run_detail", short="Stop"),
    Key("question_mark", "app.help", "Help", "run_detail", palette=False),
    Key("escape", "cancel", "Cancel", "convert"),
    Key("ctrl+s", "convert", "Convert", "convert"),
    Key("escape", "cancel", "Cancel", "serve"),
    Key("ctrl+s", "serve", "Serve", "serve"),
    Key("escape", "cancel", "Cancel", "evaluate"),
    Key("ctrl+s", "evaluate", "Evaluate", "evaluate"),
    Key("escape", "close", "Close", "compare"),
    Key("r", "refresh", "Measure now", "compare"),
    Key("y", "answer(True)", "Yes", "confirm"),
    Key("n", "answer(False)", "No", "confirm"),
    Key("escape", "answer(False)", "Cancel", "confirm"),
    Key("escape,question_mark", "close", "Close", "help"),
]


def short_labels() -> dict[str, str]:
    """label -> what a narrow footer shows instead (one short form per label)."""
    out: dict[str, str] = {}
    for k in KEYS:
        if k.short:
            assert out.setdefault(k.label, k.short) == k.short, k.label
    return out


SHORT = short_labels()


def keys_of(section: str, on: str = "") -> list[Key]:
    """The keys bound on one class: a section's own (on="") or a widget's inside it."""
    return [k for k in KEYS if k.section == section and k.on == on and k.bound]


def bindings(section: str, on: str = "") -> list[Binding]:
    """Textual bindings of one class, from KEYS (what the class puts in BINDINGS)."""
    return [Binding(k.keys, k.action, k.label, show=k.footer, key_display=k.display or None,
                    priority=k.priority) for k in keys_of(section, on)]


def key_display(keys: str) -> str:
    """`question_mark` -> `?`, `up,k` -> `up k`: keys as help shows them."""
    names = {"question_mark": "?", "escape": "esc", "slash": "/", "pageup": "pgup",
             "left_square_bracket": "[", "right_square_bracket": "]",
             "pagedown": "pgdn", "left": "←", "right": "→"}
    return " ".join(names.get(k.strip(), k.strip()) for k in keys.split(","))
