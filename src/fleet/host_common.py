"""Host code every fleet host script shares: prepended to the probe, the act step and the watcher when they
are sent (so it runs under the host's own Python: standard library only, Python 3.8, ASCII), and imported
as a module by tests. Pure parts first: which processes are inference engines, which files are GPUs.

An engine is recognised by what runs, never by a word somewhere in a command line: `tail -f
sglang.launch_server.log` and a process renamed "vim notes-on-sglang serve" are not engines.
"""

import contextlib
import glob
import json
import os
import re
import select
import signal
import time
from typing import Any, Dict, List, Optional, Sequence

# Interpreters that run an engine: python, python3, python3.12 (a venv's bin/python included).
PYTHON_RE = re.compile(r"^python[0-9.]*$")
# The titles the engines give their processes (setproctitle): sglang::scheduler_TP0, VLLM::EngineCore.
TITLE_RE = re.compile(r"^(sglang|VLLM)::[A-Za-z0-9_.-]+$")
ENGINE_MODULES = (
    ("sglang", re.compile(r"^sglang\.(launch_server|srt\.|data_parallel)")),
    ("vllm", re.compile(r"^vllm\.entrypoints\.")),
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


def engine_kind(argv: Sequence[str]) -> Optional[str]:
    """'sglang', 'vllm', 'launcher' (fleet's own launcher shell) or None, from a process's argv alone."""
    if not argv:
        return None
    if len(argv) == 1:
        m = TITLE_RE.match(argv[0].strip())
        if m:
            return "sglang" if m.group(1) == "sglang" else "vllm"
    exe = os.path.basename(argv[0])
    if exe in SHELLS and len(argv) > 3 and argv[1] == "-c" and argv[3] == LAUNCH_MARK:
        return "launcher"
    rest = list(argv[1:])
    if PYTHON_RE.match(exe) and len(rest) > 2 and rest[0] == "-c" and rest[2] == LAUNCH_MARK:
        return "launcher"
    if PYTHON_RE.match(exe):
        i = 0
        while i < len(rest) and rest[i].startswith("-") and not rest[i].startswith("-m"):
            if rest[i] == "-c":
                return None  # a program given as text: whatever it says, it is not the engine's entry point
            i += 2 if rest[i] in PYTHON_OPTIONS_WITH_VALUE else 1
        if i < len(rest) and rest[i].startswith("-m"):
            module = rest[i][2:] or (rest[i + 1] if i + 1 < len(rest) else "")
            return _module_kind(module)
        if i >= len(rest):
            return None
        exe, rest = os.path.basename(rest[i]), list(rest[i + 1 :])  # a console script: python /venv/bin/vllm serve
    if exe in ("sglang", "vllm") and rest[:1] == ["serve"]:
        return exe
    return None


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
        if select.select([r], [], [], limit_s)[0]:
            answer = os.read(r, 1)
    finally:
        os.close(r)
        if not answer:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return {b"1": True, b"0": False}.get(answer)


def write_record(path: str, data: Dict[str, Any]) -> None:
    """Replace a record atomically: a unique temporary file, fsynced, renamed over it. On failure (a full
    disk) the temporary file is removed and the old record is left as it was."""
    tmp = "%s.%d.%d.tmp" % (path, os.getpid(), int(time.time() * 1e6))
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_record(path: str) -> Optional[Dict[str, Any]]:
    """A JSON object fleet keeps on the host (state, lock, bookkeeping), or None when there is none. A file
    that is not one (cut short by a full disk, edited by hand into a list) is set aside, renamed
    `NAME.corrupt-STAMP` rather than deleted, so the next write starts a good record and nothing is lost."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError:
        return None
    except ValueError:
        data = None
    if isinstance(data, dict):
        return data
    with contextlib.suppress(OSError):
        os.replace(path, f"{path}.corrupt-{int(time.time())}")
    return None
