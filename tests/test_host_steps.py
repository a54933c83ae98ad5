"""A fleet step that fails on the host is its own error (exit 8), never "unreachable": the host answered.
Run through real transports: `connection: local` (its own PATH) and real sshd."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import run_cli
from fleet.errors import HostStepError
from fleet.hostscripts import SHARED as SHARED_FILES, STEPS, TEXTS, run_step
from fleet.step_answers import ACT, FIXES
from fleet.transport.local import LocalTransport
from fleet_testbed import simhost


def test_a_host_without_python_is_named_as_such(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no python3 on it
    with pytest.raises(HostStepError) as caught:
        run_step(LocalTransport("h"), "/opt/engine/bin/python", ACT, {})
    assert caught.value.exit_code == 8
    assert caught.value.message == (
        "h: fleet's act step failed on the host (no Python to run it: tried /opt/engine/bin/python, python3)."
    )


def fake_python(tmp_path: Path, prints: str) -> str:
    """An executable standing in for the host's Python: whatever the step, it prints `prints`."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{prints}\nEOF\n")
    path.chmod(0o755)
    return str(path)


def test_a_crashing_host_script_keeps_the_hosts_traceback_for_debug(tmp_path: Path) -> None:
    crashed = json.dumps(
        {"error": "ZeroDivisionError: division by zero", "traceback": "Traceback (most recent call last):"}
    )
    with pytest.raises(HostStepError) as caught:
        run_step(LocalTransport("h"), fake_python(tmp_path, crashed), ACT, {})
    assert "fleet's act step failed on the host (ZeroDivisionError" in caught.value.message
    assert caught.value.remote_traceback == "Traceback (most recent call last):"
    with pytest.raises(HostStepError) as garbage:
        run_step(LocalTransport("h"), fake_python(tmp_path, "Segmentation fault"), ACT, {})
    assert "said no result (exit 0: 'Segmentation fault')" in garbage.value.message


def test_an_operation_the_act_step_does_not_know_does_nothing_and_says_so() -> None:
    with pytest.raises(HostStepError) as caught:
        run_step(LocalTransport("h"), sys.executable, ACT, {"op": "launch-everything", "lock": {}})
    assert "unknown operation 'launch-everything'" in caught.value.message


def test_a_host_traceback_names_fleets_file_and_line(tmp_path: Path) -> None:
    """Each host file is compiled under its own name: the traceback under --debug points at the line."""
    with pytest.raises(HostStepError) as caught:
        run_step(LocalTransport("h"), sys.executable, ACT, {"op": "stop"})  # no lock: the step's main fails
    assert "(KeyError: 'lock')" in caught.value.message
    assert 'File "fleet/host/act.py", line' in caught.value.remote_traceback
    assert "<string>" not in caught.value.remote_traceback


@pytest.mark.ssh
def test_a_broken_host_python_is_a_failed_step_not_an_unreachable_host(
    fleet_env: simhost.Sandbox, tmp_path: Path
) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'this is not python'\nexit 1\n")
    fake.chmod(0o755)
    inventory = yaml.safe_load(fleet_env.inventory.read_text())
    inventory["hosts"]["ct129"]["engines"] = {"sglang": str(fake)}
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(inventory))
    for command in (["stop", "--host", "ct129"], ["deploy", "qwen36-27b", "--host", "ct129"]):
        r = run_cli("-i", str(path), *command)
        assert r.code == 8, r.err
        assert "ct129: fleet's probe failed on the host and said no result" in r.err
        assert "unreachable" not in r.err and "SSH" not in r.err
    h = run_cli("-i", str(path), "health", "--host", "ct129", "--json")
    checks = {c["name"]: c for c in json.loads(h.out)["checks"]}
    assert h.code == 3 and checks["host_step"]["status"] == "unknown" and "ssh" not in checks
    with pytest.raises(HostStepError):
        run_cli("-i", str(path), "--debug", "facts", "--host", "ct129")


def test_a_command_that_exits_before_reading_its_input_is_answered_not_a_transport_crash() -> None:
    # more than a pipe holds: writing it to a command that has already exited raises EPIPE in fleet
    seen: list[bytes] = []
    code = LocalTransport("h").stream("echo said; exit 3", lambda c: seen.append(c) or True, stdin=b"x" * 300_000)
    assert code == 3 and b"".join(seen) == b"said\n"


def test_every_step_leaves_most_of_one_arguments_128_kib_for_its_data() -> None:
    """A script is one argument of one command, capped at 128 KiB by Linux: the act step's plain text
    reached 112 KiB, and a container deploy's data took it over (exit 1, nothing said)."""
    from fleet.hostscripts import STEPS, script_for

    for step in STEPS:
        assert len(script_for(step, {}, ["python3"]).encode()) < 64 << 10, step


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ('{"workers": 5}', "has no list of workers"),
        ('{"workers": {"url": "http://x"}}', "has no list of workers"),
        ("[1, 2]", "is not a JSON object"),
        ("<html>502</html>", "is not a JSON object"),
        ('{"workers": [{"url": 5}, "x", {"url": "http://a:1", "is_healthy": true}]}', None),
    ],
)
def test_router_workers_answers(body: str, said: str | None) -> None:
    """What a router (or whatever answers on its port) says at /workers, read by the router step: nonsense
    is an error the caller can act on, never a traceback, and only well-formed workers are kept."""
    import http.server
    import threading

    from fleet.host.router import workers

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        found = workers({"bind": "127.0.0.1", "port": server.server_address[1]})
    finally:
        server.shutdown()
        server.server_close()
    if said is None:
        assert found == {
            "workers": [{"id": None, "url": "http://a:1", "is_healthy": True, "load": None, "circuit_open": False}]
        }
    else:
        assert said in found["error"]


def poisoned_entry(cache: Path, path: str) -> Path:
    """A cache entry for `path` whose code says it was used (what only its owner could have written)."""
    import hashlib
    import marshal

    from fleet.hostscripts import _shipped

    key = hashlib.sha256(_shipped(path).encode()).hexdigest()[:32]
    entry = cache / "fleet" / "steps" / f"{key}.{sys.implementation.cache_tag}"
    code = compile(
        "import json, sys\nsys.stdout.write(json.dumps({'forgotten': ['cached']}))\nsys.exit(0)", "x", "exec"
    )
    entry.write_bytes(marshal.dumps(code))
    entry.chmod(0o600)
    return entry


@pytest.fixture
def fixes_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The small `fixes` step run locally, its code cached under tmp_path/cache: what it answered."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "state").mkdir()
    args = {"state_dir": str(tmp_path / "state"), "signature": "x", "model": None}
    return lambda: run_step(LocalTransport("h"), sys.executable, FIXES, args)


def test_a_steps_code_is_compiled_once_and_kept_private_in_the_hosts_cache(tmp_path: Path, fixes_step: Any) -> None:
    assert fixes_step() == {"forgotten": []}
    steps = tmp_path / "cache" / "fleet" / "steps"
    kept = sorted(steps.iterdir())
    assert len(kept) == 6 and steps.stat().st_mode & 0o777 == 0o700  # the shared files (SHARED), fixes
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in kept)
    entry = poisoned_entry(tmp_path / "cache", "host/fixes.py")
    assert fixes_step() == {"forgotten": ["cached"]}  # used
    steps.chmod(0o777)  # a directory others may write: nothing in it is trusted
    assert fixes_step() == {"forgotten": []}
    steps.chmod(0o700)
    entry.chmod(0o666)  # an entry others may write: not used
    assert fixes_step() == {"forgotten": []}


def test_a_cache_entry_that_is_a_link_or_garbage_is_compiled_anew(tmp_path: Path, fixes_step: Any) -> None:
    fixes_step()
    entry = poisoned_entry(tmp_path / "cache", "host/fixes.py")
    target = tmp_path / "elsewhere"
    entry.rename(target)
    entry.symlink_to(target)  # the user's own entry, through a link: not followed
    assert fixes_step() == {"forgotten": []}
    entry.unlink(missing_ok=True)
    entry.write_bytes(b"\x00not marshal")  # cut short by a full disk
    entry.chmod(0o600)
    assert fixes_step() == {"forgotten": []}


@pytest.mark.parametrize(
    "path", sorted({f for files in (SHARED_FILES, *STEPS.values(), *TEXTS.values()) for f in files})
)
def test_a_host_file_is_sent_without_its_comment_lines_and_means_the_same(path: str) -> None:
    """What is sent has the source's syntax tree but its docstrings, line and column included (a traceback
    from the host names the line in fleet's file), and no line that is only a comment."""
    import ast

    from fleet.hostscripts import _read, _shipped

    sent = _shipped(path)
    source = ast.parse(_read(path))
    for node in ast.walk(source):  # its docstrings stay here, with the people who read them
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and len(body) > 1 else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            del body[0]  # type: ignore[index]
    assert ast.dump(ast.parse(sent), include_attributes=True) == ast.dump(source, include_attributes=True)
    assert sent.count("\n") == _read(path).count("\n")
    comment_lines = [i for i, line in enumerate(sent.split("\n"), 1) if line.lstrip().startswith("#")]
    assert all(_inside_a_string(sent, i) for i in comment_lines)


def _inside_a_string(text: str, lineno: int) -> bool:
    """Whether line `lineno` lies within a (triple-quoted) string constant of `text`."""
    import ast

    return any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and n.lineno <= lineno <= (n.end_lineno or n.lineno)
        for n in ast.walk(ast.parse(text))
    )


def test_down_forgets_a_router_that_died_before_it(tmp_path: Path) -> None:
    """`fleet down` with the router already dead: the router step's stop had nothing to stop and kept
    the router's record, so `fleet health` went on reporting a service that was taken down."""
    from fleet.host.records import ROUTER_FILE
    from fleet.host.router import health, stop

    dead = subprocess.Popen(["true"])
    dead.wait()
    asked = {"state_dir": str(tmp_path), "service": "qwen36", "bind": "127.0.0.1", "port": 9, "source": "/s.yaml"}
    recorded = tmp_path / "services" / "qwen36" / ROUTER_FILE
    recorded.parent.mkdir(parents=True)
    recorded.write_text(json.dumps({"pid": dead.pid, "start_ticks": 1, "boot_id": "gone", "source": "/s.yaml"}))
    assert health(asked)["up"] is True  # a service brought up whose router died: still the operator's
    assert stop(asked) == {"ended_pid": None}
    assert not recorded.exists() and health(asked)["up"] is False


def test_forgetting_fixes_takes_exactly_what_was_named(tmp_path: Path) -> None:
    """`fleet fixes forget`, run as the host runs it: a signature (all when none), for one model (all when
    none); the engine's own picks are not fixes and stay; a key left with nothing goes; nothing matched,
    nothing written."""
    from fleet.host.records import LEARNED_FILE, read_record, write_record

    state = tmp_path / "state"
    state.mkdir()
    learned = state / LEARNED_FILE
    picks = {"signature": "engine-picks", "learned_at": 3}
    write_record(str(learned), {"fixes": {
        "k1|/models/qwen|sglang-0.5.23": [{"signature": "cuda-graph-oom", "learned_at": 1}, picks],
        "k2|/models/llama|sglang-0.5.23": [{"signature": "cuda-graph-oom", "learned_at": 2}],
        "k3|/models/qwen|sglang-0.5.11": [{"signature": "mamba-extra-buffer", "learned_at": 4}],
    }})  # fmt: skip

    def forget(signature: str | None, model: str | None) -> list[tuple[str, object]]:
        args = {"state_dir": str(state), "signature": signature, "model": model}
        answer = run_step(LocalTransport("h"), sys.executable, FIXES, args)
        return [(f["key"][:2], f["learned_at"]) for f in answer["forgotten"]]

    assert forget("no-such-fix", None) == []
    assert forget("cuda-graph-oom", "/models/qwen") == [("k1", 1)]
    kept = read_record(str(learned))["fixes"]
    assert kept["k1|/models/qwen|sglang-0.5.23"] == [picks] and len(kept) == 3
    assert forget(None, None) == [("k2", 2), ("k3", 4)]
    assert read_record(str(learned))["fixes"] == {"k1|/models/qwen|sglang-0.5.23": [picks]}
    assert forget(None, None) == []
