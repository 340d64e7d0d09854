"""Replaying recorded monitor events and log lines into the real app at a frozen clock, for the
pane snapshots and Pilot tests (see tests/fixtures/monitor/make_recordings.py for the data)."""

from __future__ import annotations

import gzip
from pathlib import Path

from console.app import Eagle3App, create_app
from console.hosts.host import HostPool
from console.monitor.service import MonitorHub, MonitorState
from console.settings.config import Config, HostConfig

FIXTURES = Path(__file__).parent / "fixtures"
NOW = 1_764_504_338.5  # the snapshots' frozen "now": half a second after gpu1's last sample


class FrozenClock:
    """A clock the test moves by hand."""

    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def recording(name: str) -> list[str]:
    path = FIXTURES / "monitor" / name
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return [ln for ln in data.decode().splitlines() if ln.strip()]


def replay(hub: MonitorHub, clock: FrozenClock, host: str, lines: list[str],
           end: float | None = None) -> None:
    """Ingest lines as if each arrived at its own event time (shifted so the last one lands at
    `end`, for captures made at another time); leaves the clock where it was."""
    from engine.events import parse

    saved = clock.t
    times = [ev.t for ev in (parse(ln) for ln in lines) if ev is not None]
    shift = 0.0 if end is None else end - times[-1]
    for ln, t in zip(lines, times, strict=False):
        clock.t = t + shift
        assert hub.ingest_line(host, ln)
        # the hub stamps arrival with clock(); the recorded event time travels in the sample
    clock.t = saved


def host_config(tmp: Path, names: list[str]) -> Config:
    """Hosts on this machine that cannot run anything (the panes must not need them to)."""
    return Config(hosts={n: HostConfig(name=n, python="/bin/false", root=str(tmp / n))
                         for n in names})


def fleet_app(tmp: Path, clock: FrozenClock | None = None, theme: str | None = None,
              host: str = "gpu1") -> Eagle3App:
    """gpu1 live (GPU 5 lost), gpu2 dropped (reconnecting, last data 40 s old), local without
    GPUs (a real capture from a GPU-less machine): the recorded fleet every pane test uses."""
    clock = clock or FrozenClock()
    config = host_config(tmp, ["gpu1", "gpu2", "local"])
    hub = MonitorHub(HostPool(config), clock=clock, autostart=False)
    replay(hub, clock, "gpu1", recording("gpu1_h200x8_vllm.jsonl.gz"))
    replay(hub, clock, "gpu2", recording("gpu2_h100x8_train.jsonl.gz"), end=NOW - 40)
    hub["gpu2"].set_state(MonitorState.RECONNECTING,
                          "gpu2: connection lost while streaming `python -m engine monitor`")
    replay(hub, clock, "local", recording("local_nogpu.jsonl"), end=NOW - 0.4)
    return create_app(config, theme=theme, host=host, clock=clock, monitors=hub)
