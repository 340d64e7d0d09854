"""The unit loop (`make test-unit`: `pytest --unit`): the tests that start nothing, chosen by a
rule rather than by hand, and a guard that keeps the rule honest.

The rule: a test is left out when it is marked `slow`, `vllm`, `sshd` or `component`, when it
uses a fixture of COMPONENT_FIXTURES (directly or through another fixture), or when its code or
its fixtures' code, followed through the tests/ helpers they call, runs a Textual app
(`run_test`), starts a process (subprocess, asyncio's subprocesses, multiprocessing) or reaches
a host through the console (its CLI, a host or a transport: the console reaches every host, this
machine included, through processes). The rule reads bytecode; it errs towards leaving a test
out (a test that opens the local transport only to read a file is left out too).
`pytest --unit-why` lists what it leaves out and why.

The guard, under --unit: a test that still starts a process (any subprocess, fork or spawn, seen
by an audit hook) or runs a Textual app fails, naming what it started; neither ever starts. The
process hid where the rule cannot follow (a console module it does not list): mark the test
`@pytest.mark.component`."""

from __future__ import annotations

import dis
import importlib
import sys
import types
from collections.abc import Generator, Iterator
from typing import Any

import pytest

#: fixtures that start a component: a test that uses one is no unit test (snap_compare runs
#: the app inside pytest-textual-snapshot, where the rule does not read; `mooncake` marks the
#: tests of Mooncake's store, which start its master or its transfer engine)
COMPONENT_FIXTURES = frozenset({"sshd", "snap_compare", "demo_dir", "vllm_python", "stream_master",
                                "mooncake", "slurm_cluster"})
#: markers that say so by hand
COMPONENT_MARKERS = ("slow", "vllm", "sshd", "component")
#: calling into any of these (or their submodules) starts a process
PROCESS_MODULES = ("subprocess", "asyncio.subprocess", "multiprocessing")
#: ... and into these reaches a host: the console reaches every host, this machine included,
#: through processes (its own commands, `python -m engine`)
HOST_MODULES = ("console.cli", "console.hosts", "console.transport")
#: attribute names that start a process or run an app, whatever their object
STARTING_NAMES = {"run_test": "a Textual app", "run_async": "a Textual app",
                  "create_subprocess_exec": "a process", "create_subprocess_shell": "a process",
                  "Popen": "a process"}
#: audit events of a process starting (the guard's)
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn",
                            "os.exec", "os.fork", "os.forkpty"})


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _referenced(func: Any) -> Iterator[tuple[str, Any]]:
    """(name, object) for every global, attribute and import `func` names, nested functions
    and function-local imports included; the object is None where it cannot be resolved."""
    globs = getattr(func, "__globals__", {})
    codes = [func.__code__]
    while codes:
        code = codes.pop()
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        importing = ""
        asks = "getfixturevalue" in code.co_names
        for ins in dis.get_instructions(code):
            if ins.opname == "IMPORT_NAME":
                importing = ins.argval
                yield importing, sys.modules.get(importing)
            elif ins.opname == "IMPORT_FROM":
                mod = sys.modules.get(importing)
                if mod is None and importing.startswith("tests."):
                    mod = importlib.import_module(importing)
                yield ins.argval, getattr(mod, ins.argval, None)
            elif ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                yield ins.argval, globs.get(ins.argval)
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                yield ins.argval, None
            elif asks and ins.opname == "LOAD_CONST" and ins.argval in COMPONENT_FIXTURES:
                yield f"fixture {ins.argval}", None   # request.getfixturevalue("sshd")


_STARTS: dict[int, str | None] = {}   # by id(function): what it starts (functions live on)


def starts(func: Any) -> str | None:
    """What calling `func` starts, read from its bytecode and from the test helpers it calls
    (tests/ only: the console's and the standard library's by their module names)."""
    func = getattr(func, "__func__", func)
    if getattr(func, "__code__", None) is None:
        return None
    if id(func) not in _STARTS:
        _STARTS[id(func)] = None   # a helper that calls itself back starts nothing by that
        _STARTS[id(func)] = _first_start(func)
    return _STARTS[id(func)]


def _first_start(func: Any) -> str | None:
    for name, obj in _referenced(func):
        if name in STARTING_NAMES:
            return f"{STARTING_NAMES[name]} ({name})"
        if name.startswith("fixture "):
            return f"a component (the {name[8:]} fixture)"
        where = obj.__name__ if isinstance(obj, types.ModuleType) else \
            getattr(obj, "__module__", None) or (name if "." in name else "")
        if _in(where, PROCESS_MODULES):
            return f"a process (through {where})"
        if _in(where, HOST_MODULES):
            return f"a host (through {where})"
        if where.startswith("tests.") and not isinstance(obj, types.ModuleType):
            for f in vars(obj).values() if isinstance(obj, type) else (obj,):
                if callable(f) and (found := starts(f)):
                    return found
    return None


def component_reason(item: pytest.Item) -> str | None:
    """Why `item` is no unit test, or None when it is one."""
    for m in COMPONENT_MARKERS:
        if item.get_closest_marker(m):
            return f"marked {m}"
    names = getattr(item, "fixturenames", ())
    if used := COMPONENT_FIXTURES.intersection(names):
        return f"uses {sorted(used)[0]}"
    info = getattr(item, "_fixtureinfo", None)
    defs = [fd for n in names for fd in (info.name2fixturedefs.get(n, ()) if info else ())]
    for func in [getattr(item, "obj", None), *(fd.func for fd in defs)]:
        if func is not None and (found := starts(func)):
            return f"starts {found}"
    return None


HINT = ("not a unit test: it started {what}, where the unit rule (tests/unit_loop.py) cannot "
        "see it: mark the test @pytest.mark.component")


class StartedSomething(BaseException):
    """Raised where a unit test starts a process or an app; a BaseException so that the code
    under test does not catch it as an error of its own and carry on."""


class _Guard:
    def __init__(self) -> None:
        self.armed = False         # while a test runs under --unit
        self.started: list[str] = []   # what it started: reported once, then cleared

    def fire(self, what: str) -> None:
        self.armed = False   # the first start fails the test; its clean-up may start more
        self.started.append(what)
        raise StartedSomething(HINT.format(what=what))


GUARD = _Guard()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--unit", action="store_true",
                     help="run the unit tests alone, and fail any that starts a process or an "
                          "app (tests/unit_loop.py)")
    parser.addoption("--unit-why", action="store_true",
                     help="print each test the unit rule leaves out, and why")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "component: starts a process, an app or a server where "
                                       "the unit rule cannot see it: left out of the unit loop")
    if config.getoption("--unit"):
        _install_guard()


def _install_guard() -> None:
    def audit(event: str, args: tuple[Any, ...]) -> None:
        if GUARD.armed and event in PROCESS_EVENTS:
            exe = args[0] if args else ""
            GUARD.fire(f"a process ({event}: {exe!r:.80})")

    sys.addaudithook(audit)
    from textual.app import App

    def refuse(name: str) -> Any:
        def start(app: App[Any], *args: Any, **kwargs: Any) -> Any:
            if GUARD.armed:
                GUARD.fire(f"a Textual app ({type(app).__name__}.{name})")
            return original(app, *args, **kwargs)
        original = getattr(App, name)
        return start

    App.run_test = refuse("run_test")  # type: ignore[method-assign]
    App.run_async = refuse("run_async")  # type: ignore[method-assign]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not (config.getoption("--unit") or config.getoption("--unit-why")):
        return
    why = {item.nodeid: component_reason(item) for item in items}
    if config.getoption("--unit-why"):
        report = config.pluginmanager.get_plugin("terminalreporter")
        for nodeid, reason in why.items():
            if reason and report is not None:
                report.write_line(f"{nodeid}: {reason}")
    if config.getoption("--unit"):
        left = [i for i in items if why[i.nodeid]]
        if left:
            config.hook.pytest_deselected(items=left)
        items[:] = [i for i in items if not why[i.nodeid]]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if GUARD.started:   # failed, whatever the test made of the exception
        report.outcome = "failed"
        report.longrepr = HINT.format(what=", ".join(dict.fromkeys(GUARD.started)))
        GUARD.started.clear()
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    GUARD.started.clear()
    GUARD.armed = bool(item.config.getoption("--unit"))
    try:
        return (yield)
    finally:
        GUARD.armed = False
