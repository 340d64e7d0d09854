"""Shared fixtures: a real sshd on 127.0.0.1, and configs that point hosts at it."""

from __future__ import annotations

import os
import pickle
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from console.settings.config import HostConfig
from console.transport import Transport, open_transport
from console.transport.local import LocalTransport
from console.transport.ssh import SSHTransport
from tests.sshd import SSHD, find_sshd, start_sshd

REPO = Path(__file__).resolve().parent.parent
pytest_plugins = ("tests.unit_loop",)
# fixture modules (pytest_plugins) whose helpers test modules import too: rewritten for pytest on
# that first import, else pytest warns that it could not rewrite them
pytest.register_assert_rewrite("tests.serving", "tests.tiny_llama", "tests.vllm_real",
                              "tests.stream_store")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHD]:
    """A real OpenSSH server on 127.0.0.1 with generated keys (skips only if sshd is absent)."""
    if find_sshd() is None:
        if os.environ.get("EAGLE3_REQUIRE_SSHD"):
            pytest.fail("EAGLE3_REQUIRE_SSHD is set but no sshd binary was found")
        pytest.skip("no OpenSSH sshd binary on this machine (apt-get install openssh-server)")
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


#: the timeout of a test marked `vllm` that names none
VLLM_TIMEOUT_S = 1200


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a real vLLM first (the longest: a server start each), then files with a slow
    test (order within a file kept). `make test` hands whole files to two workers in
    collection order (`--no-loadscope-reorder`: xdist would otherwise put the files with the
    most tests first, and the long vLLM files last); starting the long files first keeps one
    worker from finishing a long file alone at the end (longest-first scheduling). The second
    file is the first slow one that needs no demo workspace: the second worker runs it while
    the first builds the workspace, instead of waiting on the build's lock."""
    vllm = {item.path for item in items if item.get_closest_marker("vllm")}
    for item in items:
        # the default timeout (pyproject) counts module fixtures too: a real vLLM module's first
        # test starts its servers (a minute each on 2 busy cores) and may train a drafter first
        if item.get_closest_marker("vllm") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(VLLM_TIMEOUT_S))
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    demo = {item.path for item in items if "demo_dir" in getattr(item, "fixturenames", ())}
    items.sort(key=lambda item: (item.path not in vllm, item.path not in slow))
    files = list(dict.fromkeys(item.path for item in items))
    free = next((f for f in files[1:] if f in slow and f not in demo), None)
    if free is not None and files[0] in demo:
        order = {f: i for i, f in enumerate([files[0], free] + [f for f in files[1:]
                                                                  if f != free])}
        items.sort(key=lambda item: order[item.path])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """EAGLE3_DURATIONS=FILE: every phase's time appended as it ends (`SECONDS PHASE OUTCOME
    NODEID`), so a run cut short by a time limit still says where its time went and what failed
    (--durations prints only at the end)."""
    path = os.environ.get("EAGLE3_DURATIONS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{report.duration:.2f} {report.when} {report.outcome} {report.nodeid}\n")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never read or write the user's real config/data dirs from a test."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture
def snap_compare(snap_compare: Any, request: pytest.FixtureRequest) -> Any:
    """pytest-textual-snapshot's compare, saying on a mismatch which rows differ (its HTML
    report is out of reach in CI)."""
    from pytest_textual_snapshot import node_to_report_path

    from tests.snapshot_text import describe_difference

    def compare(*args: Any, **kwargs: Any) -> bool:
        same = bool(snap_compare(*args, **kwargs))
        if not same:
            # the file the plugin wrote for its report a moment ago, in this process
            data = pickle.loads(node_to_report_path(request.node).read_bytes())
            print("snapshot difference:\n" + describe_difference(data[1], data[2]))
        return same

    return compare


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Times shown in UTC (snapshots and printed tables show local times)."""
    import time
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def ssh_host(sshd: SSHD, **over: str) -> HostConfig:
    fields = dict(name="t", ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                  identity=str(sshd.user_key))
    fields.update(over)
    return HostConfig(**fields)  # type: ignore[arg-type]


@pytest.fixture(params=["local", "ssh"])
async def transport(request: pytest.FixtureRequest) -> AsyncIterator[Transport]:
    """A connected transport of each kind."""
    if request.param == "local":
        t: Transport = open_transport(HostConfig(name="local"))
        assert isinstance(t, LocalTransport)
    else:
        t = open_transport(ssh_host(request.getfixturevalue("sshd")))
        assert isinstance(t, SSHTransport)
    async with t:
        yield t
