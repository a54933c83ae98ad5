"""Debian's dockerd on a simulated host, for the tests and the benchmark that run deployments in docker.

It is started over SSH, so the daemon and its containers are that host's processes (the simulated host
has a pid namespace of its own); the host's `docker` (a wrapper first on its PATH) talks to it; the
simulated SGLang image is loaded into it from podman's store. No bridge network exists here: fleet's
containers use the host's network.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleet_testbed import simhost


class DockerdMissing(RuntimeError):
    """dockerd or the docker client is not installed (`make system-deps` installs Debian's docker.io)."""


@contextmanager
def on_host(sb: simhost.Sandbox, spec: simhost.HostSpec, image: str) -> Iterator[str]:
    """dockerd on `spec`'s host with `image` loaded; yields its socket (unix://...). Stopped after, with
    every container it ran."""
    real = shutil.which("docker")
    if shutil.which("dockerd") is None or real is None:
        raise DockerdMissing("dockerd is needed: run `make system-deps` (it installs Debian's docker.io)")
    root = Path(tempfile.mkdtemp(prefix="fdk", dir="/tmp"))  # short: containerd's sockets live under it
    sock = f"unix://{root}/docker.sock"
    on_host = simhost.ssh_argv(sb, spec)
    start = (
        f"nohup dockerd --host {sock} --data-root {root}/data --exec-root {root}/exec --pidfile {root}/docker.pid"
        f" --iptables=false --bridge=none > {root}/dockerd.log 2>&1 < /dev/null &"
    )
    subprocess.run([*on_host, start], check=True, timeout=30)
    wrapper = sb.host_dir(spec.name) / "bin" / "docker"  # first on the host's PATH
    try:
        wrapper.write_text(f'#!/bin/sh\nexec {real} -H {sock} "$@"\n')
        wrapper.chmod(0o755)
        deadline = time.monotonic() + 60
        while subprocess.run([real, "-H", sock, "info"], capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("dockerd did not start: " + (root / "dockerd.log").read_text()[-2000:])
            time.sleep(0.5)
        saved = subprocess.Popen(["podman", "save", "--format", "docker-archive", image], stdout=subprocess.PIPE)
        assert saved.stdout is not None
        with saved.stdout:
            subprocess.run([real, "-H", sock, "load"], stdin=saved.stdout, check=True, capture_output=True)
        saved.wait()
        yield sock
    finally:
        stop = f"{wrapper} rm -f $({wrapper} ps -aq) >/dev/null 2>&1; kill $(cat {root}/docker.pid); sleep 2"
        subprocess.run([*on_host, stop], capture_output=True, timeout=60)
        wrapper.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", str(root)], capture_output=True)  # its mounts were the host's own
