"""The router step (fleet/host/router.py) in this process, driving the real SGLang router (sglang-router's
own binary, started by the step as on a host) in front of a minimal worker: started, left alone, replaced
only when asked, workers added and removed, the last healthy one kept, the lease, the service's record,
a record from another service file refused. Whole services over simulated hosts are in test_services.py."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleet.host import router
from fleet.host.records import ROUTER_FILE
from fleet.plan.service import router_argv
from fleet.protocol import RouterRequest

pytest.importorskip("sglang_router", reason="the real router: pip install sglang-router")
# the step leaves the router it starts running (on a host, the step's process then exits): its Popen is
# never waited for here, and a router the test stopped may not be reaped yet when that object goes
pytestmark = pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")


class Worker(BaseHTTPRequestHandler):
    """What the router asks of a worker before it routes to it, and a chat answer of "4"."""

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        if self.path.startswith("/v1/chat/completions"):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body: dict[str, Any] = {"choices": [{"message": {"role": "assistant", "content": "4"}}]}
        else:
            body = {"model_path": "m", "is_generation": True, "data": [{"id": "m"}]}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer


@pytest.fixture(scope="module")
def worker() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Worker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def quiet_ports(count: int) -> list[int]:
    """`count` distinct ports free now and below the kernel's ephemeral range: bind(0) hands out ports
    that any test's outgoing connection may take before the router binds them (it then exits), and two
    calls in turn may hand out the same one."""
    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    held: list[socket.socket] = []
    try:
        while len(held) < count:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", random.randrange(10000, first_ephemeral)))
            except OSError:
                s.close()
                continue
            held.append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def started(asked: RouterRequest) -> int:
    """The router started for `asked`: its pid (what went wrong, when it did not start)."""
    answer = router.ensure(asked)
    assert "pid" in answer, answer
    return int(answer["pid"])


@pytest.fixture
def asked(tmp_path: Path) -> Iterator[RouterRequest]:
    """The keys every action of one service's router step carries; its router stopped afterwards."""
    port, metrics = quiet_ports(2)
    common: RouterRequest = {
        "service": "qwen36",
        "source": "/srv/fleet/services/qwen36.yaml",
        "state_dir": str(tmp_path / "state"),
        "log_dir": str(tmp_path / "logs"),
        "port": port,
        "metrics_port": metrics,
        "bind": "127.0.0.1",
        "argv": router_argv(sys.executable, "127.0.0.1", port, "round_robin", metrics),
        "wait_s": 30,
    }
    yield common
    router.stop(common)


def step(common: RouterRequest, *actions: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> list[Any]:
    """The step as a host runs it: the request as its one argument, the results on stdout."""
    sys_argv = sys.argv
    sys.argv = ["router", json.dumps({**common, "actions": list(actions)})]
    try:
        router.main()
    finally:
        sys.argv = sys_argv
    results: list[Any] = json.loads(capsys.readouterr().out)["results"]
    return results


def test_a_router_is_started_once_and_left_alone_when_its_options_are_the_same(
    asked: RouterRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    started, health = step(asked, {"do": "ensure"}, {"do": "health"}, capsys=capsys)
    assert started["router"] == "started" and started["replaced"] is None
    assert health["router_running"] and health["health"] == 200 and health["up"]
    (again,) = step(asked, {"do": "ensure"}, capsys=capsys)
    assert again == {
        "router": "running",
        "pid": started["pid"],
        "log": started["log"],
        "differs": False,
        "do": "ensure",
    }


def test_a_router_with_other_options_is_replaced_only_when_asked(asked: RouterRequest) -> None:
    first = router.ensure(asked)
    other: RouterRequest = {**asked, "argv": [*asked["argv"][:-4], "--policy", "random", *asked["argv"][-4:]]}
    kept = router.ensure(other)
    assert kept["router"] == "running" and kept["pid"] == first["pid"] and kept["differs"]
    replaced = router.ensure({**other, "replace": True})
    assert replaced["router"] == "started" and replaced["replaced"] == first["pid"]
    assert router.running_router(asked)["pid"] == replaced["pid"]  # type: ignore[index]


def test_a_port_another_process_holds_is_refused_naming_it_and_nothing_starts(asked: RouterRequest) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", asked["port"]))
        squatter.listen()
        refused = router.ensure(asked)
    assert refused["error"] == f"port {asked['port']} is in use"
    assert [h["pid"] for h in refused["holders"]] == [os.getpid()]
    assert router.running_router(asked) is None


def test_a_router_that_exits_at_once_is_an_error_with_its_log(asked: RouterRequest) -> None:
    broken: RouterRequest = {**asked, "argv": [*asked["argv"], "--no-such-router-option"]}
    out = router.ensure(broken)
    assert out["error"].startswith("the router exited") and any("no-such-router-option" in x for x in out["log_tail"])


def test_a_worker_is_added_healthy_answers_through_the_router_and_is_removed(asked: RouterRequest, worker: str) -> None:
    router.ensure(asked)
    added = router.add({**asked, "url": worker})
    assert added["added"] == worker and added["id"]
    assert router.add({**asked, "url": worker})["id"] == added["id"]  # listed already: not a second time
    (listed,) = router.workers(asked)["workers"]
    assert listed["url"] == worker and listed["is_healthy"] and listed["circuit_open"] is False
    answer = router.ask({**asked, "served_name": "m", "smoke": {"prompt": "2+2?", "expect": "4"}})["answer"]
    assert answer["status"] == 200 and answer["ok"], answer
    refused = router.remove({**asked, "url": worker, "keep_one_healthy": True, "circuit_wait_s": 0})
    assert "no other healthy worker" in refused["refused"]  # the last one serving is never taken out
    assert router.remove({**asked, "url": worker}) == {"removed": worker, "was_listed": True}
    assert router.workers(asked) == {"workers": []}
    assert router.remove({**asked, "url": worker}) == {"removed": worker, "was_listed": False}


def test_stop_ends_the_router_and_the_service_is_down(asked: RouterRequest) -> None:
    pid = started(asked)
    assert router.stop(asked) == {"ended_pid": pid}
    assert router.running_router(asked) is None
    health = router.health(asked)
    assert not health["router_running"] and health["health"] != 200 and not health["up"]


def test_a_process_that_merely_has_the_recorded_pid_is_not_the_router(asked: RouterRequest) -> None:
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        record = Path(asked["state_dir"]) / "services" / "qwen36" / ROUTER_FILE
        record.parent.mkdir(parents=True)
        record.write_text(
            json.dumps({"pid": bystander.pid, "start_ticks": 1, "boot_id": "x", "source": asked["source"]})
        )
        assert router.running_router(asked) is None
        assert router.stop(asked) == {"ended_pid": None} and bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_the_services_record_merges_what_each_roll_remembers(asked: RouterRequest) -> None:
    assert router.recall(asked) == {"record": {}}
    router.remember({**asked, "replicas": {"a": {"plan": 1}, "b": {"plan": 1}}})
    router.remember({**asked, "replicas": {"a": {"plan": 2, "port": 30001}}})
    replicas = router.recall(asked)["record"]["replicas"]
    assert replicas == {"a": {"plan": 2, "port": 30001}, "b": {"plan": 1}}


def test_the_lease_is_one_runs_until_released_or_left_untouched(asked: RouterRequest) -> None:
    mine: RouterRequest = {**asked, "run_id": "r1", "owner": "op@a", "command": "roll", "ttl_s": 300}
    theirs: RouterRequest = {**mine, "run_id": "r2", "owner": "op@b", "command": "down"}
    assert router.lease({**mine, "peek": True}) == {"held": False}  # nothing made by a peek
    assert not (Path(asked["state_dir"]) / "services").exists()
    assert router.lease(mine) == {"held": False, "taken_over": None}
    held = router.lease(theirs)
    assert held["held"] and held["owner"] == "op@a" and held["command"] == "roll"
    assert router.lease({**theirs, "release": True})["held"]  # not theirs to release
    assert router.lease(mine) == {"held": False, "taken_over": None}  # touched again by its holder
    stale = router.lease({**theirs, "ttl_s": 0})  # left untouched longer than its time to live
    assert stale["held"] is False and stale["taken_over"]["run_id"] == "r1"
    assert router.lease({**theirs, "release": True}) == {"held": False, "released": True}
    assert router.lease(mine) == {"held": False, "taken_over": None}


def test_a_router_started_from_another_service_file_of_the_same_name_is_not_touched(
    asked: RouterRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    pid = started(asked)
    other: RouterRequest = {**asked, "source": "/home/op/qwen36.yaml"}
    (refused,) = step(other, {"do": "stop"}, capsys=capsys)
    assert refused["foreign"] == asked["source"] and refused["do"] == "stop"
    assert router.running_router(asked)["pid"] == pid  # type: ignore[index]


def test_the_first_action_that_fails_ends_the_step(asked: RouterRequest, capsys: pytest.CaptureFixture[str]) -> None:
    results = step(asked, {"do": "workers"}, {"do": "remember", "replicas": {"a": {}}}, capsys=capsys)
    assert [r["do"] for r in results] == ["workers"] and "error" in results[0]  # no router answers
    assert router.recall(asked) == {"record": {}}


class Impostor(BaseHTTPRequestHandler):
    """Anything on the router's port once fleet's router is gone: answers /health as a router would."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


def test_another_process_answering_on_the_routers_port_is_named_not_taken_for_the_router(
    asked: RouterRequest,
) -> None:
    """fleet's router died and something else took its port (another user's server): /health answering
    200 there is no proof the service's router runs, so status and health never report it up."""
    pid = started(asked)
    os.killpg(pid, 9)
    impostor = None
    for _ in range(200):  # until the killed router's socket is gone
        try:
            impostor = ThreadingHTTPServer(("127.0.0.1", asked["port"]), Impostor)
            break
        except OSError:
            threading.Event().wait(0.05)
    assert impostor is not None
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    try:
        health = router.health(asked)
        assert health["health"] is None and not health["router_running"] and health["up"]
        assert f"port {asked['port']} answers, but not from fleet's router: pid {os.getpid()}" in health["text"]
    finally:
        impostor.shutdown()
        impostor.server_close()


def test_a_record_that_cannot_be_read_is_left_alone_by_reads_and_down_does_not_claim_success(
    asked: RouterRequest,
) -> None:
    router.ensure(asked)
    record = Path(asked["state_dir"]) / "services" / "qwen36" / ROUTER_FILE
    record.write_text("{not json")
    assert router.health(asked)["health"] is None  # fleet cannot tell it is its router
    assert record.read_text() == "{not json"  # status and health change nothing
    refused = router.stop(asked)
    assert "cannot be read" in refused["error"] and f"port {asked['port']} is held by pid" in refused["error"]
    assert record.exists()


def test_a_state_directory_others_may_write_is_refused_before_anything_is_made_or_opened(
    asked: RouterRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = Path(asked["state_dir"])
    state.mkdir()
    state.chmod(0o777)
    target = tmp_path / "made-through-a-link"
    (state / "services" / "qwen36").mkdir(parents=True)
    (state / "services" / "qwen36" / "lease.guard").symlink_to(target)
    (result,) = step(asked, {"do": "lease", "run_id": "r1", "ttl_s": 60}, capsys=capsys)
    assert "only they may write" in result["error"] and not target.exists()
    state.chmod(0o755)  # the state directory is fleet's alone; a link planted earlier is still not opened
    (result,) = step(asked, {"do": "lease", "run_id": "r1", "ttl_s": 60}, capsys=capsys)
    assert "error" in result and not target.exists()


def test_the_routers_log_is_never_opened_through_a_link(asked: RouterRequest, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    logs = Path(asked["log_dir"])
    logs.mkdir()
    (logs / "router-qwen36.log").symlink_to(victim)
    with pytest.raises(OSError):  # the step answers it as an error in its own words (main)
        router.ensure(asked)
    assert victim.read_text() == "keep" and router.running_router(asked) is None
