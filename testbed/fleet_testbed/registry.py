"""A real container image registry on loopback: Debian's docker-registry (the distribution project's
registry, what Docker Hub runs), over plain HTTP, so `podman pull` is tested against a registry's own API
without the internet. Images made here (fleet_testbed.images) are pushed into it first."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


class Registry:
    def __init__(self, root: Path, port: int) -> None:
        binary = shutil.which("docker-registry")
        if binary is None:
            raise RuntimeError("docker-registry is not installed: run testbed/install-system-deps.sh")
        self.address = f"127.0.0.1:{port}"
        root.mkdir(parents=True, exist_ok=True)
        config = root / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\n"
            f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
            f"http:\n  addr: {self.address}\n"
        )
        # podman reads which registries may be spoken to over plain HTTP from this file
        self.registries_conf = root / "registries.conf"
        self.registries_conf.write_text(f'[[registry]]\nlocation = "{self.address}"\ninsecure = true\n')
        self._log = (root / "registry.log").open("wb")
        self._proc = subprocess.Popen([binary, "serve", str(config)], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(
                        f"the registry did not start: {(root / 'registry.log').read_text()[-500:]}"
                    ) from None
                time.sleep(0.1)

    def push(self, local: str, name: str) -> str:
        """`local` (an image podman has) into the registry as `name`; its reference there."""
        ref = f"{self.address}/{name}"
        subprocess.run(["podman", "push", "--tls-verify=false", "--quiet", local, ref], check=True, capture_output=True)
        return ref

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()
