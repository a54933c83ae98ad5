"""A stand-in `docker` and `podman` for the fast tier: the host's container code (fleet.host.container,
the act step's container launch) run in milliseconds against runtimes whose state is a JSON file, with
every command they were given logged in order. Real podman and docker run the same code in the
containers tier (tests/test_container_host.py, tests/test_containers_ssh.py).

What each prints is the shape the real ones print (captured from podman 4.3 here; docker's from its
`--format '{{json .}}'`): podman's `ps --format json` is one array with `Names` a list and `Labels` a map;
docker's is one object per line with `Names` a string and `Labels` joined by commas; both `inspect` a
container as a list of one with its `State`.

    runtime = FakeRuntime(tmp_path)         # PATH=runtime.bin: only these two on it
    runtime.add("podman", id=..., name=..., labels={...}, state="running", pid=1234)
    runtime.starts_as("podman", pid)        # the next `run -d` runs, as that process (default: ends at once)
    runtime.fail("docker", "ps", 1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.")
    runtime.calls("podman")                 # [["ps", "-a", ...], ...]
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path
from typing import Any

RUNTIMES = ("docker", "podman")


class FakeRuntime:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "fake-runtime-bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        self.world = root / "fake-runtime.json"
        self._save({cli: {"containers": [], "images": {}, "fail": {}, "info": "", "next_pid": 0} for cli in RUNTIMES})
        testbed = Path(__file__).resolve().parents[1]
        for cli in RUNTIMES:
            path = self.bin / cli
            path.write_text(
                f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(testbed)!r})\n"
                f"from fleet_testbed.fakeruntime import main\nmain({str(self.world)!r}, {cli!r}, sys.argv[1:])\n"
            )
            path.chmod(0o755)

    def _load(self) -> dict[str, Any]:
        return json.loads(self.world.read_text())

    def _save(self, world: dict[str, Any]) -> None:
        self.world.write_text(json.dumps(world))

    def only(self, *clis: str) -> None:
        """The host has only these runtimes installed."""
        for cli in RUNTIMES:
            if cli not in clis:
                (self.bin / cli).unlink(missing_ok=True)

    def add(self, cli: str, **container: Any) -> None:
        world = self._load()
        world[cli]["containers"].append({"state": "running", "pid": 0, "labels": {}, "image": "img", **container})
        self._save(world)

    def image(self, cli: str, ref: str, **facts: Any) -> None:
        """An image the runtime has: its `id`, `env`, `labels`, and the `packages` its Python reports."""
        world = self._load()
        world[cli]["images"][ref] = facts
        self._save(world)

    def fail(self, cli: str, command: str, code: int, said: str) -> None:
        """`cli COMMAND ...` exits `code`, saying `said` on stderr."""
        world = self._load()
        world[cli]["fail"][command] = [code, said]
        self._save(world)

    def starts_as(self, cli: str, pid: int) -> None:
        """The next `run -d` starts a container whose PID 1 is `pid` (0, the default: it ends at once)."""
        world = self._load()
        world[cli]["next_pid"] = pid
        self._save(world)

    def start_fails(self, cli: str, said: str) -> None:
        """The next `run -d` makes its container, and its start fails saying `said` (exit 126)."""
        world = self._load()
        world[cli]["start_fails"] = said
        self._save(world)

    def set_info(self, cli: str, text: str) -> None:
        world = self._load()
        world[cli]["info"] = text
        self._save(world)

    def containers(self, cli: str) -> list[dict[str, Any]]:
        return list(self._load()[cli]["containers"])

    def calls(self, cli: str) -> list[list[str]]:
        log = self.root / f"fake-runtime-{cli}.calls"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _find(world: dict[str, Any], ident: str) -> dict[str, Any] | None:
    return next((c for c in world["containers"] if ident in (c["id"], c["name"])), None)


def _ps_item(cli: str, c: dict[str, Any]) -> dict[str, Any]:
    if cli == "docker":
        labels = ",".join(f"{k}={v}" for k, v in c["labels"].items())
        return {"ID": c["id"], "Names": c["name"], "Image": c["image"], "Labels": labels, "State": c["state"]}
    return {"Id": c["id"], "Names": [c["name"]], "Image": c["image"], "Labels": c["labels"] or None,
            "State": c["state"], "Pid": c["pid"]}  # fmt: skip


def _inspect_item(c: dict[str, Any]) -> dict[str, Any]:
    running = c["state"] == "running"
    state = {"Pid": c["pid"] if running else 0, "Running": running, "ExitCode": c.get("exit_code", 0),
             "OOMKilled": c.get("oom_killed", False), "Status": c["state"]}  # fmt: skip
    return {"Id": c["id"], "State": state, "RestartCount": 0, "Config": {"Labels": c["labels"]}}


def _option(args: list[str], name: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]


def _run(cli: str, world: dict[str, Any], args: list[str]) -> tuple[int, str, str]:
    if "--rm" in args:  # an image's Python asked once: what its packages are
        image = args[args.index("--entrypoint") + 2]
        facts = world["images"].get(image)
        if facts is None:
            return 125, "", f"Error: {image}: image not known"
        return 0, json.dumps(facts.get("packages", {})) + "\n", ""
    name = _option(args, "--name")[0]
    cidfile = (_option(args, "--cidfile") or [None])[0]
    if cidfile and os.path.exists(cidfile):  # as both runtimes refuse: the file may be another run's
        return 125, "", f"Error: container id file exists. Ensure another container is not using it or delete {cidfile}"
    if _find(world, name) is not None:
        return 125, "", f'Error: creating container storage: the container name "{name}" is already in use'
    labels = dict(x.split("=", 1) for x in _option(args, "--label"))
    image = args[args.index("--entrypoint") + 2]
    ident = f"{len(world['containers']) + 1:064x}"
    pid = world["next_pid"]
    world["containers"].append({"id": ident, "name": name, "image": image, "labels": labels,
                                "state": "running" if pid else "exited", "pid": pid, "exit_code": 0 if pid else 3})  # fmt: skip
    if cidfile:  # written once the container exists, before it starts (what a failed start leaves too)
        Path(cidfile).write_text(ident)
    start_failed = world.pop("start_fails", None)
    if start_failed:  # made, then its start failed: the runtime's error, the container left
        world["containers"][-1].update(state="created", pid=0)
        return 126, "", start_failed + "\n"
    secrets = next((a for a in args if "/env-" in a and a.endswith(".json")), None)
    if pid and secrets:  # its launcher reads the secrets and deletes them (here: the file in the host's dir)
        for mount in _option(args, "-v"):
            host, _, inside = mount.partition(":")
            if secrets.startswith(inside.split(":")[0] + "/"):
                Path(host, secrets[len(inside.split(":")[0]) + 1 :]).unlink(missing_ok=True)
    return 0, ident + "\n", ""


def answer(cli: str, world: dict[str, Any], args: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `cli ARGS` in `world` (changed in place by run, stop and rm)."""
    command = args[0] if args[0] != "image" else "image " + args[1]
    if command in world["fail"]:
        code, said = world["fail"][command]
        return code, "", said + "\n"
    if command == "ps":
        wanted = [f[len("label=") :] for f in _option(args, "--filter")]
        found = [c for c in world["containers"] if all(
            (w in c["labels"]) if "=" not in w else c["labels"].get(w.split("=", 1)[0]) == w.split("=", 1)[1]
            for w in wanted)]  # fmt: skip
        items = [_ps_item(cli, c) for c in found]
        if cli == "docker":
            return 0, "".join(json.dumps(i) + "\n" for i in items), ""
        return 0, json.dumps(items, indent=4) + "\n", ""
    if command == "inspect":
        c = _find(world, args[-1])
        if c is None:
            return 125, "", f"Error: no such container {args[-1]}"
        if "--format" in args:  # the one template fleet asks: the labels as a JSON map
            return 0, json.dumps(c["labels"]) + "\n", ""
        return 0, json.dumps([_inspect_item(c)]) + "\n", ""
    if command == "image inspect":
        facts = world["images"].get(args[-1])
        if facts is None:
            return 125, "", f"Error: {args[-1]}: image not known"
        config = {"Env": facts.get("env", []), "Labels": facts.get("labels")}
        return 0, json.dumps([{"Id": facts.get("id", "sha256:0"), "Config": config}]) + "\n", ""
    if command == "info":
        return 0, world["info"] + "\n", ""
    if command == "run":
        return _run(cli, world, args)
    if command in ("stop", "rm", "logs"):
        c = _find(world, args[-1])
        if c is None:
            return 125, "", f"Error: no container with name or ID {args[-1]!r} found"
        if command == "stop":
            c.update(state="exited", pid=0, exit_code=143)
        elif command == "rm":
            world["containers"].remove(c)
        return 0, (c.get("logs", "") if command == "logs" else c["id"] + "\n"), ""
    return 125, "", f"Error: unknown command {command!r} for the fake runtime"


def main(world_path: str, cli: str, args: list[str]) -> None:
    path = Path(world_path)
    with open(path.parent / "fake-runtime.lock", "w") as lock:  # fleet asks both runtimes at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        world = json.loads(path.read_text())
        with open(path.parent / f"fake-runtime-{cli}.calls", "a") as log:
            log.write(json.dumps(args) + "\n")
        code, out, err = answer(cli, world[cli], args)
        path.write_text(json.dumps(world))
    sys.stdout.write(out)
    sys.stderr.write(err)
    sys.stdout.flush()
    os._exit(code)
