"""Runs under the SGLang oracle's own Python (../shared/tools/sglang-oracle): many of its checks of one
SGLang version for one import of SGLang and torch.

`check` imports them afresh for every command line (about 3.5 s of the 4.5 s one resolution takes). This
imports them once, as `check` does before it looks at its arguments, then runs each check in a fork of
that process: each starts from the state a fresh `check` would have at that point, and nothing one
check patches (the fake GPU, the environment, the logging) reaches another. (`check` applies a launch
line's leading NAME=VALUE words before its import, a fork after it: fleet's checks carry none.)

    oracle_pool.py ORACLE_DIR VERSION JOBS < [[check's arguments], ...] > [check's answer, ...]

Each answer is the JSON line `check` prints (a check that died or ran past its time is could_not_check,
as `check` says it). Standard library only, besides the oracle itself.
"""

import contextlib
import json
import os
import select
import signal
import sys
import time

CHECK_TIMEOUT_S = 300  # as `check` (ORACLE_TIMEOUT's default)


def could_not_check(version: str, why: str) -> dict:
    return {"version": version, "verdict": "could_not_check", "error_type": "OracleError", "message": why}


def start(oracle, args: list) -> tuple:
    """Fork one check; its answer comes on the returned pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: exactly `check`'s main, its stdout the pipe, SGLang's log dropped
        try:
            os.setsid()  # a group of its own: one that runs past its time is killed with what it started
            os.close(r)
            os.dup2(w, 1)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
            signal.alarm(CHECK_TIMEOUT_S)
            sys.argv = ["oracle.py", *args]
            oracle.main()  # ends the process itself (os._exit)
        finally:
            os._exit(3)
    os.close(w)
    return pid, r


def main() -> None:
    oracle_dir, version, jobs = sys.argv[1], sys.argv[2], max(1, int(sys.argv[3]))
    checks = json.loads(sys.stdin.read())
    sys.path.insert(0, oracle_dir)
    import oracle  # noqa: PLC0415 - found only once its directory is on the path

    # what `check` does before it reads its own arguments: the version's layer first on the path, offline
    for rel in reversed(oracle.LAYERED.get(version, [])):
        sys.path.insert(0, os.path.join(oracle.VENV, rel))
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "SGLANG_DISABLE_REQUEST_LOGGING"):
        os.environ.setdefault(name, "1")
    oracle.install_stubs()
    oracle.import_sglang(version)  # a wrong version raises here: nothing is answered for it

    answers: list = [None] * len(checks)
    running: dict = {}  # read end -> (index, pid, bytes so far, when it is killed)
    todo = list(enumerate(checks))
    while todo or running:
        while todo and len(running) < jobs:
            i, args = todo.pop(0)
            pid, r = start(oracle, args)
            running[r] = (i, pid, b"", time.monotonic() + CHECK_TIMEOUT_S + 5)
        ready, _, _ = select.select(list(running), [], [], 1.0)
        for r, (i, pid, got, deadline) in list(running.items()):
            if r not in ready and time.monotonic() > deadline:  # its alarm did not end it (or a grandchild)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            if r not in ready:
                continue
            chunk = os.read(r, 65536)
            if chunk:
                running[r] = (i, pid, got + chunk, deadline)
                continue
            os.close(r)
            del running[r]
            _, status = os.waitpid(pid, 0)
            lines = got.decode(errors="replace").strip().splitlines()
            if lines and lines[-1].startswith("{"):
                answers[i] = json.loads(lines[-1])
            elif os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGALRM, signal.SIGKILL):
                answers[i] = could_not_check(version, f"timed out after {CHECK_TIMEOUT_S}s")
            else:
                answers[i] = could_not_check(version, f"oracle crashed (status {status})")
    sys.stdout.write(json.dumps(answers) + "\n")


if __name__ == "__main__":
    main()
