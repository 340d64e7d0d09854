"""Host CPU, load, memory, disk and network from /proc text, for hosts where the engine's agent
cannot run (no Python deps yet): the nvidia-smi fallback reads these files in the same shell
round trip. Rates need two readings, so `ProcStats` keeps the previous counters.
"""

from __future__ import annotations

from console.monitor.record import HostStat


def parse_cpu(text: str) -> dict[str, tuple[int, int]]:
    """`/proc/stat` cpuN lines -> {cpuN: (busy jiffies, total jiffies)} (the total line skipped)."""
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or not parts[0].startswith("cpu") or parts[0] == "cpu":
            continue
        try:
            vals = [int(x) for x in parts[1:]]
        except ValueError:
            continue
        # user nice system idle iowait irq softirq steal (guest is already inside user)
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
        total = sum(vals[:8])
        out[parts[0]] = (total - idle, total)
    return out


def parse_meminfo(text: str) -> dict[str, int]:
    """`/proc/meminfo` -> {key: bytes}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


def parse_net(text: str) -> tuple[int, int]:
    """`/proc/net/dev` -> (rx bytes, tx bytes) summed over every interface but lo."""
    rx = tx = 0
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if not sep or name.strip() == "lo":
            continue
        cols = rest.split()
        if len(cols) >= 9 and cols[0].isdigit() and cols[8].isdigit():
            rx, tx = rx + int(cols[0]), tx + int(cols[8])
    return rx, tx


def parse_df(text: str) -> tuple[int, int] | None:
    """The last line of `df -Pk PATH` -> (used, total) bytes."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return None
    cols = lines[-1].split()
    if len(cols) < 4 or not cols[1].isdigit() or not cols[2].isdigit():
        return None
    return int(cols[2]) * 1024, int(cols[1]) * 1024


class ProcStats:
    """Turns successive /proc readings into HostStat records (rates from the previous one)."""

    def __init__(self) -> None:
        self._cpu: dict[str, tuple[int, int]] = {}
        self._net: tuple[float, int, int] | None = None

    def host(self, t: float, stat: str, loadavg: str, meminfo: str, net: str, df: str,
             disk_path: str) -> HostStat:
        cpu_now = parse_cpu(stat)
        cpu = []
        for name, (busy, total) in cpu_now.items():
            prev = self._cpu.get(name)
            if prev is None or total <= prev[1]:
                cpu.append(0.0)
            else:
                cpu.append(round(100.0 * (busy - prev[0]) / (total - prev[1]), 1))
        self._cpu = cpu_now
        rx, tx = parse_net(net)
        net_rx = net_tx = None
        if self._net is not None and t > self._net[0]:
            dt = t - self._net[0]
            net_rx, net_tx = max(0, rx - self._net[1]) / dt, max(0, tx - self._net[2]) / dt
        self._net = (t, rx, tx)
        mem = parse_meminfo(meminfo)
        try:
            load: tuple[float, ...] | None = tuple(float(x) for x in loadavg.split()[:3])
        except ValueError:
            load = None
        du = parse_df(df)
        total_mem, avail = mem.get("MemTotal"), mem.get("MemAvailable")
        swap_total, swap_free = mem.get("SwapTotal"), mem.get("SwapFree")
        return HostStat(
            cpu=tuple(cpu), load=load if load and len(load) == 3 else None,
            mem_used=total_mem - avail if total_mem is not None and avail is not None else None,
            mem_total=total_mem,
            swap_used=swap_total - swap_free if swap_total is not None and swap_free is not None
            else None,
            swap_total=swap_total, disk_path=disk_path,
            disk_used=du[0] if du else None, disk_total=du[1] if du else None,
            disk_error=None if du else "df failed", net_rx=net_rx, net_tx=net_tx)
