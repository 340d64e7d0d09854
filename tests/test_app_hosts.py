"""The hosts list shows each host's real connection state, driven by the host pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.app import create_app
from console.errors import Unreachable
from console.hosts.host import HostState
from console.settings.config import Config, HostConfig, local_host
from console.widgets.host_list import HostItem


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


def test_monitor_reconnecting_reaches_the_hosts_list(tmp_path: Path) -> None:
    from console.hosts.host import HostPool
    from console.monitor.service import MonitorHub, MonitorState

    seen: list[tuple[str, HostState]] = []
    pool = HostPool(Config(hosts={"local": local_host()}),
                    on_state=lambda name, state, detail: seen.append((name, state)))
    hub = MonitorHub(pool, autostart=False)
    hub["local"].set_state(MonitorState.RECONNECTING, "no monitor data for 10 s")
    assert pool.state["local"] is HostState.RECONNECTING
    assert pool.detail["local"] == "no monitor data for 10 s"
    hub["local"].set_state(MonitorState.LIVE, "")
    assert pool.state["local"] is HostState.CONNECTED
    assert seen == [("local", HostState.RECONNECTING), ("local", HostState.CONNECTED)]
