"""What a terminal shows while deploys run: a line per deployment being started, redrawn in place by rich's
Live (host, attempt, time, the start-up phase with its progress bar and ETA, the engine's last log line),
and everything said printed above it. Several hosts at once (a restart over hosts, a group, a service's
replicas) share one display: a terminal has one place to redraw."""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from fleet import events
from fleet.startup import PHASE_TITLES
from fleet.terminal import duration, safe_line, safe_text, size

REFRESH_PER_SECOND = 4  # the time and the ETA count on between the engine's lines


class LiveRow:
    """One deployment's line: updated by its Reporter, drawn by the board."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.started = time.monotonic()
        self.attempt, self.max = 1, 1
        self.phase: events.StartupPhase | None = None
        self.phase_seen_at = 0.0  # when its phase event came: its ETA counts down from there
        self.line = ""
        self.verb = "pulling"  # a model's transfer (fleet pull, or a push), drawn until a phase replaces it
        self.transfer: events.ModelPullProgress | None = None

    def render(self, now: float) -> Group:
        """Two lines: where it is (host, attempt, time; the phase, its bar, the ETA), then the engine's
        last line, cut to the terminal's width."""
        top = Table.grid(padding=(0, 2))
        top.add_row(*self.state(now))
        return Group(top, Text("  " + self.line, no_wrap=True, overflow="ellipsis", style="dim"))

    def state(self, now: float) -> list[Any]:
        head = Text(f"{self.host} [{self.attempt}/{self.max} {now - self.started:5.1f}s]", style="bold")
        p = self.phase
        if p is None and self.transfer is not None:  # a model on its way: no attempt to count yet
            head = Text(f"{self.host} [{now - self.started:5.1f}s]", style="bold")
            return [head, *self.transferred(self.transfer)]
        if p is None:
            return [head]
        title = Text(safe_line(PHASE_TITLES.get(p.phase, p.phase)))
        eta = "no ETA yet" if p.eta_s is None else f"~{duration(max(0.0, p.eta_s - (now - self.phase_seen_at)))} left"
        if not p.of:
            return [head, title, Text(eta)]
        bar = ProgressBar(total=p.of, completed=min(p.done or 0, p.of), width=16)
        return [head, title, bar, Text(f"{p.done}/{p.of}"), Text(eta)]

    def transferred(self, t: events.ModelPullProgress) -> list[Any]:
        total = max(t.total, 1)
        bar = ProgressBar(total=total, completed=min(t.done, total), width=16)
        eta = f"~{duration(t.eta_s)} left" if t.eta_s is not None and t.done < t.total else ""
        amount = f"{t.done * 100 // total}% {size(t.done)} of {size(t.total)}, {size(int(t.rate_bps))}/s"
        return [Text(self.verb), bar, Text(amount), Text(eta)]


class LiveBoard:
    """The rows of every deployment being started in this process, drawn while there is one."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.rows: list[LiveRow] = []
        self.live: Live | None = None
        self.lock = threading.RLock()
        self.ended = False  # fleet is exiting: nothing is drawn again (the terminal gets its cursor back)

    def row(self, host: str) -> LiveRow:
        """A line for one deployment, drawn once shown."""
        return LiveRow(host)

    def show(self, row: LiveRow) -> None:
        with self.lock:
            if self.ended:
                return
            if row not in self.rows:
                self.rows.append(row)
            if self.live is None:
                self.live = Live(
                    self,
                    console=self.console,
                    refresh_per_second=REFRESH_PER_SECOND,
                    transient=True,  # gone when the deploys end: the result is printed in its place
                    redirect_stdout=False,
                    redirect_stderr=False,
                )
                self.live.start()

    def drop(self, row: LiveRow) -> None:
        with self.lock:
            if row in self.rows:
                self.rows.remove(row)
            if not self.rows and self.live is not None:
                self.live.stop()
                self.live = None

    def end(self) -> None:
        with self.lock:
            self.ended = True
            self.rows.clear()
            if self.live is not None:
                self.live.stop()
                self.live = None

    def say(self, text: str) -> bool:
        """Print above the rows; False when nothing is drawn (the caller prints as usual)."""
        with self.lock:
            if self.live is None:
                return False
            from fleet.secrets import hide

            self.console.print(Text(safe_text(hide(text))), soft_wrap=True, highlight=False)
            return True

    def __rich__(self) -> Group:
        now = time.monotonic()
        with self.lock:
            rows = list(self.rows)
        return Group(*(row.render(now) for row in rows))


_BOARD: LiveBoard | None = None
_BOARD_LOCK = threading.Lock()


def terminal_board() -> LiveBoard | None:
    """The board of this process's terminal (stderr); None when stderr is not one (a file, a pipe, cron)."""
    global _BOARD
    with _BOARD_LOCK:
        if _BOARD is None:
            console = Console(stderr=True)
            if not console.is_terminal:
                return None
            _BOARD = LiveBoard(console)
            atexit.register(_BOARD.end)  # Ctrl-C, an error: the display is taken down, whatever was left
        return _BOARD
