"""On the host, in the act step: the engine's own check of a command line, before anything is stopped."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

try:  # the shared host code is prepended when this script is sent to a host
    run_cli  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.container import made_container, run_cli
    from fleet.host.free import expand
    from fleet.protocol import CheckRequest, CheckResult


def fleet_text(path: str) -> str:
    """A program this step runs under the engine's Python: sent with the step (hostscripts.TEXTS), or read
    beside this file where the step is imported as a module."""
    texts = globals().get("FLEET_TEXTS")
    if texts:
        return str(texts[path])
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), path)) as f:
        return f.read()


def program_text(path: str) -> str:
    """fleet's program `path` as `python -c` text, compiled under its own file name with its lines kept (as
    every step's file is): a traceback names fleet/host/check_sglang.py and its line, not `<string>`, and
    coverage.py follows it. It runs in the globals of the text before it (a prelude's, a mode's call after)."""
    return "exec(compile(%r, %r, 'exec'))\n" % (fleet_text(path), "fleet/" + path)


CHECKS = {
    # the engine's argument check, then the architecture as its model loader resolves it
    "sglang": program_text("host/check_sglang.py"),
    # its argument parser, its parser registries, then its engine configuration (no weights loaded)
    "vllm": program_text("host/check_vllm.py"),
}


def client_gone(a: Mapping[str, object]) -> bool:
    """Whether fleet has gone away (its end of stdin closed: Ctrl-C, kill -9, a cut connection). Only
    asked when fleet said it holds stdin open while it waits for this step."""
    if not a.get("client_on_stdin"):
        return False
    try:
        if not select.select([0], [], [], 0)[0]:
            return False
        return os.read(0, 4096) == b""
    except (OSError, ValueError):
        return True


def marked_json(out: str, mark: str, longest: int) -> Dict[str, Any]:
    """The last `MARK {...}` line of the check's output as a JSON object (the engine's own output before it
    cannot stand for it: the last line wins); {} for anything else."""
    marks = re.findall(r"^%s (\{.{0,%d}\})$" % (re.escape(mark), longest), out, re.M)
    try:
        said = json.loads(marks[-1]) if marks else {}
    except (ValueError, RecursionError):
        return {}
    return said if isinstance(said, dict) else {}


def resolved_of(engine: str, out: str) -> Dict[str, str]:
    """The engine check's FLEET-RESOLVED line (host/check_sglang.py, host/check_vllm.py): what the
    engine resolved, kept to short strings."""
    said = marked_json(out, "FLEET-RESOLVED", 4000) if engine in CHECKS else {}
    return dict(
        (str(k)[:40], str(v)[:80]) for k, v in list(said.items())[:16] if isinstance(v, (str, int, float, bool))
    )


def picks_of(out: str) -> Dict[str, str]:
    """host/check_sglang.py's FLEET-PICKS line: what SGLang picked with fleet's keyed flags left out (or
    why it refused that), kept to short strings."""
    said = marked_json(out, "FLEET-PICKS", 2000)
    return dict((str(k)[:40], str(v)[:300]) for k, v in list(said.items())[:8] if isinstance(v, str))


def picks_differ(told: Dict[str, str], expect: Dict[str, List[str]]) -> Dict[str, str]:
    """The engine's picks the plan does not stand on (empty: it stands). An engine that refuses the command
    line without fleet's flags for a setting ("refused: ...") confirms that they are needed."""
    return dict((k, v) for k, v in told.items() if k in expect and v not in expect[k] and not v.startswith("refused"))


def budget_short(check: CheckResult, budget: Optional[Dict[str, int]]) -> Optional[Dict[str, Any]]:
    """Whether the memory fraction the engine resolved on this host leaves each GPU less than the plan needs
    (weights and one prefill step's cache): then it would stop at load, after the old server was stopped.
    None when it leaves enough, or when the engine or the request does not say."""
    said = (check.get("resolved") or {}).get("memory fraction")
    if not budget or not said:
        return None
    try:
        fraction = float(said)
    except ValueError:
        return None
    room = fraction * budget["gpu_mib"]
    if not 0 < fraction < 1 or room >= budget["need_mib"]:
        return None
    return {"fraction": fraction, "room_mib": int(room), "need_mib": budget["need_mib"], "gpu_mib": budget["gpu_mib"]}


@contextlib.contextmanager
def run_dir(wanted: bool) -> Iterator[Optional[str]]:
    """A directory of its own for a container's run (None: none wanted), removed after it whatever is left
    in it: conmon writes a file `oom` where `run` started when the kernel kills the container at its memory
    limit (else the step's own directory: the user's home)."""
    here = tempfile.mkdtemp(prefix="fleet-check-") if wanted else None
    try:
        yield here
    finally:
        if here:
            shutil.rmtree(here, ignore_errors=True)


def nicer() -> None:
    os.nice(10)


def engine_check(c: CheckRequest, gone: Callable[[], bool], yielding: bool = False) -> CheckResult:
    """`yielding`: the check runs while the launched engine starts, and gives it the CPU first (niced: a
    podman container inherits it, through conmon and runc)."""
    code = CHECKS.get(c["engine"])
    if not code:
        return {"verdict": "could_not_check", "output": "no check for engine %s" % c["engine"]}
    code = c.get("prelude", "") + code  # fleet engine audit, on a machine without the GPU: a stand-in for it
    env = dict(os.environ, **c.get("env", {}))
    asked = (c.get("picks") or {}).get("drop")
    if asked is not None:  # also say what the engine picks by itself for the settings fleet's keyed rules decide
        env["FLEET_PICKS"] = json.dumps({"drop": asked})
    deadline = time.time() + c.get("timeout_s", 180)
    cont = c.get("container")
    argv = [expand(c["python"]), "-c", code] + c["args"]
    if cont:  # the check runs in the same image as the server, with its mounts and environment
        argv = [cont["cli"], "run", "--rm", "--name", cont["name"], "--network", "host"] + cont["options"]
        # no GPU, whatever the runtime's defaults (docker's default runtime set to nvidia, a podman hook, and
        # an image saying NVIDIA_VISIBLE_DEVICES=all): it starts no server, and it may run while one starts
        argv += ["-e", "NVIDIA_VISIBLE_DEVICES=void"]
        if asked is not None:
            argv += ["-e", "FLEET_PICKS=" + env["FLEET_PICKS"]]
        argv += ["--entrypoint", c["python"], cont["image"], "-c", code] + c["args"]
    with tempfile.TemporaryFile() as output, run_dir(bool(cont)) as here:
        cid_path = os.path.join(here, "cid") if here else ""
        if cont:  # what the run made, by id: a name alone may be another's by the time it is removed
            argv[2:2] = ["--cidfile", cid_path]
        try:
            p = subprocess.Popen(
                argv,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=nicer if yielding else None,
                cwd=here,
            )
        except OSError as exc:
            return {"verdict": "could_not_check", "output": str(exc)}
        while p.poll() is None:
            if gone() or time.time() > deadline:
                p.kill()
                p.wait()
                made = made_container(cid_path) if cont else None
                if cont and made:  # the client is gone; its container is not
                    run_cli([cont["cli"], "rm", "-f", made])
                if time.time() > deadline:
                    return {"verdict": "could_not_check", "output": "the check timed out"}
                return {"verdict": "client_gone", "output": ""}
            time.sleep(0.01)  # a check that ended is seen at once: the launch waits on it
        output.seek(0)
        out = output.read().decode("utf-8", "replace")[-20000:]
    if p.returncode == 0:
        result = {"verdict": "accepted", "output": out[-2000:], "resolved": resolved_of(c["engine"], out)}  # type: CheckResult
        if asked is not None:
            result["picks"] = picks_of(out)
        return result
    if p.returncode == 2 and "error:" in out:
        return {"verdict": "rejected", "output": out}
    if re.search(r"^(AssertionError|ValueError|NotImplementedError)\b", out, re.M):
        return {"verdict": "rejected", "output": out}
    return {"verdict": "could_not_check", "output": out}
