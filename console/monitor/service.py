"""The monitor service: per host, runs the engine's agent (`python -m engine monitor --events`)
over the host's transport and keeps what the GPU and fleet panes draw.

- Source: the agent first. When it cannot run there (it exits before its first sample: no engine
  pushed, no Python deps), the service polls nvidia-smi and /proc instead
  (console/monitor/nvidia_smi.py) and tries the agent again every ENGINE_RETRY_S.
- Freshness: a sample older than STALE_INTERVALS intervals is stale; each GPU also has its own
  last-good time, so a GPU that fell off the bus goes stale while its neighbours stay live.
- Drops: a lost connection, a killed agent or a silent stream (no line for STALL_INTERVALS
  intervals) sets RECONNECTING, keeps the last data, and retries with backoff.
- History: per GPU and for the host, bounded deques covering `history_s` (default 10 min).

No Textual here: panes read `HostMonitor` state on their own timer (that batches redraws to one
per tick however many samples arrive). Time comes from an injectable clock (tests freeze it).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from console.errors import CommandFailed, ConsoleError, TransportError
from console.hosts.engine_client import engine_argv, engine_failure, ensure_engine
from console.hosts.host import HostPool, HostState
from console.monitor.nvidia_smi import NvidiaSmiSampler
from console.monitor.record import GpuStat, Sample, sample_from_event
from engine import events

STALE_INTERVALS = 3
STALL_INTERVALS = 10          # no line at all for this long: the stream is dead, restart it
ENGINE_RETRY_S = 300.0        # in fallback, try the agent again this often (after a push, say)
MAX_BACKOFF_S = 15.0
SMI_MIN_INTERVAL = 2.0        # nvidia-smi costs more than NVML: poll it at most this often


class MonitorState(enum.Enum):
    STARTING = "starting"
    LIVE = "live"
    RECONNECTING = "reconnecting"


class GpuPoint(NamedTuple):
    """One GPU's history entry."""

    t: float
    util: float | None
    mem: float | None        # fraction of memory used
    power: float | None      # W
    temp: float | None


class HostPoint(NamedTuple):
    t: float
    cpu: float | None        # average % over cores
    mem: float | None        # fraction


class HostMonitor:
    """What is known about one host's GPUs and machine: the panes' read-only model."""

    def __init__(self, name: str, interval: float, history_s: float) -> None:
        self.name = name
        # told of every state change (MonitorHub forwards it to the host pool)
        self.on_state: Callable[[str, MonitorState, str], None] | None = None
        self.interval = interval
        self.history_s = history_s
        self.state = MonitorState.STARTING
        self.detail = ""                       # why reconnecting / why the fallback
        self.sample: Sample | None = None
        self.received: float | None = None     # console clock at the last sample
        self.gpus: dict[int, GpuStat] = {}     # last good record per GPU index
        self.gpu_seen: dict[int, float] = {}
        self.gpu_error: dict[int, str] = {}    # GPUs whose latest record is an error
        self.history: dict[int, deque[GpuPoint]] = {}
        self.host_history: deque[HostPoint] = deque(maxlen=self._maxlen(interval))
        self.version = 0                       # bumps on every change: panes skip idle redraws

    def _maxlen(self, interval: float) -> int:
        return int(math.ceil(self.history_s / max(interval, 0.05))) + 2

    # -- writes (the service) ------------------------------------------------------------------
    def ingest(self, sample: Sample, now: float) -> None:
        if sample.interval != self.interval:
            self.interval = sample.interval
            self.host_history = deque(self.host_history, maxlen=self._maxlen(sample.interval))
            for k, dq in self.history.items():
                self.history[k] = deque(dq, maxlen=self._maxlen(sample.interval))
        self.sample, self.received = sample, now
        came_back, self.state = self.state is not MonitorState.LIVE, MonitorState.LIVE
        seen = set()
        for g in sample.gpus:
            seen.add(g.index)
            if g.error:
                self.gpu_error[g.index] = g.error
                continue  # keep its last good data; it goes stale on its own
            self.gpu_error.pop(g.index, None)
            self.gpus[g.index] = g
            self.gpu_seen[g.index] = now
            hist = self.history.setdefault(g.index, deque(maxlen=self._maxlen(self.interval)))
            hist.append(GpuPoint(now, g.util, g.mem_frac, g.power, g.temp))
        for index in list(self.gpus):  # a GPU gone for the whole history window is forgotten
            if index not in seen and now - self.gpu_seen[index] > self.history_s:
                for d in (self.gpus, self.gpu_seen, self.history, self.gpu_error):
                    d.pop(index, None)
        h = sample.host
        if h is not None:
            mem = h.mem_used / h.mem_total if h.mem_used is not None and h.mem_total else None
            self.host_history.append(HostPoint(now, h.cpu_avg, mem))
        self.version += 1
        if came_back and self.on_state is not None:   # the host pool's state follows it
            self.on_state(self.name, self.state, self.detail)

    def set_state(self, state: MonitorState, detail: str = "") -> None:
        if (state, detail) != (self.state, self.detail):
            self.state, self.detail = state, detail
            self.version += 1
            if self.on_state is not None:
                self.on_state(self.name, state, detail)

    # -- reads (the panes) ---------------------------------------------------------------------
    def age(self, now: float) -> float | None:
        return None if self.received is None else max(0.0, now - self.received)

    def stale(self, now: float) -> bool:
        age = self.age(now)
        return age is not None and age > STALE_INTERVALS * self.interval

    def gpu_stale(self, index: int, now: float) -> bool:
        seen = self.gpu_seen.get(index)
        return seen is None or now - seen > STALE_INTERVALS * self.interval

    def gpu_list(self) -> list[GpuStat]:
        return [self.gpus[i] for i in sorted(self.gpus)]


class MonitorHub:
    """Every host's HostMonitor, and the tasks that feed them (started on demand by `watch`)."""

    def __init__(self, pool: HostPool, *, interval: float = 1.0, history_s: float = 600.0,
                 clock: Callable[[], float] = time.time, autostart: bool = True) -> None:
        self.pool = pool
        self.interval = interval
        self.clock = clock
        self.autostart = autostart      # False: fed only through ingest() (recordings, tests)
        self.monitors = {name: HostMonitor(name, interval, history_s) for name in pool.hosts}
        for mon in self.monitors.values():
            mon.on_state = self._host_state
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def _host_state(self, name: str, state: MonitorState, detail: str) -> None:
        # the hosts list shows what the monitor sees: a dropped agent link is "reconnecting"
        # there too, and the first sample after it brings the host back to "connected"
        if state is MonitorState.RECONNECTING:
            self.pool.set_state(name, HostState.RECONNECTING, detail)
        elif state is MonitorState.LIVE and self.pool.state[name] is not HostState.CONNECTED:
            self.pool.set_state(name, HostState.CONNECTED, detail)

    def __getitem__(self, name: str) -> HostMonitor:
        return self.monitors[name]

    def watch(self, name: str) -> None:
        """Start feeding this host's monitor (idempotent; needs a running event loop)."""
        if self.autostart and name in self.monitors and name not in self._tasks:
            self._tasks[name] = asyncio.get_running_loop().create_task(self._run(name))

    def watch_all(self) -> None:
        for name in self.monitors:
            self.watch(name)

    def ingest(self, name: str, sample: Sample) -> None:
        now = self.clock()
        self.monitors[name].ingest(sample, now)
        if name in self.pool.answered:
            self.pool.heard(name, now)   # the host's age of last answer is this

    def ingest_line(self, name: str, line: str) -> bool:
        """Feed one line of the agent's output; True when it was a sample."""
        ev = events.parse(line)
        if not isinstance(ev, events.Sample):
            return False
        self.ingest(name, sample_from_event(dict(ev.data), ev.t))
        return True

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t

    # -- feeding one host ----------------------------------------------------------------------
    async def _run(self, name: str) -> None:
        mon = self.monitors[name]
        backoff = self.interval
        use_engine, engine_retry_at = True, 0.0
        while True:
            try:
                await self.pool.ensure(name)
                if use_engine or time.monotonic() >= engine_retry_at:
                    try:
                        await self._stream_agent(name)
                        use_engine = True
                    except _AgentUnusable as e:
                        use_engine, engine_retry_at = False, time.monotonic() + ENGINE_RETRY_S
                        why = (str(e).splitlines() or [""])[0][:160]
                        mon.set_state(mon.state, f"engine agent unavailable: {why}")
                        continue
                else:
                    await self._poll_nvidia_smi(name, until=engine_retry_at)
                backoff = self.interval
            except Exception as e:  # TransportError above all; anything else must not end the task
                mon.set_state(MonitorState.RECONNECTING, str(e) if isinstance(e, TransportError)
                              else f"monitor error: {type(e).__name__}: {e}")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _stream_agent(self, name: str) -> None:
        """Read the agent until it stops; raises _AgentUnusable if it never produced a sample."""
        host, mon = self.pool[name], self.monitors[name]
        try:
            await ensure_engine(host)  # a fresh host gets the engine pushed first
        except CommandFailed as e:
            raise _AgentUnusable(f"cannot push the engine: {e}") from e
        except TransportError:
            raise
        except ConsoleError as e:  # e.g. the host's Python is missing
            raise _AgentUnusable(str(e)) from e
        root = await host.root()
        argv, env = await engine_argv(host, ["monitor", "--events", "--interval",
                                            f"{self.interval:g}", "--path", root])
        got = False
        error: str | None = None
        stream = host.transport.stream(argv, env=env)
        stall = max(10.0, STALL_INTERVALS * self.interval)
        try:
            while True:
                try:
                    line = await asyncio.wait_for(stream.__anext__(), stall)
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError as e:
                    raise TransportError(name, f"no monitor data for {stall:.0f} s") from e
                ev = events.parse(line)
                if isinstance(ev, events.Sample):
                    if mon.detail and not got:
                        mon.set_state(MonitorState.LIVE, "")
                    self.ingest(name, sample_from_event(dict(ev.data), ev.t))
                    got = True
                elif isinstance(ev, events.Error):
                    error = ev.msg
        except CommandFailed as e:
            if not got:
                raise _AgentUnusable(error or engine_failure(e)) from e
            raise  # it ran, then died: restart it like a dropped link
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]
        if not got:
            raise _AgentUnusable(error or "the agent exited without a sample")

    async def _poll_nvidia_smi(self, name: str, until: float) -> None:
        host, mon = self.pool[name], self.monitors[name]
        interval = max(self.interval, SMI_MIN_INTERVAL)
        sampler = NvidiaSmiSampler(interval, await host.root())
        reason = mon.detail
        while time.monotonic() < until:
            started = time.monotonic()
            res = await host.transport.run_script(sampler.script(), timeout=max(10.0, 5 * interval))
            self.ingest(name, sampler.parse(res.stdout, self.clock()))
            mon.set_state(MonitorState.LIVE, reason)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))


class _AgentUnusable(Exception):
    """The engine's agent cannot run on this host (the reason is the message)."""
