"""A simulated SGLang child process (scheduler or detokenizer): titled like the real one, holding the
GPU device files open so `fuser` sees it, registering its GPU memory, dying with its parent. Forked from
the engine simulator (`Forked`); run as a module, a GPU holder of a test's own. The weight cache daemon's
simulated ranks share `set_pdeathsig`."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
import traceback

from fleet_testbed import gpustate


def set_pdeathsig() -> None:
    """prctl(PR_SET_PDEATHSIG, SIGKILL): children die with the main process (engines.md §3.3)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)
    except OSError:
        pass


def run(title: str, gpu: int, used_mib: int, parent: int) -> None:
    """The child's life: titled, holding its GPU, "up" on stdout, until its parent is gone."""
    set_pdeathsig()
    if os.getppid() != parent:  # the parent died before the signal was asked for
        return
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
    while os.getppid() == parent:
        time.sleep(0.5)


class Forked:
    """A child forked from the simulator, as much of a `subprocess.Popen` as the simulator uses. Forked,
    not started anew: a Python start cost each child ~40 ms of CPU, nine of them for a TP 8 engine. It
    keeps none of the simulator's files or sockets (a spawned child of SGLang's has none of them)."""

    def __init__(self, title: str, gpu: int, used_mib: int) -> None:
        parent = os.getpid()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: stdin from /dev/null, stdout the pipe, stderr the engine's log
            code = 1
            try:
                os.dup2(w, 1)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                close_inherited()
                run(title, gpu, used_mib, parent)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(w)
        self.pid = pid
        self.stdout = os.fdopen(r, "rb")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def close_inherited() -> None:
    """Every descriptor but stdin, stdout and stderr, by the list of those open: a container's limit can
    be a billion, and closing them all one by one (kernels before 5.9) takes minutes."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            with contextlib.suppress(OSError):
                os.close(int(name))


def main() -> None:
    """`python -m fleet_testbed.sim_child TITLE GPU MIB`: a GPU holder on its own (a test's foreign process)."""
    run(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), os.getppid())


if __name__ == "__main__":
    main()
