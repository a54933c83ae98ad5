"""Host code every fleet host script shares: prepended to the probe, the act step and the watcher when they
are sent (so it runs under the host's own Python: standard library only, Python 3.8, ASCII), and imported
as a module by tests. Pure parts first: which processes are inference engines, which files are GPUs.

An engine is recognised by what runs, never by a word somewhere in a command line: `tail -f
sglang.launch_server.log` and a process renamed "vim notes-on-sglang serve" are not engines.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import select
import signal
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

try:  # fleet.protocol is prepended before this file when a step is sent to a host
    SECRET_WORD  # noqa: B018
except NameError:  # imported as a module (fleet itself, its tests)
    from fleet.host.words import SECRET_WORD
    from fleet.protocol import ProcessInfo


# Interpreters that run an engine: python, python3, python3.12 (a venv's bin/python included).
PYTHON_RE = re.compile(r"^python[0-9.]*$")
# The titles the engines give their processes (setproctitle): sglang::scheduler_TP0, VLLM::EngineCore.
TITLE_RE = re.compile(r"^(sglang|VLLM)::[A-Za-z0-9_.-]+$")
# The SGLang router (sglang-router, a Rust binary) titles itself like an engine process, holds no GPU and
# serves other servers: never a stale engine to stop.
ROUTER_TITLES = ("sglang::router",)
ENGINE_MODULES = (
    # the server's entry points only: `python -m sglang.srt.<tool>` is a tool, not a server
    ("sglang", re.compile(r"^sglang\.(launch_server$|srt\.entrypoints\.|data_parallel)")),
    ("vllm", re.compile(r"^vllm\.entrypoints\.(?:openai\.)?api_server$")),  # not run_batch, chat or bench
)
# Interpreter options that take a value (python -X dev -W error -m ...).
PYTHON_OPTIONS_WITH_VALUE = ("-X", "-W", "-Q")
LAUNCH_MARK = "fleet-launch"  # first argument of fleet's launcher (python -c SRC fleet-launch EXIT ARGV...)
SHELLS = ("sh", "bash", "dash")


def argv_of(cmdline_bytes: bytes) -> List[str]:
    """/proc/PID/cmdline as a list of words (setproctitle pads with NULs and spaces)."""
    words = cmdline_bytes.decode("utf-8", "replace").split("\0")
    return [w for w in words if w.strip()]


def _module_kind(module: str) -> Optional[str]:
    for kind, pattern in ENGINE_MODULES:
        if pattern.match(module):
            return kind
    return None


def past_options(args: Sequence[str]) -> int:
    """The index in a Python's arguments (its argv less argv[0]) of the first that is no interpreter option:
    the program, or its `-c` or `-m`."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-c" and not args[i].startswith("-m"):
        i += 2 if args[i] in PYTHON_OPTIONS_WITH_VALUE else 1
    return i


def engine_kind(argv: Sequence[str]) -> Optional[str]:
    """'sglang', 'vllm', 'launcher' (fleet's own launcher shell) or None, from a process's argv alone."""
    if not argv:
        return None
    if len(argv) == 1:
        m = TITLE_RE.match(argv[0].strip())
        if m and argv[0].strip() not in ROUTER_TITLES:
            return "sglang" if m.group(1) == "sglang" else "vllm"
    exe = os.path.basename(argv[0])
    if exe in SHELLS and len(argv) > 3 and argv[1] == "-c" and argv[3] == LAUNCH_MARK:
        return "launcher"
    rest = list(argv[1:])
    if PYTHON_RE.match(exe) and len(rest) > 2 and rest[0] == "-c" and rest[2] == LAUNCH_MARK:
        return "launcher"
    if PYTHON_RE.match(exe):
        i = past_options(rest)
        if i < len(rest) and rest[i] == "-c":
            return None  # a program given as text: whatever it says, it is not the engine's entry point
        if i < len(rest) and rest[i].startswith("-m"):
            module = rest[i][2:] or (rest[i + 1] if i + 1 < len(rest) else "")
            return _module_kind(module)
        if i >= len(rest):
            return None
        exe, rest = os.path.basename(rest[i]), list(rest[i + 1 :])  # a console script: python /venv/bin/vllm serve
    if exe in ("sglang", "vllm") and rest[:1] == ["serve"]:
        return exe
    return None


def is_title(argv: Sequence[str]) -> bool:
    """A process known by the title an engine gave it (`sglang::scheduler_TP0`, `VLLM::EngineCore`)."""
    return len(argv) == 1 and bool(TITLE_RE.match(argv[0].strip()))


# multiprocessing's helpers (python [options] -c 'from multiprocessing.forkserver ...'): the forkserver,
# which only forks workers, and a spawned child, which runs its starter's code (a rank of a job)
MP_HELPER = re.compile(r"^from multiprocessing\.(forkserver|spawn|popen_\w+) import ")
Lookup = Callable[[int], Optional[Tuple[int, List[str]]]]  # a process's (ppid, argv), None when it is gone


def mp_helper(argv: Sequence[str]) -> Optional[str]:
    """ "forkserver" or "child" (a spawned process running its starter's code) for multiprocessing's
    helpers, whatever interpreter options they were given; None for anything else."""
    if not argv or not PYTHON_RE.match(os.path.basename(argv[0])):
        return None
    i = 1 + past_options(argv[1:])
    m = MP_HELPER.match(argv[i + 1]) if i + 1 < len(argv) and argv[i] == "-c" else None
    return None if m is None else "forkserver" if m.group(1) == "forkserver" else "child"


def engine_under(argv: Sequence[str], pid: int, lookup: Lookup) -> Optional[str]:
    """engine_kind of process `pid`, where a process known by its title alone counts only under an engine's entry point or
    fleet's launcher (through other titled workers and multiprocessing's helpers), or when the titled
    workers above it were left behind, adopted by init (their server gone). The same titles name the
    workers of sglang.Engine and vllm.LLM in a user's own script, which is no server: whatever the
    script's workers are called, and a spawned child of a job left running is the job's too. (Adopted by
    a subreaper instead, a systemd --user say, they are refused: a process's name proves no adoption.)"""
    kind = engine_kind(argv)
    if kind is None or not is_title(argv):
        return kind  # its parent is read only for a titled process: a host runs hundreds
    own = lookup(pid)
    if own is None:
        return kind  # gone
    ppid, helper = own[0], None
    for _ in range(8):  # up through titled workers and helpers to what started them
        parent = lookup(ppid) if ppid > 1 else None
        if parent is None:
            return None if helper == "child" else kind  # left behind: a server's workers, or a job's rank
        ppid, argv = parent
        helper = mp_helper(argv)
        if helper or is_title(argv):
            continue
        return kind if engine_kind(argv) is not None else None
    return None  # deeper than any engine starts its workers


# GPU daemons, display servers and GPU query tools: never killed, and no reason not to launch (they
# hold /dev/nvidia*, not the GPU's memory). Matched on the program's name and on comm, which the
# kernel truncates to 15 characters.
SAFELISTED = (
    "nvidia-persistenced",
    "nvidia-smi",  # a monitoring agent's query: seen holding the device files of a real H200 box
    "nvtop",
    "Xorg",
    "X",
    "Xwayland",
    "gdm",
    "gdm-x-session",
    "sddm",
    "lightdm",
    "gnome-shell",
    "kwin_x11",
    "kwin_wayland",
)


LOADER_RE = re.compile(r"^ld(-linux[\w.-]*|\.so[\w.]*)$")
LOADER_OPTIONS_WITH_VALUE = ("--library-path", "--preload", "--audit", "--argv0")


def program(cmdline: str) -> str:
    """The program a command line runs, also when it runs through the dynamic loader, as the real H200
    box's monitoring did: `/glibc/ld-linux-x86-64.so.2 --library-path /glibc:/lib64 /bin/nvidia-smi ...`."""
    words = cmdline.split(" ")
    i = 0
    if LOADER_RE.match(os.path.basename(words[0])):
        i = 1
        while i < len(words) and words[i].startswith("--"):
            i += 2 if words[i] in LOADER_OPTIONS_WITH_VALUE else 1
    return os.path.basename(words[i]) if i < len(words) else ""


# The driver's and DCGM's own daemons and tools, by family (nvidia-persistenced, -smi, -cuda-mps-control and
# -server, whose end ends every MPS client, -powerd, -imex, -device-plugin; nv-hostengine, nv-fabricmanager;
# dcgm-exporter): a name list missed the ones it did not know. A program's own name only: a script given
# to an interpreter is matched by exact name (GPU monitors written in Python).
SAFELISTED_FAMILIES = ("nvidia-", "nv-", "dcgm")
SAFELISTED_SCRIPTS = ("nvitop", "gpustat")
INTERPRETER_RE = re.compile(r"^python[\d.]*$")


def safelisted(info: ProcessInfo) -> Optional[str]:
    name_run = program(info["cmdline"]) if info["cmdline"] else ""
    for name in SAFELISTED:
        if name_run == name or info["comm"] == name[:15]:
            return name
    for name in (name_run, info["comm"]):
        if name.startswith(SAFELISTED_FAMILIES):
            return name
    if INTERPRETER_RE.match(name_run):
        words = info["cmdline"].split(" ")
        at = next(i for i, word in enumerate(words) if os.path.basename(word) == name_run)
        script = os.path.basename(words[at + 1]) if at + 1 < len(words) else ""
        if script in SAFELISTED_SCRIPTS:
            return script
    return None


def kill_verdict(
    info: ProcessInfo,
    *,
    me: int,
    own: Tuple[int, int],
    recorded_pgid: Optional[int],
    port: Optional[int],
    force: bool,
    engine: bool,
) -> Tuple[str, str]:
    """What fleet does with one process that holds the GPUs, holds the port (`port` set) or is an engine:
    ("stop" | "refuse" | "leave" | "skip", why). The whole kill policy; docs/reference.md's table states it.

    `own` is (this process's pid, its process group): fleet's own command. `recorded_pgid` is the group
    fleet launched, already checked for exact identity (boot id, leader start ticks). `engine`: whether the
    process is an inference engine (engine_under: what it runs, and what started a titled worker)."""
    if info["pid"] in (1, own[0]) or info["pgid"] == own[1] or info["comm"] == "sshd":
        return "skip", "init, sshd or fleet's own command"
    # fleet's own group, and never another user's process in it (a wrapper may have spawned one)
    fleets = recorded_pgid is not None and info["pgid"] == recorded_pgid and info["uid"] == me
    daemon = safelisted(info)
    if daemon and not engine:
        return "leave", "GPU daemon or tool %s" % daemon
    why = None
    if info["uid"] != me and not fleets:
        why = "process of user %s" % info["user"]
    elif info.get("container") and not fleets:  # fleet's own containers were stopped by name before this
        why = "runs in container %s, which is not this deployment's" % info["container"]
    elif not engine and not fleets:
        why = "holds port %d, not an inference server" % port if port else "not an inference server"
    if why:
        return ("stop" if force else "refuse"), why
    return "stop", "fleet's server" if fleets else "inference server"


# A device file counts as a GPU only when it is a character device (what the NVIDIA driver creates), or
# sits in a directory a simulated host marks as its own: a glob that also matched /dev/null or a user's
# file would make every process holding it a "GPU holder".
SIMULATED_GPUS_MARK = ".fleet-simulated-gpus"


def gpu_device_files(device_glob: str) -> List[str]:
    out: List[str] = []
    for f in sorted(glob.glob(device_glob)):
        if not os.path.basename(f).startswith("nvidia"):
            continue
        try:
            st = os.stat(f)
        except OSError:
            continue
        simulated = os.path.exists(os.path.join(os.path.dirname(f), SIMULATED_GPUS_MARK))
        if (st.st_mode & 0o170000) == 0o020000 or simulated:  # S_IFCHR: a character device
            out.append(f)
    return out


MATCH_LIMIT_S = 2.0  # the smoke pattern is checked at validation too; this bounds what slips through


def bounded_search(pattern: str, text: str, limit_s: float = MATCH_LIMIT_S) -> Optional[bool]:
    """re.search in a child process killed after limit_s: True, False, or None when it ran too long (a
    backtracking pattern must not leave a process spinning on the host after fleet gave up on it)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.write(w, b"1" if re.search(pattern, text) is not None else b"0")
        finally:
            os._exit(0)
    os.close(w)
    answer = b""
    try:
        if readable(r, limit_s):
            answer = os.read(r, 1)
    finally:
        os.close(r)
        if not answer:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return {b"1": True, b"0": False}.get(answer)


def base_url(address: str, port: int) -> str:
    """http://ADDRESS:PORT, an IPv6 address in brackets: a server's URL, on the host and in fleet."""
    return "http://%s:%d" % ("[%s]" % address if ":" in address else address, port)


def http_request(
    method: str,
    url: str,
    body: Any = None,
    timeout: float = 10.0,
    headers: Optional[Dict[str, str]] = None,
    limit: int = 1 << 20,
) -> Tuple[Optional[int], str, float]:
    """(HTTP status, or None when nothing answered; the body, at most `limit` bytes, or what went wrong;
    seconds taken) of one request to a server on this host."""
    import urllib.error  # here, not at the top: ~40 ms of imports a host with no server never needs
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    sent = dict({"Content-Type": "application/json"}, **(headers or {}))
    request = urllib.request.Request(url, data=data, method=method, headers=sent)
    start = time.time()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read(limit).decode("utf-8", "replace"), time.time() - start
    except urllib.error.HTTPError as e:
        return e.code, e.read(limit).decode("utf-8", "replace"), time.time() - start
    except ValueError as e:
        if "header" in str(e):  # http.client refuses a header with a line end, and quotes it: the API key
            return None, "ValueError: a request header (the API key?) holds a line end or control character", 0.0
        return None, "%s: %s" % (type(e).__name__, e), time.time() - start
    except Exception as e:  # refused, reset, timed out
        return None, "%s: %s" % (type(e).__name__, e), time.time() - start


def first_line_of_stdin(limit: int = 1 << 16) -> Dict[str, Any]:
    """The JSON object fleet sends as stdin's first line (what must not be on a command line: keys), read a
    byte at a time so nothing after it is taken from whoever watches stdin for fleet's end."""
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        try:
            chunk = os.read(0, 1)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    try:
        found = json.loads(data.decode("utf-8", "replace") or "{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def readable(fd: int, timeout_s: float) -> bool:
    """Whether `fd` has something to read (or has ended) within `timeout_s`: poll, not select, which fails
    on descriptors past 1023 (a stop holds a pidfd for every process it signals)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout_s * 1000))))


def stdin_closed() -> bool:
    """fleet's end of this step's stdin has closed (fleet held it open while it listens): fleet is gone."""
    try:
        return readable(0, 0) and os.read(0, 4096) == b""
    except (OSError, ValueError):  # no stdin at all: nobody to answer to either
        return True


def api_key_name(argv: Any) -> Optional[str]:
    """The variable whose value the engine takes as --api-key, when its command line names one (written
    SECRET_WORD + NAME: fleet's launcher put the value there), else None."""
    words = [str(w) for w in argv] if isinstance(argv, list) else []
    for i in range(len(words) - 1):  # zip(strict=) is 3.10: host code is 3.8
        if words[i] == "--api-key" and words[i + 1].startswith(SECRET_WORD):
            return words[i + 1][len(SECRET_WORD) :]
    return None


def container_owner(uid: int, state_dir: str) -> str:
    """Whose fleet a container is (label fleet.owner): the user and the state directory (expanded). Under
    a shared docker daemon another user's fleet, or a second state directory, may use the same names."""
    import hashlib

    return hashlib.sha256(("%d:%s" % (uid, os.path.normpath(state_dir))).encode()).hexdigest()[:16]


def at_once(*calls: Callable[[], Any]) -> List[Any]:
    """What each of `calls` returns, in order, the calls run at the same time: each waits on a command of
    its own (docker, podman, nvidia-smi: tens of milliseconds a start), and a deploy waits on them all. An
    exception in one is raised here, after all of them ended."""
    if not calls:
        return []
    results: List[Any] = [None] * len(calls)
    errors: List[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # raised in the caller's thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(1, len(calls))]
    for t in threads:
        t.start()
    run(0)  # the first in this thread: one start fewer
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
