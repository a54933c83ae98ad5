"""The probe finds listening TCP sockets through the kernel's sock_diag netlink interface (it does not
walk the established-connection table as /proc/net/tcp does) and reads /proc/net/tcp{,6} where
netlink is refused; both ways must report the same sockets."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.hostscripts import source_for

REPORT = (
    "\nimport json\n"
    "print(json.dumps({'netlink': _listening_netlink(), 'proc': _listening_proc(), 'used': listening_sockets()}))\n"
)


def listeners_seen(prelude: str = "") -> dict[str, dict[str, list[object]]]:
    code = prelude + "FLEET_PROBE_AS_LIBRARY = True\n" + source_for("probe") + REPORT
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


@pytest.fixture
def many_listeners() -> Iterator[list[tuple[str, int]]]:
    """300 IPv4 listeners (more than one netlink answer holds), one IPv6 wildcard and one IPv6 loopback."""
    socks = []
    try:
        for _ in range(300):
            s = socket.socket(socket.AF_INET)
            s.bind(("127.0.0.1", 0))
            s.listen()
            socks.append(s)
        for address in ("::", "::1"):
            s = socket.socket(socket.AF_INET6)
            s.bind((address, 0))
            s.listen()
            socks.append(s)
        yield [(s.getsockname()[0], s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def test_netlink_and_proc_tables_report_the_same_listeners(many_listeners: list[tuple[str, int]]) -> None:
    seen = listeners_seen()
    ours = {port for _, port in many_listeners}  # other tests may open and close listeners meanwhile

    def of_ours(table: dict[str, list[object]]) -> dict[str, tuple[object, ...]]:
        return {inode: tuple(v) for inode, v in table.items() if v[1] in ours}

    assert of_ours(seen["netlink"]) == of_ours(seen["proc"]) == of_ours(seen["used"])
    reported = set(of_ours(seen["netlink"]).values())
    expected = {("127.0.0.1", port) for _, port in many_listeners[:300]}
    expected |= {("::", many_listeners[300][1]), ("::1", many_listeners[301][1])}
    assert expected == reported


def test_without_netlink_the_proc_tables_are_read(many_listeners: list[tuple[str, int]]) -> None:
    # as in a container whose seccomp profile refuses AF_NETLINK sockets
    refuse = (
        "import _socket\n"
        "REFUSED = []\n"
        "class _NoNetlink(_socket.socket):\n"
        "    def __init__(self, family=-1, *a, **k):\n"
        "        if family == _socket.AF_NETLINK:\n"
        "            REFUSED.append(family)\n"
        "            raise PermissionError(1, 'Operation not permitted')\n"
        "        super().__init__(family, *a, **k)\n"
        "_socket.socket = _NoNetlink\n"
    )
    code = refuse + "FLEET_PROBE_AS_LIBRARY = True\n" + source_for("probe")
    code += "\nimport json\nprint(json.dumps({'listeners': listening_sockets(), 'refused': len(REFUSED)}))\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert seen["refused"] == 1
    assert {port for _, port in many_listeners} <= {v[1] for v in seen["listeners"].values()}


def test_an_engine_process_started_after_the_scan_is_still_a_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The probe scans /proc for engines, then reads the GPUs. A rank an engine starts in between (a
    deploy's probe while the last run's server comes up) was on a GPU but no server: placement counted
    it as a process fleet did not start and refused its own deployment's GPU."""
    import fleet.host.probe as probe

    argvs = {100: ["python3", "-m", "sglang.launch_server"], 101: ["sglang::scheduler_TP1"], 102: ["sleep"]}

    def found(pid: int, argv: list[str] | None = None) -> dict[str, object]:
        return {"pid": pid, "ppid": 100, "pgid": 100, "uid": 0, "user": "root", "argv": argv, "start_ticks": 1}

    monkeypatch.setattr(probe, "pids", lambda: [100])  # the scan: the rank has not started yet
    monkeypatch.setattr(probe, "argv_at", argvs.get)
    monkeypatch.setattr(probe, "process", found)
    monkeypatch.setattr(probe, "container_of", lambda pid: None)
    monkeypatch.setattr(probe, "engine_containers", lambda procs, state: [])
    on_gpu = [{"pid": 101, "used_mib": 2048}, {"pid": 102, "used_mib": 10}]  # the rank, and no engine
    monkeypatch.setattr(probe, "gpu_facts", lambda: {"source": "nvml", "gpus": [{"index": 1, "processes": on_gpu}]})
    held = {"device_files": [], "method": "fuser", "holders": [found(101)], "by_file": {}}
    monkeypatch.setattr(probe, "gpu_holders", lambda glob: held)
    facts = probe.collect({"state_dir": str(tmp_path)})
    assert [s["pid"] for s in facts["servers"]] == [100, 101]
