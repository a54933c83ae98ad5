"""A simulated SGLang child process (scheduler or detokenizer): titled like the real one, holding the
GPU device files open so `fuser` sees it, registering its GPU memory, dying with its parent."""

from __future__ import annotations

import os
import signal
import sys
import time

from fleet_testbed import gpustate
from fleet_testbed.sglang_sim import set_pdeathsig


def main() -> None:
    title, gpu, used_mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    set_pdeathsig()
    try:
        import setproctitle

        setproctitle.setproctitle(title)
    except ImportError:
        pass
    root = gpustate.host_dir()
    held = []
    if gpu >= 0:
        for name in (f"nvidia{gpu}", "nvidiactl", "nvidia-uvm"):
            held.append(open(root / "dev" / name, "rb"))  # noqa: SIM115 - held open on purpose
        gpustate.register(gpu, used_mib)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.write(1, b"up\n")  # the parent waits for every child, as SGLang waits for its schedulers
    os.close(1)
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)


if __name__ == "__main__":
    main()
