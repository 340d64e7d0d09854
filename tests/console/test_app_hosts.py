"""Hosts: the list shows each host's real connection state (driven by the host pool), `[` / `]`
switch hosts from any pane, a failed host says why it has no data, `--host` must name one."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.widgets._footer import FooterKey

from console.app import create_app
from console.dialogs.help import flat, sections
from console.errors import Unreachable
from console.hosts.host import HostState
from console.panes.gpu import GpuPane
from console.screens.main import PANES
from console.settings.config import Config, HostConfig, local_host
from console.widgets.footer import Footer
from console.widgets.gpu_table import GpuTable
from console.widgets.host_list import HostItem, HostList
from tests.paths import REPO
from tests.replay import fleet_app
from tests.sshd import SSHD
from tests.waiting import wait_for


async def test_states_follow_the_pool(tmp_path: Path) -> None:
    # a host on a closed loopback port fails; the local host connects
    dead = HostConfig(name="dead", ssh="nobody@127.0.0.1:1", root=str(tmp_path / "r"),
                      known_hosts=str(tmp_path / "kh"))
    cfg = Config(hosts={"local": local_host(), "dead": dead})
    app = create_app(cfg)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.pool.ensure("local")
        # a refused connection is Unreachable (console/errors.py), raised after the pool set
        # FAILED; any other error (auth, host key, a bug) fails the test
        with pytest.raises(Unreachable) as failed:
            await app.pool.ensure("dead")
        assert type(failed.value) is Unreachable and failed.value.host == "dead", failed.value
        await pilot.pause(0.2)
        items = {i.host: i for i in app.screen.query(HostItem)}
        assert app.pool.state["local"] is HostState.CONNECTED
        assert items["local"].has_class("-connected")
        assert app.pool.state["dead"] is HostState.FAILED
        assert items["dead"].has_class("-failed")
        assert "failed" in str(items["dead"].label.render())


async def test_monitor_reconnecting_reaches_the_hosts_list(tmp_path: Path) -> None:
    """The monitor's reconnecting is the host's, until its next sample: an `ensure` on the
    still-open link does not say connected in between (a frozen host flipped between the two)."""
    from console.hosts.host import HostPool
    from console.monitor.record import Sample
    from console.monitor.service import MonitorHub, MonitorState

    seen: list[tuple[str, HostState]] = []
    pool = HostPool(Config(hosts={"local": local_host()}),
                    on_state=lambda name, state, detail: seen.append((name, state)))
    hub = MonitorHub(pool, autostart=False)
    hub["local"].set_state(MonitorState.RECONNECTING, "no monitor data for 10 s")
    assert pool.state["local"] is HostState.RECONNECTING
    assert pool.detail["local"] == "no monitor data for 10 s"
    await pool.ensure("local")
    assert pool.state["local"] is HostState.RECONNECTING
    hub.ingest("local", Sample(t=time.time(), interval=1.0, source="engine", gpus=()))
    assert pool.state["local"] is HostState.CONNECTED and pool.view("local").silent_s is None
    assert seen == [("local", HostState.RECONNECTING), ("local", HostState.CONNECTED)]


async def test_only_a_monitored_host_reads_no_answer(tmp_path: Path) -> None:
    """A host connected for a launch or a stop, whose monitor never ran, is not expected to
    answer every second: it stays `connected`; one whose monitor sent samples and then went
    quiet for 5 s reads `no answer for N s`."""
    from console.hosts.host import HostPool
    from console.monitor.record import Sample
    from console.monitor.service import MonitorHub
    from console.widgets.host_list import state_text
    from tests.replay import FrozenClock

    clock = FrozenClock(1000.0)
    pool = HostPool(Config(hosts={"local": local_host()}), clock=clock)
    await pool.ensure("local")
    clock.t += 600
    assert state_text(pool.view("local")) == "● connected"
    hub = MonitorHub(pool, autostart=False, clock=clock)
    hub.ingest("local", Sample(t=clock.t, interval=1.0, source="engine", gpus=()))
    clock.t += 4
    assert state_text(pool.view("local")) == "● connected"
    clock.t += 46
    assert state_text(pool.view("local")) == "◌ no answer for 50 s"


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_brackets_switch_hosts_from_every_pane(tmp_path: Path) -> None:
    """`]` / `[`: next / previous host in the list's order, wrapping, from each pane, with
    focus left in the pane (the hosts list follows); the footer and help show the keys."""
    app = fleet_app(tmp_path)          # gpu1, gpu2, local: three local-transport hosts
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        hosts = screen.query_one(HostList)
        assert screen.selected == "gpu1"
        for n, (tab_id, _title, _cls) in enumerate(PANES, start=1):
            await pilot.press(str(n))
            focused = app.focused
            await pilot.press("]")
            assert screen.selected == "gpu2", tab_id
            assert screen.query_one(GpuPane).host == "gpu2"
            assert hosts.index == 1 and screen.sub_title.startswith("gpu2 ")
            assert app.focused is focused and not isinstance(app.focused, HostList), tab_id
            await pilot.press("[", "[")          # back past gpu1: wraps to the last host
            assert screen.selected == "local", tab_id
            await pilot.press("]")
            assert screen.selected == "gpu1", tab_id
        keys = [(k.key_display, k.description) for k in screen.query_one(Footer)
                .query(FooterKey) if k.display]
        assert ("[ ]", "Host") in keys
    rows = flat(sections())
    assert {("Everywhere", "["), ("Everywhere", "]")} <= {(t, k) for t, k, _d in rows}


async def test_a_failed_hosts_gpu_pane_says_why_it_has_no_data(tmp_path: Path) -> None:
    """An ssh host on a loopback port nothing listens on: the GPUs pane names its state and
    the connection error where the GPUs would be, not "Waiting for the first sample…"."""
    known = tmp_path / "known_hosts"
    known.write_text("")
    dead = HostConfig(name="dead", ssh=f"nobody@127.0.0.1:{_closed_port()}",
                      known_hosts=str(known), root="/tmp/eagle3-dead")
    app = create_app(Config(hosts={"dead": dead, "local": local_host()}), host="dead")
    async with app.run_test(size=(120, 40)) as pilot:
        end = time.monotonic() + 30
        while app.pool.state.get("dead") is not HostState.FAILED:
            assert time.monotonic() < end, app.pool.state
            await pilot.pause(0.1)
        pane = app.screen.query_one(GpuPane)
        pane.refresh_view(force=True)
        await pilot.pause()
        table = "\n".join(app.screen.query_one(GpuTable).plain_lines())
        assert "Waiting for the first sample" not in table
        assert "dead ✖ failed" in table and app.pool.detail["dead"] in table, table
        assert "refused" in table or "cannot reach" in table, table
        assert "dead ✖ failed" in app.screen.sub_title


def test_an_unknown_host_flag_is_refused_naming_the_hosts(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text('[hosts.alpha]\nroot = "/tmp/a"\n[hosts.beta]\nroot = "/tmp/b"\n')
    out = subprocess.run([sys.executable, "-m", "console", "--config", str(cfg),
                          "--host", "nosuch"], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL, cwd=REPO)
    assert out.returncode != 0 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: --host nosuch") and "alpha, beta" in lines[0], lines


@pytest.mark.parametrize("argv", [["inspect", "nosuch", "/tmp"], ["runs", "nosuch"]])
def test_an_unknown_host_argument_is_not_called_a_host_flag(tmp_path: Path,
                                                             argv: list[str]) -> None:
    """A subcommand's HOST argument is not the TUI's --host option: the error names the host
    as given, without an option nobody typed."""
    cfg = tmp_path / "config.toml"
    cfg.write_text('[hosts.alpha]\nroot = "/tmp/a"\n[hosts.beta]\nroot = "/tmp/b"\n')
    out = subprocess.run([sys.executable, "-m", "console", "--config", str(cfg), *argv],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                         cwd=REPO)
    assert (out.returncode, out.stdout) == (1, ""), out
    assert out.stderr == "error: unknown host 'nosuch' (configured: alpha, beta, local)\n", \
        out.stderr


async def test_a_stop_from_the_runs_pane_goes_through_the_pool(tmp_path: Path) -> None:
    """x on a run looks for it on every host that could hold it through the app's HostPool
    (`ensure`), so a host the stop connected to shows as connected in the list; the stop
    connected on its own before, and the list went on saying `idle`."""
    import json

    from console.dialogs.confirm import ConfirmScreen
    from console.hostside.runner import proc_start
    from console.panes.runs import RunsPane
    from console.widgets.run_tables import RunTable
    from tests.runs_registry import local_app, local_config, write_run

    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        root = tmp_path / "host"
        run_dir = write_run(root, "job-1", [], status="running", start=time.time(),
                            train_json=False)
        rec = json.loads((run_dir / "run.json").read_text())
        rec.update(pid=proc.pid, pgid=proc.pid, pid_start=proc_start(proc.pid), engine=False)
        (run_dir / "run.json").write_text(json.dumps(rec))
        cfg = local_config(root)
        cfg.hosts["other"] = HostConfig(name="other", python=sys.executable,
                                        root=str(tmp_path / "other"))
        app = local_app(cfg)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("5")
            pane = app.screen.query_one(RunsPane)
            table = pane.query_one(RunTable)
            deadline = time.monotonic() + 60
            while table.ids != ["job-1"] and time.monotonic() < deadline:
                await pilot.pause(0.05)
            assert app.pool.state["other"] is HostState.IDLE   # nothing asked it yet
            table.focus()
            await pilot.press("x")
            while not isinstance(app.screen, ConfirmScreen) and time.monotonic() < deadline:
                await pilot.pause(0.05)
            await pilot.press("y")
            while (proc.poll() is None or pane.model.busy is not None) and \
                    time.monotonic() < deadline:
                await pilot.pause(0.05)
            assert proc.poll() is not None, "the run was not stopped"
            await pilot.pause()
            assert app.pool.state["other"] is HostState.CONNECTED
            item = next(i for i in app.screen.query(HostItem) if i.host == "other")
            assert item.has_class("-connected")
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow   # 14 s of a frozen host: past the monitor's 10 s stall
@pytest.mark.sshd
async def test_a_frozen_host_reads_one_state_with_the_age_of_its_last_answer(
        sshd: SSHD, tmp_path: Path) -> None:
    """The host's sshd stopped (SIGSTOP) under a live monitor: the header, the hosts list and
    the GPU pane all say `◌ no answer for N s`, N growing, from the first silent seconds on,
    never flipping back to `● connected` or `reconnecting` while the GPU pane's data ages
    (it flipped every 10 s: the stalled agent set reconnecting, the next `ensure` connected)."""
    import os
    import signal

    import psutil

    from console.monitor.service import MonitorHub
    from console.panes.gpu import GpuPane
    from console.widgets.status_line import StatusLine

    host = HostConfig(name="gpu1", ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                      identity=str(sshd.user_key), python=sys.executable,
                      root=str(tmp_path / "root"))
    app = create_app(Config(hosts={"gpu1": host}))
    app.monitors = MonitorHub(app.pool, interval=0.25, clock=app.clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.monitors["gpu1"].version >= 3, 60, "samples")
        await wait_for(pilot, lambda: "● connected" in app.screen.sub_title, 10, "connected")
        frozen = [p for k in sshd.children() for p in [k, *k.children(recursive=True)]]
        try:
            for p in frozen:
                os.kill(p.pid, signal.SIGSTOP)
            seen: list[str] = []
            end = time.monotonic() + 14   # past the 10 s stall that flipped it
            while time.monotonic() < end:
                await pilot.pause(0.2)
                seen.append(app.screen.sub_title)
            item = str(app.screen.query_one(HostItem).label.render())
            pane = app.screen.query_one(GpuPane)
            pane.refresh_view(force=True)
            status = pane.query_one(StatusLine).plain
        finally:
            for p in frozen:
                with contextlib.suppress(psutil.NoSuchProcess):
                    os.kill(p.pid, signal.SIGCONT)
    silent = [i for i, t in enumerate(seen) if "no answer for" in t]
    assert silent, seen
    after = seen[silent[0]:]
    assert all("◌ no answer for" in t for t in after), after
    assert "gpu1 ◌ no answer for 1" in after[-1], after[-1]   # 10-14 s
    assert "no answer for 1" in item, item
    assert "◌ no answer for 1" in status and "reconnecting" not in status, status


def documented_states() -> list[str]:
    """The host states the README names (the paragraph after its Keys table)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    para = text.split("A host's state is one line", 1)[1].split("\n\n", 1)[0]
    import re
    return re.findall(r"`([○◌●✖][^`]*)`", para)


def is_documented(state: str, documented: list[str]) -> bool:
    import re

    def shape(s: str) -> str:
        return re.sub(r"\d+(\.\d+)? (s|min|h)\b", "N", s)
    return shape(state) in {shape(d) for d in documented}


@pytest.mark.slow   # a host down for 7 s, then back: the monitor's backoff and agent start
@pytest.mark.sshd
async def test_a_host_that_goes_away_and_comes_back_reads_one_documented_state_everywhere(
        sshd: SSHD, tmp_path: Path) -> None:
    """The host's sshd stopped under a live monitor, then started again: at every moment the
    header, the hosts list and the GPUs pane say the same state (the GPUs pane said
    `reconnecting` or `unreachable` while the header said `● connected` for seconds after the
    host was back), each state is one the README names and a reconnect reads `reconnecting`
    (it read `connecting`), and each line of the hosts list fits the list (`failed, no ans`)."""
    from rich.cells import cell_len

    from console.monitor.service import MonitorHub, MonitorState
    from console.widgets.status_line import StatusLine

    host = HostConfig(name="gpu1", ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                      identity=str(sshd.user_key), python=sys.executable,
                      root=str(tmp_path / "root"))
    app = create_app(Config(hosts={"gpu1": host}))
    app.monitors = MonitorHub(app.pool, interval=0.25, clock=app.clock)
    documented = documented_states()
    assert "◌ reconnecting" in documented and len(documented) >= 6, documented
    seen: list[str] = []

    async with app.run_test(size=(120, 40)) as pilot:
        main, pane = app.screen, app.screen.query_one(GpuPane)
        item = main.query_one(HostItem)

        def look() -> str:
            """The three states, read after each has drawn from its source."""
            main._show_states()
            pane.refresh_view(force=True)
            header = main.sub_title.removeprefix("gpu1 ")
            lines = str(item.label.render()).splitlines()
            room = item.content_region.width
            assert all(cell_len(ln) <= room for ln in lines), (lines, room)
            first, *rest = lines[0].split("  ", 1)
            listed = f"{first.split()[0]} {' '.join([*rest, *(ln.strip() for ln in lines[1:])])}"
            status = pane.query_one(StatusLine).plain
            assert listed == header, (listed, header)
            if header == "● connected":
                assert not any(w in status for w in ("◌", "✖", "unreachable")), status
            else:
                # the pane draws from its own read of the clock: its count may be a second on
                secs = re.compile(r"for \d+ s")
                assert secs.sub("for N s", status).startswith(
                    f"gpu1 {secs.sub('for N s', header)}"), (status, header)
            assert is_documented(header, documented), (header, documented)
            if not seen or seen[-1] != header:
                seen.append(header)
            return header

        async def watch(cond: Callable[[], bool], timeout: float, what: str) -> None:
            deadline = time.monotonic() + timeout
            while not cond():
                assert time.monotonic() < deadline, (what, seen)
                look()
                await pilot.pause(0.1)

        await watch(lambda: app.monitors["gpu1"].version >= 3 and look() == "● connected",
                    60, "samples")
        sshd.stop()
        try:
            end = time.monotonic() + 7
            await watch(lambda: time.monotonic() > end, 10, "the host away")
        finally:
            sshd.restart()
        await watch(lambda: app.monitors["gpu1"].state is MonitorState.LIVE
                    and look() == "● connected", 60, "the host back")
    down = seen[seen.index("● connected") + 1:-1]
    assert down and "◌ reconnecting" in down, seen
    assert not any("connecting" in s and "reconnecting" not in s for s in down), seen


async def test_a_long_host_state_fits_the_hosts_list(tmp_path: Path) -> None:
    """A host that answered before, then failed two minutes ago: `✖ failed, no answer for 2 min`
    in the 24-column list, each line whole (it was cut to `failed, no ans`)."""
    from rich.cells import cell_len

    from tests.replay import FrozenClock

    dead = HostConfig(name="gpu2", ssh=f"nobody@127.0.0.1:{_closed_port()}",
                      root=str(tmp_path / "r"), known_hosts=str(tmp_path / "kh"))
    clock = FrozenClock(1000.0)
    app = create_app(Config(hosts={"local": local_host(), "gpu2": dead}), clock=clock)
    async with app.run_test(size=(120, 40)) as pilot:
        app.pool.heard("gpu2")
        with pytest.raises(Unreachable):
            await app.pool.ensure("gpu2")
        clock.t += 120
        app.screen._show_states()
        await pilot.pause()
        item = next(i for i in app.screen.query(HostItem) if i.host == "gpu2")
        lines = str(item.label.render()).splitlines()
        assert " ".join(ln.strip() for ln in lines) == "✖ gpu2 failed, no answer for 2 min"
        room = item.content_region.width
        assert room and all(cell_len(ln) <= room for ln in lines), (lines, room)
        assert app.screen.sub_title == "local ● connected" or "gpu2" not in app.screen.sub_title
