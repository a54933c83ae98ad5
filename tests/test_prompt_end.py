"""Ctrl-C ends `fleet logs -f` within seconds even when its main thread is stuck (fleet.cli.prompt_end).

Each case runs in a process of its own: the watchdog ends the process it is armed in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

HEADER = """
import os, signal, sys, threading, time
from fleet.cli.prompt_end import ends_promptly_when_interrupted
print("armed", flush=True)
"""


def _interrupted(body: str, timeout_s: float = 30) -> tuple[int, str, float]:
    """Run `body`, send SIGINT once it printed "ready", and return (exit code, stderr, seconds to end)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HEADER + body],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a terminal's Ctrl-C, not a background job's
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")},  # not other tests'
    )
    assert proc.stdout is not None
    while (line := proc.stdout.readline()) and line.strip() != "ready":
        pass
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"the body never got going: {proc.communicate()[1]}")
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        proc.kill()
    return proc.returncode, err, time.monotonic() - sent


def test_a_main_thread_that_never_gets_out_of_its_wait_is_still_ended() -> None:
    # The interrupt is swallowed where the main thread waits, as when a KeyboardInterrupt lands inside
    # paramiko and its close then waits forever: the process must end all the same.
    code, err, _ = _interrupted(
        """
with ends_promptly_when_interrupted(show_stacks=True, within_s=1):
    said = False
    while True:
        try:  # the interrupt, wherever it lands after "ready", is swallowed
            if not said:
                said = True
                print("ready", flush=True)
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
"""
    )
    assert code == 130, err
    assert "still running 1 s after the interrupt; ended now." in err
    assert "Current thread" in err or "Thread 0x" in err  # --debug: where each thread was stuck


def test_a_hang_while_unwinding_from_the_interrupt_is_ended_too() -> None:
    code, err, _ = _interrupted(
        """
def stuck_cleanup():
    try:
        print("ready", flush=True)
        time.sleep(60)
    finally:
        time.sleep(60)  # a channel close that never returns

with ends_promptly_when_interrupted(show_stacks=False, within_s=1):
    stuck_cleanup()
"""
    )
    assert code == 130, err
    assert "ended now." in err and "Thread 0x" not in err  # no stacks without --debug


def test_an_interrupt_that_unwinds_in_time_ends_as_python_does_without_the_watchdog() -> None:
    code, err, seconds = _interrupted(
        """
with ends_promptly_when_interrupted(show_stacks=False, within_s=20):
    print("ready", flush=True)
    time.sleep(60)
"""
    )
    assert code != 130 and "KeyboardInterrupt" in err and "ended now" not in err
    assert seconds < 20  # the KeyboardInterrupt ended it, not the watchdog


def test_a_body_that_returns_disarms_it_and_gives_back_the_wakeup_fd() -> None:
    code, err, _ = _interrupted(
        """
before = signal.set_wakeup_fd(-1); signal.set_wakeup_fd(before)
with ends_promptly_when_interrupted(show_stacks=False, within_s=1):
    pass
assert signal.set_wakeup_fd(-1) == before
assert [t.name for t in threading.enumerate()] == ["MainThread"]
try:
    print("ready", flush=True)
    time.sleep(5)  # the interrupt lands here: a plain KeyboardInterrupt, no watchdog
except KeyboardInterrupt:
    time.sleep(2)
    print("survived", file=sys.stderr)
"""
    )
    assert code == 0 and "survived" in err and "ended now" not in err


def test_it_does_nothing_outside_the_main_thread() -> None:
    code, err, _ = _interrupted(
        """
seen = []
def off_main():
    with ends_promptly_when_interrupted(show_stacks=False, within_s=1):
        seen.extend(t.name for t in threading.enumerate())
t = threading.Thread(target=off_main); t.start(); t.join()
assert "interrupt-watchdog" not in seen, seen
try:
    print("ready", flush=True)
    time.sleep(5)
except KeyboardInterrupt:
    print("plain", file=sys.stderr)
"""
    )
    assert code == 0 and "plain" in err
