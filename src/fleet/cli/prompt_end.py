"""Ctrl-C ends a following command (`fleet logs -f`) within seconds, whatever its main thread is doing.

Python runs a signal's handler in the main thread only, between bytecodes. A KeyboardInterrupt raised in
the middle of paramiko (a lock held, half a packet written) can leave the channel's close or the
connection's end waiting on something that never comes; and a signal the kernel hands to another thread
is not seen at all while the main thread waits without a timeout. A follow has nothing to clean up on the
host (the remote reader ends when its stdin closes with this process), so after an interrupt it is also
ended from a thread of its own if it has not ended by itself within END_WITHIN_S.

The signal reaches that thread through `signal.set_wakeup_fd`, which the C-level handler writes to in
whichever thread received it. Only for a command's own process: a deploy must unwind (unlock the host,
record its server) and never takes this path.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import threading
from collections.abc import Iterator

END_WITHIN_S = 5.0
INTERRUPTED_EXIT = 130  # what a shell reports for a command ended by SIGINT


@contextlib.contextmanager
def ends_promptly_when_interrupted(*, show_stacks: bool, within_s: float = END_WITHIN_S) -> Iterator[None]:
    """While inside, SIGINT or SIGTERM (each already raises KeyboardInterrupt) also arms an exit in
    `within_s`. A body that returns normally disarms it; one that is interrupted leaves it armed, so a
    hang while the process unwinds or exits is still ended. `show_stacks` (--debug) prints where every
    thread was stuck before that exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # the C handler must never block on it
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    disarmed = threading.Event()

    def watch() -> None:
        try:
            signalled = os.read(read_end, 1)  # empty: disarmed, the write end was closed
        except OSError:
            signalled = b""
        finally:
            os.close(read_end)
        if not signalled or disarmed.wait(within_s):
            return
        with contextlib.suppress(OSError, ValueError):
            os.write(2, f"fleet: still running {within_s:.0f} s after the interrupt; ended now.\n".encode())
            if show_stacks:
                faulthandler.dump_traceback(file=2, all_threads=True)
        os._exit(INTERRUPTED_EXIT)

    watcher = threading.Thread(target=watch, name="interrupt-watchdog", daemon=True)
    watcher.start()
    interrupted = False
    try:
        yield
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        signal.set_wakeup_fd(previous)
        if not interrupted:
            disarmed.set()
            os.close(write_end)  # the watcher's read returns empty and it ends
            watcher.join()
