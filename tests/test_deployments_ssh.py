"""Two deployments on one box over real sshd: started at once, one restarted while the other answers a
steady stream of requests (none may fail), status and facts per deployment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import BLACKWELL, ROOT, Background, run_cli
from fleet_testbed import simhost
from simengine import chat, http, wait_until

pytestmark = pytest.mark.ssh
FLEET = str(Path(sys.executable).parent / "fleet")


def placed(d: Path, name: str, base: str, port: int, gpus: str, more: str = "") -> None:
    text = (ROOT / "playbooks" / f"{base}.yaml").read_text().replace("port: 30000", f"port: {port}")
    (d / f"{name}.yaml").write_text(text + f"gpus: {gpus}\n" + more)


def test_two_deployments_start_together_and_a_restart_of_one_drops_no_request_to_the_other(
    fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    placed(playbooks, "big", "qwen35-nvfp4", 30000, "[0, 1, 2, 3]")
    placed(playbooks, "small", "qwen36-27b", 30100, "[6, 7]")
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(playbooks))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "testbed")}
    both = [
        subprocess.Popen([FLEET, "deploy", name, "--host", "blackwell"], env=env, stderr=subprocess.PIPE, text=True)
        for name in ("big", "small")
    ]
    said = [p.communicate(timeout=300)[1] for p in both]
    assert [p.returncode for p in both] == [0, 0], said
    hdir = fleet_env.host_dir("blackwell")
    small = json.loads(simhost.record(hdir, "state.json", "small").read_text())
    big = json.loads(simhost.record(hdir, "state.json", "big").read_text())
    assert (small["gpus"], big["gpus"]) == ([6, 7], [0, 1, 2, 3])

    failures: list[object] = []
    answered = 0
    stop = threading.Event()

    def ask_small() -> None:
        nonlocal answered
        while not stop.is_set():
            code, body = chat(BLACKWELL.address, 30100, "The capital of France?", served=small["served_name"])
            if code == 200:
                answered += 1
            else:
                failures.append((code, body))

    client = threading.Thread(target=ask_small)
    client.start()
    try:
        r = run_cli("restart", "--host", "blackwell/big")
    finally:
        stop.set()
        client.join(timeout=30)
    assert r.code == 0, r.err
    assert failures == [] and answered > 0
    after = json.loads(simhost.record(hdir, "state.json", "small").read_text())
    assert after["pid"] == small["pid"]
    assert json.loads(simhost.record(hdir, "state.json", "big").read_text())["pid"] != big["pid"]
    status = run_cli("status", "--host", "blackwell", "--json")
    rows = [json.loads(line) for line in status.out.splitlines()]
    assert [(r["deployment"], r["status"], r["port"]) for r in rows] == [
        ("big", "ready", 30000),
        ("small", "ready", 30100),
    ]
    facts = json.loads(run_cli("facts", "--host", "blackwell", "--json").out)
    held = {**{str(i): "deployment big" for i in range(4)}, "6": "deployment small", "7": "deployment small"}
    assert facts["gpu_holders"] == held
    overlap = run_cli("deploy", "small", "--host", "blackwell", "--name", "third", "--gpus", "3,4")
    assert overlap.code == 4 and "overlap deployment big on GPUs 0,1,2,3" in overlap.err
    one = json.loads(run_cli("health", "--host", "blackwell/small", "--json").out)
    assert {c["deployment"] for c in one["checks"]} == {None, "small"} and one["status"] == "ok", one
    stopped = run_cli("stop", "--host", "blackwell")
    assert stopped.code == 0 and "stopped" in stopped.out
    rows = [json.loads(line) for line in run_cli("status", "--host", "blackwell", "--all", "--json").out.splitlines()]
    assert {r["status"] for r in rows} == {"stopped"}


def test_a_host_deployed_by_the_previous_fleet_is_upgraded_in_place(fleet_env: simhost.Sandbox) -> None:
    """The one state.json an older fleet kept per host (written here as it wrote it): status shows it as
    the deployment its playbook names, deploy proves and keeps its server, stop finds and stops it."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    hdir = fleet_env.host_dir("ct129")
    current = simhost.record(hdir, "state.json")
    old = json.loads(current.read_text())
    old = {k: v for k, v in old.items() if k not in ("deployment", "gpus")} | {"schema": 1}
    (hdir / "state" / "state.json").write_text(json.dumps(old))
    for leftover in current.parent.iterdir():
        leftover.unlink()
    current.parent.rmdir()
    rows = [json.loads(line) for line in run_cli("status", "--host", "ct129", "--json").out.splitlines()]
    assert [(r["deployment"], r["status"], r["pid"]) for r in rows] == [("qwen36-27b", "ready", old["pid"])]
    again = json.loads(run_cli("deploy", "qwen36-27b", "--host", "ct129", "--json").out)
    assert again["ok"] and again["adopted"]
    assert run_cli("stop", "--host", "ct129").code == 0
    assert not (hdir / "state" / "state.json").exists()
    assert json.loads(simhost.record(hdir, "state.json").read_text())["status"] == "stopped"


def test_a_stop_beside_an_all_gpu_deployment_leaves_it_serving_and_unmentioned(
    fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38's first defect's scenario, over sshd: `fleet stop` of a deployment beside one on all GPUs
    (whose record names no GPU) once waited 30 s for memory the other keeps, then listed the other's
    processes as "not stopped ... --force stops it". It stops nothing of the other and says nothing of it,
    and waits only for the memory of what it does stop; a stop of the host stops it. (The host step's own
    part, a sibling on all GPUs counted on each, is test_deployments.py's
    test_a_sibling_on_all_gpus_runs_on_every_one.)"""
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    placed(playbooks, "small", "qwen36-27b", 30100, "[0, 1]")
    placed(playbooks, "whole", "qwen36-27b", 30200, "all", "mem_fraction: 0.5\n")  # room beside it
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(playbooks))
    assert run_cli("deploy", "small", "--host", "blackwell").code == 0
    assert run_cli("stop", "--host", "blackwell/small").code == 0
    assert run_cli("deploy", "whole", "--host", "blackwell").code == 0
    whole = json.loads(simhost.record(fleet_env.host_dir("blackwell"), "state.json", "whole").read_text())
    assert "gpus" not in whole  # every GPU: the record names none

    again = run_cli("stop", "--host", "blackwell/small")
    said = again.out + again.err
    assert again.code == 0 and "not stopped" not in said and "--force" not in said and "whole" not in said, said
    rows = {r["deployment"]: r for r in map(json.loads, run_cli("status", "--json").out.splitlines())}
    assert rows["whole"]["status"] == "ready" and rows["whole"]["pid"] == whole["pid"]

    # an engine started by hand on small's GPUs: stopped, and only its memory waited for there (a stop
    # that counted whole's memory on them waits out its 30 s, and says the GPUs are still in use)
    hdir = fleet_env.host_dir("blackwell")
    by_hand = (
        f"cd {hdir} && setsid env/bin/python -m sglang.launch_server --model-path models/Qwen3.6-27B "
        f"--host {BLACKWELL.address} --port 30300 --tp 2 --mem-fraction-static 0.3 >/dev/null 2>&1; sleep 60"
    )
    with Background([*simhost.ssh_argv(fleet_env, BLACKWELL), by_hand]):
        assert wait_until(lambda: http(f"http://{BLACKWELL.address}:30300/health")[0] == 200, timeout=60)
        third = run_cli("stop", "--host", "blackwell/small")
    said = third.out + third.err
    assert third.code == 0 and "stopped 4 process(es)" in said and "still in use" not in said, said
    assert "not stopped" not in said and "whole" not in said, said

    assert run_cli("stop", "--host", "blackwell").code == 0
    rows = {r["deployment"]: r for r in map(json.loads, run_cli("status", "--all", "--json").out.splitlines())}
    assert rows["whole"]["status"] == "stopped"
