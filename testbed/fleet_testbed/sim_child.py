"""A simulated SGLang child process (scheduler or detokenizer): titled like the real one, holding the
GPU device files open so `fuser` sees it, registering its GPU memory, dying with its parent."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

# nothing of the engine simulator: a TP 8 start runs nine of these, and importing the simulator cost each
# a tenth of a second of CPU
from fleet_testbed import gpustate


def set_pdeathsig() -> None:
    """prctl(PR_SET_PDEATHSIG, SIGKILL): children die with the main process (engines.md §3.3)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)
    except OSError:
        pass


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
