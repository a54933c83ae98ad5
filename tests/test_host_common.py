"""The host code every host script shares (fleet.host.common), tested here in milliseconds: which processes
are inference engines (by what runs, never by a word in a command line), and that the code stays valid
for the host's own Python (3.8, ASCII)."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import pytest

from fleet.host.common import argv_of, engine_kind
from fleet.hostscripts import SHARED, STEPS, TEXTS

ENGINES = [
    (["/opt/sglang/.venv/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"], "sglang"),
    (["python", "-u", "-X", "dev", "-m", "sglang.launch_server"], "sglang"),
    (["python3.12", "-msglang.launch_server"], "sglang"),
    (["/venv/bin/python", "/venv/bin/sglang", "serve", "--model-path", "/m"], "sglang"),
    (["/venv/bin/vllm", "serve", "/m"], "vllm"),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"], "vllm"),
    (["sglang::scheduler_TP0"], "sglang"),
    (["VLLM::EngineCore"], "vllm"),
    (["/usr/bin/python3", "-c", "import json...", "fleet-launch", "/x.exit", "/p", "-m", "sglang.x"], "launcher"),
    # the shell launcher earlier fleet versions used: their servers are still recognised after an upgrade
    (["/bin/sh", "-c", "set -a; ...", "fleet-launch", "/x.env", "/x.exit", "/p", "-m", "sglang.x"], "launcher"),
]
NOT_ENGINES = [
    ["tail", "-f", "/var/log/sglang.launch_server.log"],  # names the engine, runs tail
    ["vim notes-on-sglang serve flags.md"],  # exec -a: one word that merely mentions the engine
    ["grep", "-r", "vllm serve", "."],
    ["python3", "-c", "import sglang.launch_server"],  # a program given as text is not the entry point
    ["python3", "/home/me/sglang.py", "serve"],  # a script of the same name is not the console script
    ["less", "VLLM::EngineCore"],
    ["sleep", "3600", "fleet-launch"],  # the launcher is recognised by its shape, not by the word
    ["python3", "-c", "fleet-launch"],
    ["python3", "-m", "sglang.srt.some_tool"],  # a tool of SGLang's, not its server (issue 39)
    ["python3", "-m", "sglang.launch_server_helper"],
    [],
]


@pytest.mark.parametrize(("argv", "kind"), ENGINES, ids=[" ".join(a)[:40] for a, _ in ENGINES])
def test_engines_are_recognised_by_what_runs(argv: list[str], kind: str) -> None:
    assert engine_kind(argv) == kind


@pytest.mark.parametrize("argv", NOT_ENGINES, ids=[" ".join(a)[:40] or "empty" for a in NOT_ENGINES])
def test_processes_that_only_mention_an_engine_are_not_engines(argv: list[str]) -> None:
    assert engine_kind(argv) is None


def test_proc_cmdline_padding_from_setproctitle_is_dropped() -> None:
    assert argv_of(b"sglang::scheduler_TP0\x00\x00   \x00") == ["sglang::scheduler_TP0"]


# every file a host runs, its steps and the programs they send as text
HOST_FILES = sorted({f for files in (SHARED, *STEPS.values(), *TEXTS.values()) for f in files})


@pytest.mark.parametrize("path", HOST_FILES)
def test_host_code_is_ascii_and_parses_as_python_3_8(path: str) -> None:
    text = resources.files("fleet").joinpath(path).read_text(encoding="utf-8")
    assert text.isascii(), [line for line in text.splitlines() if not line.isascii()][:3]
    tree = ast.parse(text, feature_version=(3, 8))
    assert not _annotations_python_3_8_cannot_evaluate(tree)


def _annotations_python_3_8_cannot_evaluate(tree: ast.AST) -> list[str]:
    """`dict[str, int]` and `int | None` parse as Python 3.8 but fail there when evaluated: in function
    signatures and at module or class level (local variable annotations are never evaluated)."""
    evaluated: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            evaluated += [a.annotation for a in every if a is not None and a.annotation is not None]
            if node.returns is not None:
                evaluated.append(node.returns)
        if isinstance(node, ast.Module | ast.ClassDef):
            evaluated += [n.annotation for n in node.body if isinstance(n, ast.AnnAssign)]
    bad = []
    for annotation in evaluated:
        for part in ast.walk(annotation):
            builtin_generic = (
                isinstance(part, ast.Subscript)
                and isinstance(part.value, ast.Name)
                and part.value.id in ("dict", "list", "set", "tuple", "frozenset", "type")
            )
            if builtin_generic or (isinstance(part, ast.BinOp) and isinstance(part.op, ast.BitOr)):
                bad.append(ast.unparse(annotation))
    return bad


def test_the_python_3_8_annotation_check_finds_what_3_8_cannot_evaluate() -> None:
    tree = ast.parse("def f(a: dict[str, int]) -> int | None: ...\nclass C:\n    x: list[int]\n")
    assert _annotations_python_3_8_cannot_evaluate(tree) == ["dict[str, int]", "int | None", "list[int]"]


def test_a_rollback_needs_every_secret_the_previous_server_ran_with() -> None:
    from fleet.host.launch import previous_launch

    previous = {"playbook": "p", "plan": {"argv": ["/py", "-m", "sglang.launch_server"], "secret_env": ["HF_TOKEN"]}}
    assert previous_launch(previous, "/logs", {}) == (
        "the previous server needs secrets this run does not carry (HF_TOKEN)"
    )
    back = previous_launch(previous, "/logs", {"HF_TOKEN": "x"})
    assert isinstance(back, dict) and back["argv"][0] == "/py" and back["name"] == "p"
    assert previous_launch(None, "/logs", {}) == "there was no previous server to relaunch"


def test_every_listener_in_the_way_of_a_port_is_a_holder() -> None:
    """fleet's old server on one address and another process on a second: a server binding 0.0.0.0
    collides with both, so both are weighed by the kill policy (once only the lowest pid was)."""
    import os
    import socket
    import subprocess
    import sys

    from fleet.host.procs import port_holders

    mine = socket.socket()
    mine.bind(("127.0.0.1", 0))
    mine.listen()
    port = mine.getsockname()[1]
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import socket, time; s = socket.socket(); s.bind(('127.0.0.2', {port})); s.listen(); "
            "print('up', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == b"up\n"
        holders, invisible = port_holders(port, "0.0.0.0")
        assert holders == {os.getpid(), other.pid} and not invisible
        assert port_holders(port, "127.0.0.2") == ({other.pid}, False)  # a specific address: only its own
        assert port_holders(port, "127.0.0.3") == (set(), False)
    finally:
        other.kill()
        other.wait()
        assert other.stdout is not None
        other.stdout.close()
        mine.close()


# launch() leaves its launcher running unwaited, as the act step does (it ends right after)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_launcher_stops_what_its_engine_left_in_the_group_before_it_says_exited(tmp_path: Path) -> None:
    """An engine that exits and leaves a child behind (a worker, a resource tracker) in the launcher's
    group: the launcher stops it before it writes the exit status, so "exited" means nothing of the
    server runs, and a child that started a session of its own (not the server's) is left alone."""
    import contextlib
    import os
    import signal
    import time

    from fleet.host.launch import launch
    from fleet.host.procs import alive

    engine = tmp_path / "engine.sh"
    engine.write_text(
        # own.pid is written by the child once it runs in its own session: the engine waits for it, so its
        # exit cannot race the setsid (the launcher would rightly stop a child still in the group)
        "#!/bin/sh\nsleep 60 & echo $! > left.pid\nsetsid sh -c 'echo $$ > own.pid.tmp; mv own.pid.tmp own.pid; "
        "exec sleep 60' &\nwhile [ ! -s own.pid ]; do sleep 0.01; done\n"
        "sh -c 'trap \"\" TERM; sleep 60' & echo $! > stubborn.pid\nexit 3\n"
    )
    engine.chmod(0o755)
    launched = launch({"log_dir": str(tmp_path), "name": "x", "attempt": 1, "argv": [str(engine)], "env": {}}, {})
    deadline = time.monotonic() + 20
    while not os.path.exists(launched["exit_file"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path(launched["exit_file"]).read_text().strip() == "3"
    left, own, stubborn = (int((tmp_path / f"{n}.pid").read_text()) for n in ("left", "own", "stubborn"))
    try:
        assert not alive(left) and not alive(stubborn)  # SIGTERM, then SIGKILL for one that ignores it
        assert alive(own)
    finally:
        for pid in (left, own, stubborn):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_a_server_binding_an_ipv6_address_is_in_the_way_only_of_listeners_there() -> None:
    """bind_address ::1 (written any way): a listener on [::1] or a wildcard is in its way, one on an IPv4
    address is not (it was: every IPv6 address counted as every address, and the tables wrote "v6")."""
    import os
    import socket
    import subprocess
    import sys

    from fleet.host.procs import ip_literal, port_holders

    mine = socket.socket(socket.AF_INET6)
    mine.bind(("::1", 0))
    mine.listen()
    port = mine.getsockname()[1]
    other = subprocess.Popen(
        [sys.executable, "-c", f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); "
         "s.listen(); print('up', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert other.stdout is not None and other.stdout.readline() == b"up\n"
        assert ip_literal("0:0:0:0:0:0:0:1") == "::1" and ip_literal("gpu1.lan") is None
        assert port_holders(port, "0:0:0:0:0:0:0:1") == ({os.getpid()}, False)
        assert port_holders(port, "0.0.0.0")[0] == {os.getpid(), other.pid}
    finally:
        other.kill()
        other.communicate()
        mine.close()


# --- signalling only what fleet probed (fleet.host.signals) ----------------------------------------------


def _spawn(argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]


def test_a_pid_whose_start_time_is_not_the_one_probed_is_never_held() -> None:
    """What a reused pid looks like: the same number, another start time. It is not fleet's to signal."""
    from fleet.host.procs import start_ticks
    from fleet.host.signals import hold_process

    child = _spawn(["sleep", "60"])
    try:
        ticks = start_ticks(child.pid)
        assert ticks is not None
        assert hold_process(child.pid, ticks + 1) is None
        assert hold_process(child.pid, ticks, uid=os.getuid() + 1) is None  # not the owner fleet expects either
        held = hold_process(child.pid, ticks, uid=os.getuid())
        assert held is not None and held.alive()
        held.close()
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="needs a Python every user may run")
def test_another_users_non_dumpable_process_is_never_roots_own() -> None:
    """A process that made itself non-dumpable has a /proc/PID owned by root, whoever runs it: read as its
    owner, a fleet running as root took another user's process for its own. Its real uid says who it is."""
    from fleet.host.procs import start_ticks, uid_of
    from fleet.host.signals import hold_process

    code = "import ctypes, sys, time; ctypes.CDLL(None).prctl(4, 0); print('up', flush=True); time.sleep(60)"
    child = _spawn(["/usr/bin/python3", "-c", code], user=65534, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        assert uid_of(child.pid) == 65534
        assert hold_process(child.pid, start_ticks(child.pid), uid=0) is None
    finally:
        child.kill()
        child.wait()
        child.stdout.close()  # type: ignore[union-attr]


def test_a_held_process_that_exited_is_never_signalled_again() -> None:
    """A target that exits during the drain window: its SIGKILL is not sent, to its zombie or to whoever
    gets its pid next (the pidfd names the exited process for good)."""
    from fleet.host.procs import start_ticks
    from fleet.host.signals import hold_process

    child = _spawn(["sleep", "60"])
    held = hold_process(child.pid, start_ticks(child.pid))
    assert held is not None
    assert held.send(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while held.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not held.alive() and not held.send(signal.SIGKILL)  # a zombie: exited, not signalled again
    child.wait()
    assert not held.send(signal.SIGKILL)  # reaped: the pid may be anybody's now
    held.close()


def _fake_sglang(tmp_path: Path) -> Path:
    """A package named sglang whose launch_server only sleeps: the process looks exactly like an engine."""
    pkg = tmp_path / "fake" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text("import time\ntime.sleep(60)\n")
    return tmp_path / "fake"


def test_the_sweep_after_a_stop_reaches_only_the_groups_it_stopped(tmp_path: Path) -> None:
    """Engine-looking processes of fleet's user elsewhere on the host (another container's server, a
    server started by hand) were SIGKILLed by a sweep by name after a stop; only the stopped groups'
    engines are swept now."""
    from fleet.host.act import sweep_stopped_groups
    from fleet.host.common import engine_kind
    from fleet.host.procs import argv_at, start_ticks

    env = dict(os.environ, PYTHONPATH=str(_fake_sglang(tmp_path)))
    bystander = _spawn([sys.executable, "-m", "sglang.launch_server"], env=env, start_new_session=True)
    swept = _spawn([sys.executable, "-m", "sglang.launch_server"], env=env, start_new_session=True)
    try:
        assert wait_for(lambda: engine_kind(argv_at(bystander.pid) or []) == "sglang")
        assert wait_for(lambda: engine_kind(argv_at(swept.pid) or []) == "sglang")
        leader = start_ticks(swept.pid)
        assert leader is not None
        later = {swept.pid: {swept.pid: leader + 1}}  # the id names a group started after the one stopped
        sweep_stopped_groups(later, {})
        assert swept.poll() is None
        sweep_stopped_groups({swept.pid: {swept.pid: leader}}, {})
        assert swept.wait(timeout=10) == -signal.SIGKILL
        assert bystander.poll() is None
    finally:
        for p in (bystander, swept):
            p.kill()
            p.wait()


def wait_for(ok: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_the_launcher_never_signals_another_users_process_in_its_group(tmp_path: Path) -> None:
    """An engine that exits leaving another user's process in its group (root put it there): the launcher
    stops what is fleet's user's, names the other and leaves it running (a killpg as root killed it)."""
    from fleet.host.launch import launch

    assert os.getuid() == 0, "this test needs root to run a process as a second user"
    subprocess.run(["useradd", "--system", "--no-create-home", "fleetdecoy"], capture_output=True)
    engine = tmp_path / "engine.sh"
    engine.write_text(
        "#!/bin/sh\nsleep 60 & echo $! > mine.pid\n"
        "setpriv --reuid=fleetdecoy --regid=fleetdecoy --clear-groups sleep 61 & echo $! > other.pid\n"
        'while [ "$(stat -c %U /proc/$(cat other.pid))" != fleetdecoy ]; do sleep 0.01; done\nexit 3\n'
    )
    engine.chmod(0o755)
    with warnings.catch_warnings():  # the launcher outlives its Popen here, as on a host (it is detached)
        warnings.simplefilter("ignore", ResourceWarning)
        launched = launch({"log_dir": str(tmp_path), "name": "x", "attempt": 1, "argv": [str(engine)], "env": {}}, {})
    assert wait_for(lambda: os.path.exists(launched["exit_file"]), 20)
    mine, other = (int((tmp_path / f"{n}.pid").read_text()) for n in ("mine", "other"))
    try:
        from fleet.host.procs import alive

        assert not alive(mine) and alive(other)
        assert f"left running, another user's: pids [{other}]" in Path(launched["log"]).read_text()
    finally:
        for pid in (mine, other):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _top_level_names(path: str) -> set[str]:
    tree = ast.parse(resources.files("fleet").joinpath(path).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


@pytest.mark.parametrize("step", sorted(STEPS))
def test_no_file_of_a_step_silently_replaces_another_files_names(step: str) -> None:
    """A step's files run in one namespace on the host: a name defined twice is the later file's everywhere.
    host/watch.py's hold() replaced host/signals.py's hold(), and the frozen-client stop crashed on the host
    with a TypeError nobody saw; host/send.py's listing replaced host/pull.py's (issue 38)."""
    seen: dict[str, str] = {}
    clashes = []
    for path in (*SHARED, *STEPS[step]):
        for name in sorted(_top_level_names(path)):
            if name in seen and not name.startswith("__"):
                clashes.append(f"{name}: {seen[name]} and {path}")
            seen.setdefault(name, path)
    assert clashes == []


@pytest.mark.parametrize("which", ["process", "container"])
def test_a_launcher_puts_a_secret_only_after_api_key_and_starts_nothing_without_it(tmp_path: Path, which: str) -> None:
    """The word fleet-secret:NAME becomes the secret's value after --api-key and nowhere else; a missing
    secret starts nothing (exit 127), where the engine once ran with the word itself as its key, or none."""
    import json
    import subprocess
    import sys

    from fleet.host.launch import CONTAINER_LAUNCHER, LAUNCHER

    engine = [
        "sh", "-c", 'echo "$@" > "$0"', str(tmp_path / "argv"),
        "--api-key", "fleet-secret:KEY", "--served-model-name", "fleet-secret:KEY",
    ]  # fmt: skip
    for given, code, seen in (({"KEY": "sk-1"}, "0", "--api-key sk-1 --served-model-name fleet-secret:KEY"),
                              ({}, "127", None)):  # fmt: skip
        exit_file = tmp_path / "exit"
        (tmp_path / "argv").unlink(missing_ok=True)
        if which == "process":
            argv = [sys.executable, "-c", LAUNCHER, "fleet-launch", str(exit_file), *engine]
            stdin = json.dumps({"PATH": "/usr/bin:/bin", **given}) + "\n"
        else:
            secrets = tmp_path / "secrets.json"
            secrets.write_text(json.dumps(given))
            log = tmp_path / "log"
            argv = [sys.executable, "-c", CONTAINER_LAUNCHER, "fleet-launch", str(exit_file), str(log), str(secrets)]
            argv += engine
            stdin = ""
        run = subprocess.run(argv, input=stdin, text=True, capture_output=True, timeout=30)
        assert exit_file.read_text().strip() == code, run
        if seen is None:
            assert not (tmp_path / "argv").exists()
        else:
            assert (tmp_path / "argv").read_text().strip() == seen


def test_a_launcher_that_fails_names_its_file_and_line(tmp_path: Path) -> None:
    """The launcher runs as `python -c` text, compiled under its own file name with its lines kept: a
    traceback in an engine's log points at fleet/host/launchers.py and the line that failed (as a step's
    does), not at `<string>` and a line of the text it was sent as."""
    import subprocess
    import sys

    from fleet.host import launchers
    from fleet.host.launch import LAUNCHER

    argv = [sys.executable, "-c", LAUNCHER, "fleet-launch", str(tmp_path / "exit"), "true"]
    run = subprocess.run(argv, input="not json\n", text=True, capture_output=True, timeout=30)
    source = Path(launchers.__file__).read_text().splitlines()
    failing = next(i for i, line in enumerate(source, 1) if "json.loads(sys.stdin.readline())" in line)
    assert run.returncode == 1 and f'File "fleet/host/launchers.py", line {failing}, in process_main' in run.stderr
    assert not (tmp_path / "exit").exists()  # no environment, no engine


def test_an_engine_check_that_fails_names_its_file_and_line(tmp_path: Path) -> None:
    """The engine's check runs as `python -c` text under the engine's Python, compiled under its name too."""
    import subprocess
    import sys

    from fleet.host import check_sglang
    from fleet.host.check import CHECKS

    run = subprocess.run(  # a Python with no SGLang: its import fails where the check asks the engine
        [sys.executable, "-I", "-c", CHECKS["sglang"], "--model-path", "x"], capture_output=True, text=True, timeout=30
    )
    source = Path(check_sglang.__file__).read_text().splitlines()
    failing = next(i for i, line in enumerate(source, 1) if "from sglang.srt.server_args import" in line)
    assert f'File "fleet/host/check_sglang.py", line {failing}' in run.stderr, run.stderr
    assert run.stderr.rstrip().endswith("ModuleNotFoundError: No module named 'sglang'")


def test_a_frozen_fleets_attempt_is_stopped_through_its_runtime_and_every_late_child_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fleet froze mid-attempt: the watcher stops the attempt's container through docker or podman (a rootful
    engine is root's: signalling fleet's user's processes stopped nothing of it), and its group member by
    member, listed again each round: a worker the engine forks as it stops is stopped too (listed once, it
    ran on)."""
    import json
    import os
    import subprocess
    import time

    from fleet.host import watch as remote_watch
    from fleet.host.procs import alive, start_ticks

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "podman").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/podman.calls\n')
    (bin_dir / "podman").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    # an engine that forks a worker when it is asked to stop, and ignores the request itself
    engine = subprocess.Popen(
        ["sh", "-c", f"trap 'sleep 60 & echo $! > {tmp_path}/late.pid' TERM; while :; do sleep 0.05; done"],
        start_new_session=True,
    )
    state_dir = tmp_path / "state"
    record = state_dir / "deployments" / "x" / "state.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"run_id": "r1", "status": "starting"}))
    box = {"cli": "podman", "id": "c0ffee", "name": "fleet-x"}
    ticks = start_ticks(engine.pid)  # the group's leader as launched: the stop checks it is still that one
    a = {
        "container": box,
        "pgid": engine.pid,
        "start_ticks": ticks,
        "state_dir": str(state_dir),
        "deployment": "x",
        "run_id": "r1",
    }
    monkeypatch.setattr(remote_watch, "ATTEMPT_TERM_S", 1.0)
    time.sleep(0.2)  # the trap is set
    try:
        remote_watch.frozen_client(a, "fleet read nothing", remote_watch.run_lock(a))  # type: ignore[arg-type]
        engine.wait(5)
        late = int((tmp_path / "late.pid").read_text())
        assert not alive(late)
        assert (tmp_path / "podman.calls").read_text().split() == ["stop", "-t", "5", "c0ffee"]
        st = json.loads(record.read_text())
        assert st["status"] == "failed" and "(container fleet-x stopped; " in st["reason"], st
    finally:
        subprocess.run(["pkill", "-9", "-s", str(engine.pid)], capture_output=True)


@pytest.mark.parametrize("pidfds", [True, False])
def test_a_wait_for_stopped_processes_ends_when_the_last_one_has_exited(
    monkeypatch: pytest.MonkeyPatch, pidfds: bool
) -> None:
    """The drain after SIGTERM waits for the held processes, with a pidfd or without one (an older kernel):
    it ends at the deadline while one still runs, and as soon as the last has exited."""
    from fleet.host import signals
    from fleet.host.procs import start_ticks

    if not pidfds:
        monkeypatch.setattr(signals, "_pidfd_open", lambda pid: None)
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        held = {p.pid: signals.hold_process(p.pid, start_ticks(p.pid)) for p in procs}
        assert all(h is not None and (h.fd is not None) == pidfds for h in held.values())
        procs[0].send_signal(signal.SIGTERM)
        signals.wait_ended(held, time.time() + 0.3)  # the deadline: one still runs
        assert [h.alive() for h in held.values() if h] == [False, True]
        procs[1].send_signal(signal.SIGTERM)
        signals.wait_ended(held, time.time() + 60)
        assert not any(h.alive() for h in held.values() if h)
        signals.release(held)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_the_engines_own_memory_fraction_is_held_to_what_the_plan_needs() -> None:
    """The act step's budget check (host/check.py budget_short): short only where the fraction the engine
    resolved leaves each GPU less than the plan's need; nothing said when the engine or fleet says nothing."""
    from fleet.host.check import budget_short

    budget = {"need_mib": 30000, "gpu_mib": 80000}
    accepted = {"verdict": "accepted", "output": ""}
    assert budget_short({**accepted, "resolved": {"memory fraction": "0.3"}}, budget) == {
        "fraction": 0.3, "room_mib": 24000, "need_mib": 30000, "gpu_mib": 80000
    }  # fmt: skip
    assert budget_short({**accepted, "resolved": {"memory fraction": "0.5"}}, budget) is None
    for said in ({}, {"memory fraction": "auto"}, {"memory fraction": "7"}):
        assert budget_short({**accepted, "resolved": said}, budget) is None  # type: ignore[typeddict-item]
    assert budget_short({**accepted, "resolved": {"memory fraction": "0.3"}}, None) is None


SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
# launch() leaves its launcher running unwaited, as the act step does (it ends right after)
LEAVES_ITS_LAUNCHER = pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")


def full_disk_after(monkeypatch: pytest.MonkeyPatch, writes: int) -> None:
    """The host's record writes succeed `writes` times, then fail as a full disk fails them."""
    import errno

    from fleet.host import launch as host_launch

    real, done = host_launch.write_record, [0]

    def write_record(path: str, record: dict[str, object]) -> None:
        done[0] += 1
        if done[0] > writes:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        real(path, record)

    monkeypatch.setattr(host_launch, "write_record", write_record)


def gone_now(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # fleet's launcher is this test's child: reap it once it ends
        if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            return True
        time.sleep(0.05)
    return False


@LEAVES_ITS_LAUNCHER
def test_a_launch_whose_record_cannot_be_written_kills_it_and_relaunches_the_previous_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills between the check and the record: a server fleet could not stop safely later is
    killed at once, and the host is not left without one: the previous server (stopped by this act) is
    started again, recorded unverified, its record rewritten in place when not even a new file fits."""
    from fleet.host import launch as host_launch
    from fleet.host.records import STATE_FILE, write_record

    state = tmp_path / "state"
    state.mkdir()
    previous = {"playbook": "qwen", "status": "ready", "plan": {"argv": SLEEPER, "env": [{"name": "A", "value": "1"}]}}
    write_record(str(state / STATE_FILE), previous)
    started: list[int] = []
    real_launch = host_launch.launch
    monkeypatch.setattr(host_launch, "launch", lambda a, s: started.append((r := real_launch(a, s))["pid"]) or r)
    full_disk_after(monkeypatch, 1)  # the attempt's "starting" record is written, nothing after it
    request = {
        "launch": {"name": "qwen", "attempt": 2, "argv": SLEEPER, "env": {}, "log_dir": str(tmp_path / "logs")},
        "state_update": {"status": "starting", "playbook": "qwen"},
    }
    out: dict[str, object] = {"ended": [{"pid": 4321}]}  # the act stopped the previous server
    try:
        host_launch.launch_and_record(request, {}, str(state), previous, out)  # type: ignore[arg-type]
        new, back = started
        assert out["write_failed"] == {"path": str(state / STATE_FILE), "error": "No space left on device"}
        assert "launched" not in out and gone(new)
        assert out["rolled_back"]["pid"] == back and not gone_now(back)  # type: ignore[index]
        kept = json.loads((state / STATE_FILE).read_text())
        assert kept["status"] == "unverified" and kept["pid"] == back and kept["plan"] == previous["plan"]
    finally:
        for pid in started:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            gone(pid)


@LEAVES_ITS_LAUNCHER
def test_a_record_that_cannot_be_written_with_nothing_stopped_relaunches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleet.host import launch as host_launch

    full_disk_after(monkeypatch, 0)
    request = {
        "launch": {"name": "qwen", "attempt": 1, "argv": SLEEPER, "env": {}, "log_dir": str(tmp_path / "logs")},
        "state_update": {"status": "starting"},
    }
    out: dict[str, object] = {"ended": []}
    previous = {"plan": {"argv": SLEEPER}}
    host_launch.launch_and_record(request, {}, str(tmp_path), previous, out)  # type: ignore[arg-type]
    assert out["write_failed"]["error"] == "No space left on device"  # type: ignore[index]
    assert "launched" not in out and "rolled_back" not in out and "rollback_failed" not in out
    assert not list((tmp_path / "logs").glob("*.log"))  # refused before the launch: nothing started


def test_a_previous_server_in_a_container_is_not_rolled_back_to_by_the_act(tmp_path: Path) -> None:
    from fleet.host.launch import previous_launch

    previous = {"plan": {"argv": ["/py"], "container": {"image": "lmsysorg/sglang"}}}
    assert (
        previous_launch(previous, "/logs", {})
        == "the previous server ran in a container, which only a deploy starts again"
    )


# Leads a group: on the word "fork" on stdin, starts a worker that ignores SIGTERM and says its pid.
LATE_FORKER = (
    "import signal, subprocess, sys\n"
    "sys.stdin.readline()\n"
    "w = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print(1, flush=True); time.sleep(60)'], stdout=subprocess.PIPE)\n"
    "w.stdout.readline()\n"
    "print(w.pid, flush=True)\n"
    "signal.pause()  # SIGTERM ends it\n"
)


def test_a_worker_forked_after_the_table_was_read_is_killed_once_the_members_read_are_gone() -> None:
    """The stop holds the group's members as they are when it signals: one forked after fleet read the
    process table proves the group's id for the SIGKILL round, when every member read before is gone
    and reaped (found by a hostile pass: such a worker, holding its GPU, outlived the stop)."""
    from fleet.host.free import stop_targets
    from fleet.host.procs import process, process_table

    leader = subprocess.Popen(
        [sys.executable, "-c", LATE_FORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    )
    assert leader.stdin is not None and leader.stdout is not None
    worker = 0
    try:
        procs = process_table()
        leader.stdin.write(b"fork\n")
        leader.stdin.flush()
        worker = int(leader.stdout.readline())
        reaper = threading.Thread(target=leader.wait)  # as init would: the leader's pid is no proof once reaped
        reaper.start()
        targets = {leader.pid: dict(procs[leader.pid], why="stale engine")}
        stop_targets(targets, procs, drain_s=1)
        reaper.join(timeout=30)
        assert wait_for(lambda: (process(worker) or {}).get("state") in (None, "Z")), process(worker)
    finally:
        if worker and Path(f"/proc/{worker}").exists():
            os.kill(worker, signal.SIGKILL)
        leader.kill()
        leader.wait()
        leader.stdin.close()
        leader.stdout.close()
