"""`fleet health` on real sshd with simulated hosts: exit codes, JSON, Prometheus, healing and its limits,
hardware faults, unreachable hosts, overlapping runs, and the crontab entry."""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import CT129, ROOT, run_cli
from fleet_testbed import simhost

pytestmark = pytest.mark.ssh
FLEET = str(Path(sys.executable).parent / "fleet")


def health(*args: str) -> tuple[int, list[dict], str]:
    r = run_cli("health", "--json", *args)
    return r.code, [json.loads(line) for line in r.out.splitlines()], r.err


def by_host(rows: list[dict]) -> dict[str, dict]:
    return {r["host"]: r for r in rows}


def kill_server(sb: simhost.Sandbox) -> None:
    pgid = json.loads(simhost.record(sb.host_dir("ct129"), "state.json").read_text())["pgid"]
    subprocess.run([*simhost.ssh_argv(sb, CT129), f"kill -9 -- -{pgid}"], check=True)


def test_all_healthy_exits_0_and_quiet_prints_nothing(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    code, rows, _ = health()
    assert code == 0 and {r["status"] for r in rows} == {"ok"}
    gen = next(c for c in by_host(rows)["ct129"]["checks"] if c["name"] == "generation")
    assert gen["status"] == "ok" and "Paris" in gen["detail"]
    quiet = run_cli("health", "--quiet", "--lock-file", str(tmp_path / "l"))
    assert quiet.code == 0 and quiet.out == ""


def test_an_unverified_server_that_answers_the_prompt_is_proven_once_and_recorded_ready(
    fleet_env: simhost.Sandbox,
) -> None:
    """A deploy cut off after its launch leaves the server `unverified`: cron's `--quiet` warned about it
    every run until a redeploy, though it served. A right answer to the prompt proves it once, on the host."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    state = simhost.record(fleet_env.host_dir("ct129"), "state.json")
    record = json.loads(state.read_text())
    state.write_text(json.dumps({**record, "status": "unverified", "reason": "fleet's run ended"}))
    code, rows, _ = health("--host", "ct129", "--skip-generation")  # /health alone proves nothing
    server = next(c for c in rows[0]["checks"] if c["name"] == "server")
    assert code == 1 and server["status"] == "warning" and "unverified" in server["detail"]
    code, rows, _ = health("--host", "ct129")
    server = next(c for c in rows[0]["checks"] if c["name"] == "server")
    assert code == 0 and server["status"] == "ok" and "proven now" in server["detail"]
    assert json.loads(run_cli("status", "--host", "ct129", "--json").out)["status"] == "ready"
    assert json.loads(state.read_text())["run_id"] == record["run_id"]
    code, rows, _ = health("--host", "ct129")
    server = next(c for c in rows[0]["checks"] if c["name"] == "server")
    assert code == 0 and "proven" not in server["detail"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a simulated host's own /proc/loadavg needs a mount namespace (root)")
def test_a_host_loaded_beyond_twice_its_cpus_is_a_warning(fleet_env: simhost.Sandbox) -> None:
    """The load is read on the host (each simulated host has its own /proc/loadavg)."""
    cpus = os.cpu_count()  # the simulated hosts have this machine's CPUs
    simhost.set_load(fleet_env, CT129, f"{4.5 * cpus:.2f} 4.00 2.00 12/300 999\n")
    code, rows, _ = health("--skip-generation")
    load = {r["host"]: next(c for c in r["checks"] if c["name"] == "load") for r in rows}
    assert load["ct129"] == {**load["ct129"], "status": "warning", "detail": f"load {4.5 * cpus:.2f} on {cpus} CPUs"}
    assert load["blackwell"]["status"] == "ok" and load["blackwell"]["detail"].startswith("load 0.08 ")
    assert code == 1 and by_host(rows)["ct129"]["status"] == "warning"


def test_a_killed_server_is_critical_and_heal_restarts_it(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    old_pid = json.loads(run_cli("status", "--host", "ct129", "--json").out)["pid"]
    kill_server(fleet_env)
    assert json.loads(run_cli("status", "--host", "ct129", "--json").out)["status"] == "dead"
    code, rows, _ = health("--host", "ct129")
    assert code == 2 and rows[0]["status"] == "critical" and rows[0]["healable"]
    assert any(c["name"] == "server" and "is gone" in c["detail"] for c in rows[0]["checks"])
    code, rows, _ = health("--host", "ct129", "--heal")
    assert rows[0]["heal"] == "qwen36-27b: restarted: server ready" and rows[0]["status"] == "warning" and code == 1
    status = json.loads(run_cli("status", "--host", "ct129", "--json").out)
    assert status["status"] == "ready" and status["pid"] not in (None, old_pid)
    assert health("--host", "ct129")[0] == 0
    kill_server(fleet_env)
    text = run_cli("health", "--host", "ct129", "--heal").out.splitlines()
    assert "server process" in text[0] and "is gone" in text[0] and "heal" not in text[0]
    assert text[1].split() == ["heal:", "qwen36-27b:", "restarted:", "server", "ready"] and len(text) == 2


def test_an_unreadable_deployment_record_is_a_warning_not_an_idle_host(fleet_env: simhost.Sandbox) -> None:
    """A state file edited by hand or cut short by a failing disk: the server can no longer be checked,
    which fleet says, instead of "no fleet deployment recorded" and OK while a server runs unwatched."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    state = simhost.record(fleet_env.host_dir("ct129"), "state.json")
    state.write_text(state.read_text()[:40])
    code, rows, _ = health("--host", "ct129", "--skip-generation")
    checks = {c["name"]: c for c in rows[0]["checks"]}
    assert (
        code == 1 and checks["server"]["status"] == "warning" and "record is unreadable" in checks["server"]["detail"]
    )
    assert checks["fleet_state"]["detail"].startswith(f"unreadable on the host: {state}: ")
    assert json.loads(run_cli("status", "--host", "ct129", "--json").out)["status"] == "unreadable"
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0  # rewrites the record
    record = json.loads(state.read_text())
    state.write_text(json.dumps({**record, "status": "starting"}))  # as left by a fleet run killed mid-deploy
    kill_server(fleet_env)
    assert json.loads(run_cli("status", "--host", "ct129", "--json").out)["status"] == "dead"
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    assert health("--host", "ct129", "--skip-generation")[0] == 0


def test_crash_looping_server_is_healed_at_most_the_rate_limit(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    kill_server(fleet_env)
    healed = health("--host", "ct129", "--heal", "--max-heals-per-hour", "1")[1][0]["heal"]
    assert healed == "qwen36-27b: restarted: server ready"
    kill_server(fleet_env)
    code, rows, _ = health("--host", "ct129", "--heal", "--max-heals-per-hour", "1")
    assert code == 2
    assert rows[0]["heal"] == "qwen36-27b: not healed: 1 heals in the last hour (limit 1); the server is crash-looping"


def test_heals_stamped_in_the_future_still_count_against_the_limit(fleet_env: simhost.Sandbox) -> None:
    """The host's clock was stepped back two hours after three heals: their stamps lie in its future. They
    were dropped, and 6 heals ran in 30 s against a limit of 3 an hour; they count as heals just made."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    kill_server(fleet_env)
    ahead = time.time() + 7200
    simhost.record(fleet_env.host_dir("ct129"), "heals.json").write_text(json.dumps([ahead, ahead + 1, ahead + 2]))
    code, rows, _ = health("--host", "ct129", "--heal", "--max-heals-per-hour", "3")
    assert code == 2
    assert rows[0]["heal"] == "qwen36-27b: not healed: 3 heals in the last hour (limit 3); the server is crash-looping"


def test_a_stop_that_lands_after_the_check_is_never_undone_by_the_heal(fleet_env: simhost.Sandbox) -> None:
    """`fleet health --heal` saw the server down; an operator ran `fleet stop` before the heal's restart
    reached the host. The stop stood only until the heal said "restarted: server ready" (issue 39): the
    host now refuses a heal of a stopped deployment under its lock, and the heal says why."""
    from fleet import events
    from fleet.control import ops
    from fleet.control.sweep import HealthOptions, check_host, heal_host
    from fleet.inventory import load_inventory
    from fleet.transport import SshOptions, connect

    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    kill_server(fleet_env)
    host = load_inventory(fleet_env.inventory).hosts["ct129"]
    t = connect(host, SshOptions(fleet_env.known_hosts, fleet_env.root / "ssh_config"))
    try:
        options = HealthOptions(heal=True)
        checked = check_host(t, host, options)
        assert list(checked.healable) == ["qwen36-27b"]

        def stopped_then_restarted(name: str) -> object:
            assert run_cli("stop", "--host", "ct129").code == 0  # the operator, between check and heal
            return ops.restart(t, host, force=False, progress=events.ignore, name=name, heal=True)

        healed = heal_host(t, host, checked, options, stopped_then_restarted)
    finally:
        t.close()
    assert healed.heal == "qwen36-27b: not healed: stopped by an operator since the check"
    assert json.loads(simhost.record(fleet_env.host_dir("ct129"), "state.json").read_text())["status"] == "stopped"
    assert json.loads(run_cli("status", "--host", "ct129", "--all", "--json").out)["status"] == "stopped"


def test_no_heal_when_the_host_cannot_record_it(fleet_env: simhost.Sandbox) -> None:
    """The rate limit is decided and recorded on the host; where the record cannot be written (here
    heals.json is a directory), nothing is restarted: an unrecorded heal would never count against the
    limit (it did, with no python3 on the host's PATH: three heals in a minute at a limit of one)."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    kill_server(fleet_env)
    simhost.record(fleet_env.host_dir("ct129"), "heals.json").mkdir()
    code, rows, _ = health("--host", "ct129", "--heal")
    assert code == 2 and rows[0]["heal"].startswith(
        "qwen36-27b: not healed: the heal could not be recorded on the host"
    )
    assert json.loads(run_cli("status", "--host", "ct129", "--json").out)["status"] == "dead"


@pytest.mark.parametrize(
    ("hook", "detail"),
    [("serve_garbage", "wrong or no answer: answer ' !!!"), ("generation_http_500", "wrong or no answer: HTTP 500")],
)
def test_healthy_endpoint_but_broken_generation_is_critical(fleet_env: simhost.Sandbox, hook: str, detail: str) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    simhost.set_host(fleet_env.host_dir("ct129"), **{hook: True})
    code, rows, _ = health("--host", "ct129")
    checks = {c["name"]: c for c in rows[0]["checks"]}
    assert code == 2 and checks["http_health"]["status"] == "ok"
    assert checks["generation"]["status"] == "critical" and checks["generation"]["detail"].startswith(detail)


def test_skip_generation_skips_it(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    simhost.set_host(fleet_env.host_dir("ct129"), serve_garbage=True)
    code, rows, _ = health("--host", "ct129", "--skip-generation")
    assert code == 0
    assert {c["name"]: c for c in rows[0]["checks"]}["generation"]["detail"] == "skipped (--skip-generation)"


def test_a_driver_that_does_not_answer_is_critical_not_an_empty_ok(fleet_env: simhost.Sandbox) -> None:
    """NVML and nvidia-smi both failing left no GPU checks to run, and the host read OK."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    simhost.set_host(fleet_env.host_dir("ct129"), nvml_broken=True)  # nvidia-smi still answers
    assert health("--host", "ct129", "--skip-generation")[0] == 0
    simhost.set_host(fleet_env.host_dir("ct129"), nvidia_smi_broken=True)
    code, rows, _ = health("--host", "ct129", "--heal", "--skip-generation")
    gpus = {c["name"]: c for c in rows[0]["checks"]}["gpus"]
    assert code == 2 and gpus["status"] == "critical" and gpus["hardware"]
    assert gpus["detail"].startswith("cannot read the GPUs: NVIDIA-SMI has failed because it couldn't communicate")
    assert rows[0]["heal"] is None  # restarting the engine cannot bring a driver back


def test_xid_and_ecc_faults_are_critical_and_never_healed(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    h = fleet_env.host_dir("ct129")
    (h / "kern.log").write_text("[12345.6] NVRM: Xid (PCI:0000:41:00): 79, pid=0, GPU has fallen off the bus.\n")
    gpus = json.loads((h / "host.json").read_text())["gpus"]
    gpus[1]["ecc_uncorrected"] = 2
    gpus[0]["row_remap_failure"] = True
    simhost.set_host(h, gpus=gpus)
    kill_server(fleet_env)
    code, rows, _ = health("--host", "ct129", "--heal")
    checks = {c["name"]: c for c in rows[0]["checks"]}
    assert code == 2 and not rows[0]["healable"] and rows[0]["heal"] is None
    assert checks["xid 79"]["detail"] == "Xid 79 (GPU has fallen off the bus) on 0000:41:00"
    assert checks["xid 79"]["hardware"] and checks["gpu1 ecc"]["detail"] == "2 uncorrected ECC errors"
    assert checks["gpu0 row_remap"]["hardware"] and "no spare rows left" in checks["gpu0 row_remap"]["detail"]
    assert json.loads(run_cli("status", "--host", "ct129", "--json").out)["status"] == "dead"
    code, rows, _ = health("--host", "ct129")  # the Xid line was seen; only new kernel lines count
    assert "xid 79" not in {c["name"] for c in rows[0]["checks"]}


def test_new_crash_lines_in_the_server_log_are_critical_unless_a_prompt_was_answered(
    fleet_env: simhost.Sandbox,
) -> None:
    """A crash line is critical only when the server fails a real prompt. Whatever reached the log (a
    forged line, an old one), a server that answers one in the same check is warned of, never healed;
    with --skip-generation a crash line gets the prompt asked all the same, before anything is decided."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    health("--host", "ct129")
    hdir = fleet_env.host_dir("ct129")
    pid = json.loads(simhost.record(hdir, "state.json").read_text())["pid"]
    log = Path(json.loads(simhost.record(hdir, "state.json").read_text())["log"])
    crash_line = "[2026-11-29 12:00:00 TP1] RuntimeError: CUDA error: an illegal memory access was encountered\n"
    for asked in (("--heal", "--skip-generation"), ("--heal",)):
        with log.open("a") as f:
            f.write(crash_line)
        code, rows, _ = health("--host", "ct129", *asked)
        checks = {c["name"]: c for c in rows[0]["checks"]}
        assert checks["generation"]["status"] == "ok", checks
        assert code == 1 and checks["crash_log"]["status"] == "warning", checks["crash_log"]
        assert checks["crash_log"]["detail"].startswith("illegal_memory_access (illegal-memory-access)")
        assert "answered a prompt" in checks["crash_log"]["detail"]
        assert not rows[0]["healable"] and rows[0]["heal"] is None
    assert json.loads(simhost.record(hdir, "state.json").read_text())["pid"] == pid  # never restarted
    simhost.set_host(hdir, serve_garbage=True)  # the server has gone bad: its answers are wrong
    with log.open("a") as f:
        f.write(crash_line)
    code, rows, _ = health("--host", "ct129", "--skip-generation")
    checks = {c["name"]: c for c in rows[0]["checks"]}
    assert code == 2 and checks["crash_log"]["status"] == "critical" and rows[0]["healable"], checks


def test_json_and_prometheus_outputs_parse(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    prom = tmp_path / "fleet.prom"
    code, rows, _ = health("--textfile", str(prom))
    assert {"host", "status", "checks", "gpus", "server_up", "healable", "heal", "duration_s"} <= set(rows[0])
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    status = {s.labels["host"]: s.value for s in families["fleet_host_status"].samples}
    assert status == {"blackwell": 0.0, "ct129": 0.0}, rows
    assert {s.labels["host"] for s in families["fleet_server_up"].samples if s.value == 1} == {"ct129"}
    up = {(s.labels["host"], s.labels["deployment"]): s.value for s in families["fleet_deployment_up"].samples}
    assert up == {("ct129", "qwen36-27b"): 1.0}
    generation = [s for s in families["fleet_check_status"].samples if s.labels["check"] == "generation"]
    assert [(s.labels["deployment"], s.value) for s in generation] == [("qwen36-27b", 0.0)]
    assert len([s for s in families["fleet_gpu_memory_used_bytes"].samples if s.labels["host"] == "blackwell"]) == 8
    assert not list(tmp_path.glob(".fleet.prom.*"))  # written atomically: no temp file left


def test_a_second_overlapping_run_exits_at_once(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    lock = tmp_path / "health.lock"
    with lock.open("a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("pid 1 since earlier")
        held.flush()
        start = time.monotonic()
        r = run_cli("health", "--lock-file", str(lock))
        assert time.monotonic() - start < 2
    assert r.code == 3 and "another run is in progress (pid 1 since earlier)" in r.err


@pytest.fixture(scope="module")
def twenty(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, simhost.Sandbox]:
    """18 simulated hosts behind real sshd, plus one that refuses and one that never answers SSH."""
    root = tmp_path_factory.mktemp("twenty")
    specs = [replace(simhost.extra_host(i), address=f"127.0.4.{i}") for i in range(1, 19)]
    sb = simhost.up(root, specs, 2422)
    silent = socket.socket()
    silent.bind(("127.0.4.100", 2422))
    silent.listen(50)  # accepts TCP, never speaks SSH
    inv = sb.inventory.read_text().replace("connect_timeout_s: 5", "connect_timeout_s: 2")
    inv = inv.replace(
        "hosts:\n", "hosts:\n  refusing:\n    address: 127.0.4.99\n  silent:\n    address: 127.0.4.100\n", 1
    )
    path = root / "twenty.yaml"
    path.write_text(inv)
    yield path, sb
    silent.close()
    simhost.down(root)


def test_twenty_hosts_two_unreachable_all_reported_in_time(
    twenty: tuple[Path, simhost.Sandbox], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As cron runs it: the `fleet` program, whose cold sweep deals the hosts out to several processes."""
    path, sb = twenty
    for k, v in sb.env().items():
        monkeypatch.setenv(k, v)
    start = time.monotonic()
    argv = ["-i", str(path), "health", "--json", "--deadline", "30", "--lock-file", str(tmp_path / "l")]
    log = tmp_path / "health.log"
    r = subprocess.run([FLEET, *argv, "--log-file", str(log)], capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    rows = by_host([json.loads(line) for line in r.stdout.splitlines()])
    assert len(rows) == 20 and elapsed < 30
    assert {rows[h]["status"] for h in ("refusing", "silent")} == {"unknown"}
    assert "cannot connect" in rows["refusing"]["checks"][0]["detail"]
    assert sum(1 for row in rows.values() if row["status"] == "ok") == 18
    assert r.returncode == 3
    [swept] = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "hosts_swept"]
    assert (swept["hosts"], swept["processes"]) == (20, min(len(os.sched_getaffinity(0)), 3))
    crit = run_cli("-i", str(path), "health", "--unreachable", "critical", "--lock-file", str(tmp_path / "l"))
    assert crit.code == 2


@pytest.fixture
def saved_crontab():  # type: ignore[no-untyped-def]
    before = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
    yield
    if before.returncode == 0:
        subprocess.run(["crontab", "-"], input=before.stdout, text=True, check=True)
    else:
        subprocess.run(["crontab", "-r"], capture_output=True)


def test_cron_install_show_remove_with_the_real_crontab(saved_crontab: None, tmp_path: Path) -> None:
    subprocess.run(["crontab", "-"], input="# my own line\n0 3 * * * /usr/bin/true\n", text=True, check=True)
    (tmp_path / "known-crashes").mkdir()
    r = run_cli(
        *("--services", str(tmp_path / "svc"), "--crashes", str(tmp_path / "known-crashes")),
        *("cron", "install", "--schedule", "*/5 * * * *", "--heal", "--deadline", "900"),
        *("--log-file", str(tmp_path / "h.log")),
    )
    assert r.code == 0
    table = subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout
    assert "0 3 * * * /usr/bin/true" in table
    entry = [line for line in table.splitlines() if "health" in line and not line.startswith("#")]
    assert len(entry) == 1 and entry[0].startswith("*/5 * * * * ")
    assert " health --quiet --heal --deadline 900 --log-file " in entry[0]  # room for a restart
    # cron checks and heals the services and uses the knowledge this shell named, not only the playbooks
    assert f"FLEET_SERVICES={tmp_path / 'svc'} " in entry[0]
    assert f"FLEET_CRASHES={tmp_path / 'known-crashes'} " in entry[0]
    run_cli("cron", "install", "--schedule", "* * * * *")  # replaces, never duplicates
    assert subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout.count(" health --quiet") == 1
    assert "* * * * * " in run_cli("cron", "show").out
    assert run_cli("cron", "remove").out.strip() == "removed"
    table = subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout
    assert "health" not in table and "0 3 * * * /usr/bin/true" in table


def test_a_cache_directory_that_cannot_be_written_is_a_clear_error(
    saved_crontab: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service account's HOME is often /nonexistent or read-only: fleet's default lock, logs and pool
    sockets cannot go there. Said before anything runs (health: unknown, 3), and no crontab line is
    written that would fail every time."""
    subprocess.run(["crontab", "-"], input="0 3 * * * /usr/bin/true\n", text=True, check=True)
    monkeypatch.setenv("XDG_CACHE_HOME", "/proc/fleet-cache")
    said = "fleet's cache directory /proc/fleet-cache/fleet cannot be written"
    r = run_cli("-i", str(ROOT / "inventory" / "hosts.yaml"), "health", "--host", "ct129")
    assert r.code == 3 and said in r.err and "Set XDG_CACHE_HOME" in r.err
    for argv in (("pool", "start"), ("pool", "serve"), ("cron", "install")):
        r = run_cli(*argv)
        assert r.code == 2 and said in r.err and "Traceback" not in r.err, argv
    assert subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout == "0 3 * * * /usr/bin/true\n"


def test_cron_commands_without_crontab_installed_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no crontab program (was a FileNotFoundError traceback)
    for argv in (("cron", "show"), ("cron", "install"), ("cron", "remove")):
        r = run_cli(*argv)
        assert r.code == 2 and "crontab is not installed on this machine." in r.err and "apt-get install cron" in r.err


def as_cron_runs_it(entry: str) -> str:
    """The command cron hands to /bin/sh for a crontab line: after the five time fields, up to the first
    unescaped `%` (the rest would be its stdin), with `\\%` read as `%` (vixie cron's do_command.c)."""
    command = entry.split(None, 5)[5]
    return re.split(r"(?<!\\)%", command, maxsplit=1)[0].replace("\\%", "%")


def test_the_installed_cron_line_runs_as_cron_runs_it(
    fleet_env: simhost.Sandbox, saved_crontab: None, tmp_path: Path
) -> None:
    """cron's own environment (no venv on PATH, a bare HOME), a log directory that does not exist yet
    (the shell's `>>` opens it before fleet runs) and a `%` in a path (a newline to cron, unless escaped)."""
    log = tmp_path / "100%" / "not-yet" / "health.log"
    assert run_cli("cron", "install", "--schedule", "* * * * *", "--log-file", str(log)).code == 0
    [entry] = [
        x
        for x in subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout.splitlines()
        if " health " in x and not x.startswith("#")
    ]
    cron_env = {"HOME": str(tmp_path), "LOGNAME": "root", "SHELL": "/bin/sh", "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        ["/bin/sh", "-c", as_cron_runs_it(entry)], env=cron_env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stdout == r.stderr == "", r
    assert log.with_name("health.log.out").read_text() == ""  # --quiet: every host OK, nothing printed
    swept = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "hosts_swept"]
    assert len(swept) == 1 and swept[0]["hosts"] == 2


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("--log-file", "/tmp/x.log\n* * * * * touch /tmp/fleet-PWNED #"),
        ("FLEET_PLAYBOOKS", "/tmp/pb\n* * * * * touch /tmp/fleet-PWNED #"),
        ("PYTHONPATH", "/x\r* * * * * touch /tmp/fleet-PWNED"),
        ("--schedule", "*/5 * * *\n*"),  # five valid fields, a newline between two of them
    ],
)
def test_a_newline_cannot_add_crontab_lines(
    saved_crontab: None, monkeypatch: pytest.MonkeyPatch, var: str, value: str
) -> None:
    """Every value that reaches the crontab line is refused with a control character in it, the table
    left as it was (it used to gain a line of the attacker's, which `cron remove` then left behind)."""
    subprocess.run(["crontab", "-"], input="0 3 * * * /usr/bin/true\n", text=True, check=True)
    argv = ["cron", "install"]
    if var.startswith("--"):
        argv += [var, value]
    else:
        monkeypatch.setenv(var, value)
    r = run_cli(*argv)
    assert r.code == 2 and "control character" in r.err, r.err
    assert subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout == "0 3 * * * /usr/bin/true\n"
    assert not Path(value).exists()  # nothing was created either


def test_cron_schedule_is_validated() -> None:
    r = run_cli("cron", "install", "--schedule", "every minute; rm -rf /")
    assert r.code == 2 and "is not five cron fields" in r.err


def test_generation_is_skipped_when_the_server_served_traffic_since_the_last_check(
    fleet_env: simhost.Sandbox, tmp_path: Path
) -> None:
    import urllib.request

    pbs = tmp_path / "pbs"
    pbs.mkdir()
    (pbs / "metrics.yaml").write_text(
        (ROOT / "playbooks" / "qwen36-27b.yaml").read_text() + "extra_args: [--enable-metrics]\n"
    )
    assert run_cli("--playbooks", str(pbs), "deploy", "metrics", "--host", "ct129").code == 0
    first = {c["name"]: c for c in health("--host", "ct129")[1][0]["checks"]}
    assert first["generation"]["detail"].startswith("answer")  # no traffic seen yet: a real generation
    req = urllib.request.Request(
        f"http://{CT129.address}:30000/v1/chat/completions",
        data=json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=5).read()
    second = {c["name"]: c for c in health("--host", "ct129")[1][0]["checks"]}
    assert second["generation"]["detail"] == "skipped (served traffic since the last check)"
    third = {c["name"]: c for c in health("--host", "ct129")[1][0]["checks"]}
    assert third["generation"]["detail"].startswith("answer")  # health's own request is not traffic
    # Traffic skips the prompt only while a right answer is recent: an old proof, or one stamped in the
    # future by a clock stepped back, is no reason to skip (a garbage server stayed OK under traffic).
    book_path = fleet_env.host_dir("ct129") / "state" / "health.json"
    for stamp in (time.time() - 1000, time.time() + 7200):
        book = json.loads(book_path.read_text())
        book["deployments"]["metrics"]["generation_proved_at"] = stamp
        book_path.write_text(json.dumps(book))
        urllib.request.urlopen(req, timeout=5).read()
        again = {c["name"]: c for c in health("--host", "ct129")[1][0]["checks"]}
        assert again["generation"]["detail"].startswith("answer"), (stamp, again["generation"])
    urllib.request.urlopen(req, timeout=5).read()
    recent = {c["name"]: c for c in health("--host", "ct129")[1][0]["checks"]}
    assert recent["generation"]["detail"] == "skipped (served traffic since the last check)"


def test_checks_that_did_not_run_are_no_proof_for_keeping_a_server() -> None:
    """deploy keeps ("adopts") a running server only when its checks ran and passed: a health probe that
    failed on the host returns no server checks, and once read as a server that passed them."""
    from fleet.control.adopt import adoption_problems
    from fleet.health import OK, Check, HostHealth, unreachable

    assert adoption_problems(unreachable("ct129", "health probe failed: AttributeError"), "m") == [
        "generation: not checked",
        "http_health: not checked",
        "server: not checked",
        "ssh: health probe failed: AttributeError",
    ]
    proven = HostHealth(
        "ct129",
        OK,
        tuple(Check(name, OK, "fine", deployment="m") for name in ("server", "http_health", "generation")),
    )
    assert adoption_problems(proven, "m") == []
    assert adoption_problems(proven, "other") == [  # another deployment's checks prove nothing about this one
        "generation: not checked",
        "http_health: not checked",
        "server: not checked",
    ]


def test_host_text_with_a_newline_never_starts_a_line_of_fleets_own(fleet_env: simhost.Sandbox) -> None:
    """A record's reason (or an answer's body, or another user's command line) is the host's text: with a
    newline in it, it must not print a line that reads as another host's verdict."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    state = simhost.record(fleet_env.host_dir("ct129"), "state.json")
    record = json.loads(state.read_text())
    forged = "blackwell    OK        qwen35-nvfp4       all checks ok"
    state.write_text(json.dumps({**record, "status": "failed", "reason": f"boom\n{forged}\x1b[2K"}))
    r = run_cli("health", "--host", "ct129")
    assert r.code == 2 and "boom\\nblackwell" in r.out, r.out
    assert not any(line.startswith("blackwell") for line in r.out.splitlines()) and "\x1b" not in r.out


def test_one_damaged_record_costs_only_its_own_checks_and_lost_bookkeeping_is_said(
    fleet_env: simhost.Sandbox,
) -> None:
    """A record edited or cut short (a plan that is a string, a group whose hosts are a number) turned
    the whole host unknown, GPUs and every other deployment unchecked, or printed a traceback; and a
    health.json that could not be written was never said (the same crash lines then came back each run)."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    hdir = fleet_env.host_dir("ct129")
    state = simhost.record(hdir, "state.json")
    record = json.loads(state.read_text())
    for damage in ({"plan": "x"}, {"log": ["a"]}, {"check_address": 5}, {"group": {"rank": 1, "hosts": 5}}):
        state.write_text(json.dumps({**record, **damage}))
        code, rows, err = health("--host", "ct129")
        checks = {c["name"]: c for c in rows[0]["checks"]}
        assert "Traceback" not in err and rows[0]["status"] != "unknown", (damage, rows[0])
        assert "load" in checks and "server" in checks, (damage, sorted(checks))  # the rest of the host too
    state.write_text(json.dumps(record))
    book = hdir / "state" / "health.json"
    book.write_text(json.dumps({**json.loads(book.read_text()), "schema": 99}))  # a newer fleet's
    code, rows, _ = health("--host", "ct129")
    said = [c["detail"] for c in rows[0]["checks"] if c["name"] == "fleet_state"]
    assert any("bookkeeping not kept" in d for d in said), rows[0]["checks"]
