"""The deploy loop, fast: fleet's real host scripts run in a simulated host's own namespaces (no sshd;
fleet_testbed.nshost). Covers what the SSH suite covers slowly: the round trips of a first-time deploy,
a known crash fixed and relaunched, the lock, restart after a failure, and resuming a cut log stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conftest import ROOT
from fleet import events
from fleet.control import ops
from fleet.errors import LockedError
from fleet.inventory import load_playbook
from fleet_testbed import nshost, simhost

E = TypeVar("E")

pytestmark = pytest.mark.skipif(not nshost.available(), reason="needs root, unshare and nsenter")


@pytest.fixture
def host(tmp_path: Path) -> Iterator[nshost.NamespaceHost]:
    h = nshost.NamespaceHost(tmp_path, simhost.CT129, "127.0.3.3")
    yield h
    h.close()


class Events:
    """The deploy's progress events, captured as every listener gets them."""

    def __init__(self) -> None:
        self.seen: list[events.Event] = []

    def __call__(self, event: events.Event) -> None:
        self.seen.append(event)

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.seen if isinstance(e, kind)]


def deploy(h: nshost.NamespaceHost, t: Any = None, playbook: str = "qwen36-27b") -> tuple[Any, Events]:
    seen = Events()
    pb = load_playbook(playbook, ROOT / "playbooks")
    result = ops.deploy(t or h.transport(), h.host, pb, force=False, engine_check=True, progress=seen)
    return result, seen


def state(h: nshost.NamespaceHost) -> dict[str, Any]:
    return json.loads((h.dir / "state" / "state.json").read_text())


def test_a_first_time_deploy_costs_three_round_trips_and_records_the_server(host: nshost.NamespaceHost) -> None:
    result, seen = deploy(host)
    assert result.ok and [a.outcome for a in result.attempts] == ["ready"]
    said = [e.kind for e in seen.seen if not isinstance(e, events.LogLine)]
    assert said == ["planned", "attempt", "engine_check", "stopped", "launched", "ready"]
    assert seen.of(events.LogLine) and seen.of(events.Ready)[0].smoke["ok"]
    assert result.round_trips == 3  # facts, act, watch
    st = state(host)
    assert st["status"] == "ready" and st["schema"] == 1 and st["learned_key"]
    assert "sglang.launch_server" in host.shell(f"cat /proc/{st['pid']}/cmdline | tr '\\0' ' '")
    assert not (host.dir / "state" / "lock.json").exists()


def test_a_known_crash_is_relaunched_with_its_fix_and_given_up_when_it_comes_back(
    host: nshost.NamespaceHost,
) -> None:
    simhost.set_host(
        host.dir,
        inject_scheduler_error=(
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
            "mem_fraction_static=0.85"
        ),
    )
    result, seen = deploy(host)
    assert [e.signature for e in seen.of(events.Relaunching)] == ["sglang-kv-not-enough-memory"]
    assert seen.of(events.Relaunching)[0].fix == "memory fraction +0.04"
    assert [e.outcome for e in seen.of(events.Diagnosed)] == ["crashed", "crashed"]
    assert not result.ok and result.reason == "sglang-kv-not-enough-memory came back after its fix was applied"
    st = state(host)
    assert st["status"] == "failed" and st["learned_key"] and st["attempt"] == 2
    assert not (host.dir / "state" / "lock.json").exists()


def test_a_second_run_while_the_first_holds_the_lock_is_refused(host: nshost.NamespaceHost) -> None:
    assert deploy(host)[0].ok
    (host.dir / "state" / "lock.json").write_text(
        json.dumps({"run_id": "other", "owner": "someone", "since": 1, "command": "deploy", "holder_pid": 1})
    )
    with pytest.raises(LockedError) as caught:
        ops.restart(host.transport(), host.host, force=False, progress=Events())
    assert (
        "locked by someone" in caught.value.message and "its process 1 on the host is running" in caught.value.message
    )


def test_restart_after_a_failed_deploy_keeps_the_learned_key(host: nshost.NamespaceHost) -> None:
    assert deploy(host)[0].ok
    key = state(host)["learned_key"]
    simhost.set_host(host.dir, inject_scheduler_error="RuntimeError: boom")
    assert not ops.restart(host.transport(), host.host, force=False, progress=Events()).ok
    assert state(host)["status"] == "failed" and state(host)["learned_key"] == key
    simhost.set_host(host.dir, inject_scheduler_error=None)
    assert ops.restart(host.transport(), host.host, force=False, progress=Events()).ok
    assert state(host)["learned_key"] == key


@pytest.mark.parametrize("cut_at", [300, 700, 1300, 2100])
def test_a_stream_cut_inside_a_batch_resumes_without_gaps_or_repeats(host: nshost.NamespaceHost, cut_at: int) -> None:
    """The connection drops in the middle of what the watcher wrote at once (several lines read from the
    log together, one of them half sent): every line it never delivered is sent again, none twice."""
    t = host.transport()
    t.cut_after = None
    original_stream = t.stream

    def cut_first_watch(script: str, on_chunk: Any, **kwargs: Any) -> int:
        if "remote_watch" in script or "LogFollower" in script:
            t.stream = original_stream  # type: ignore[method-assign]
            t.cut_after = cut_at
        return original_stream(script, on_chunk, **kwargs)

    t.stream = cut_first_watch  # type: ignore[method-assign]
    result, seen = deploy(host, t)
    assert result.ok and seen.of(events.Reconnecting)
    streamed = [e.line for e in seen.of(events.LogLine)]
    logged = Path(state(host)["log"]).read_text().splitlines()
    assert streamed == logged[: len(streamed)]
    assert any("fired up and ready" in x for x in streamed)
