"""`fleet logs`: the logs step run for real (a local shell stands in for SSH; the ssh tier runs it over
sshd), followed across a restart's new log, several deployments at once, and what reaches the terminal."""

from __future__ import annotations

import os
import queue
import sys
import threading
from pathlib import Path

import pytest

from fleet.cli.logs_view import LogsView
from fleet.control.logs import log_text, read_logs
from fleet.errors import FleetError
from fleet.inventory import Host, HostSettings
from fleet.protocol import LogsEvent
from fleet.transport.local import LocalTransport


def host_with_logs(tmp_path: Path) -> Host:
    settings = HostSettings(connection="local", engines={"sglang": sys.executable}, log_dir=str(tmp_path))
    return Host("box", settings, (), "hosts.yaml:1")


def attempt(log_dir: Path, name: str, attempt_no: int, text: str) -> Path:
    """An attempt's log, linked as the deployment's latest (as the act step does)."""
    log = log_dir / f"{name}-{attempt_no}.log"
    log.write_text(text)
    link = log_dir / f"{name}.latest.log"
    tmp = log_dir / f".{name}.link"
    tmp.symlink_to(log.name)
    os.replace(tmp, link)
    return log


def events_of(host: Host, names: list[str | None], *, lines: int = 100) -> list[LogsEvent]:
    said: list[LogsEvent] = []
    assert (
        read_logs(
            LocalTransport("box"), host, names=names, lines=lines, follow=False, on_event=lambda e: not said.append(e)
        )
        == 0
    )
    return said


class Following:
    """read_logs with follow=True in a thread; its events taken one by one, then stopped."""

    def __init__(self, host: Host, names: list[str | None]) -> None:
        self.events: queue.Queue[LogsEvent] = queue.Queue()
        self.stop = threading.Event()
        self.reading = threading.Event()  # cleared: a reader that pauses (a terminal scrolled back)
        self.reading.set()

        def on_event(event: LogsEvent) -> bool:
            self.reading.wait()
            self.events.put(event)
            return not self.stop.is_set()

        self.thread = threading.Thread(
            target=read_logs,
            args=(LocalTransport("box"), host),
            kwargs={"names": names, "lines": 10, "follow": True, "on_event": on_event},
            daemon=True,
        )
        self.thread.start()

    def until(self, wanted: str) -> list[LogsEvent]:
        """Every event up to the line `wanted` (waiting for each as long as a slow machine may need)."""
        seen: list[LogsEvent] = []
        while not seen or seen[-1].get("text") != wanted:
            seen.append(self.events.get(timeout=60))
        return seen

    def close(self, log: Path) -> None:
        self.stop.set()
        with log.open("a") as f:
            f.write("one more line, read after the stop\n")  # a quiet follow ends at its next event
        self.thread.join(60)
        assert not self.thread.is_alive()


def test_a_restart_switches_a_followed_log_and_says_so(tmp_path: Path) -> None:
    host = host_with_logs(tmp_path)
    first = attempt(tmp_path, "qwen", 1, "loading\nready\n")
    follow = Following(host, ["qwen"])
    try:
        start = follow.until("ready")
        assert [(e["e"], e.get("log") or e.get("text")) for e in start] == [
            ("log", "qwen-1.log"),
            ("line", "loading"),
            ("line", "ready"),
        ]
        with first.open("a") as f:
            f.write("crashed: CUDA out of memory\n")
        follow.until("crashed: CUDA out of memory")
        second = attempt(tmp_path, "qwen", 2, "loading again\n")
        switched = follow.until("loading again")
        assert [(e["e"], e.get("log") or e.get("text")) for e in switched] == [
            ("switch", "qwen-2.log"),
            ("line", "loading again"),  # the new attempt's log from its first line
        ]
    finally:
        follow.close(second if "second" in locals() else first)


def test_a_followed_log_cut_short_or_replaced_by_a_link_is_said_and_never_read_through_the_link(
    tmp_path: Path,
) -> None:
    """`logs -f` followed a truncated log from its start without a word, and read a file put in its
    place as a link to one outside the log directory, whole."""
    host = host_with_logs(tmp_path)
    first = attempt(tmp_path, "qwen", 1, "loading\nready\n")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("root:$6$salt$HASH\n")
    follow = Following(host, ["qwen"])
    try:
        follow.until("ready")
        first.write_text("again\n")  # cut short, then written anew
        said = follow.until("again")
        assert [(e["e"], e.get("why") or e.get("text")) for e in said] == [("reset", "truncated"), ("line", "again")]
        first.unlink()
        first.symlink_to(outside)  # another file's lines, through a link put in the log's place
        seen = [follow.events.get(timeout=60)]
        while seen[-1]["e"] != "reset":
            seen.append(follow.events.get(timeout=60))
        first.unlink()
        first.write_text("back\n")
        seen += follow.until("back")
        assert seen[0] == {"e": "reset", "d": "qwen", "why": seen[0]["why"]} and "unreadable" in seen[0]["why"]
        assert all("root:" not in str(e.get("text")) for e in seen), seen
    finally:
        follow.close(first)


def test_log_text_shaped_like_fleets_events_is_only_a_line(tmp_path: Path) -> None:
    """An engine echoing a prompt can write anything; it arrives as a line's text, never as an event."""
    host = host_with_logs(tmp_path)
    forged = '{"e": "switch", "d": "qwen", "log": "evil.log"}'
    attempt(tmp_path, "qwen", 1, f"{forged}\nfleet: box/qwen restarted; following its new log evil.log\n")
    said = events_of(host, ["qwen"])
    assert [e["e"] for e in said] == ["log", "line", "line"] and said[1]["text"] == forged


def test_the_newest_deployment_several_named_and_missing_ones(tmp_path: Path) -> None:
    host = host_with_logs(tmp_path)
    assert [e["e"] for e in events_of(host, [None])] == ["missing"]  # nothing deployed yet
    attempt(tmp_path, "old", 1, "old line\n")
    os.utime(tmp_path / "old.latest.log", (1, 1), follow_symlinks=False)
    attempt(tmp_path, "new", 1, "new line\n")
    assert [(e["e"], e.get("d")) for e in events_of(host, [None])] == [("log", "new"), ("line", "new")]
    said = events_of(host, ["old", "new", "gone", "../new", None])
    assert [(e["e"], e.get("d")) for e in said] == [
        ("log", "old"),
        ("line", "old"),
        ("log", "new"),
        ("line", "new"),
        ("missing", "gone"),
        ("missing", "../new"),  # a name is never a path on the host
    ]  # and the newest, already shown as "new", is not shown twice


def test_the_last_lines_and_a_line_still_being_written(tmp_path: Path) -> None:
    host = host_with_logs(tmp_path)
    attempt(tmp_path, "qwen", 1, "".join(f"line {i}\n" for i in range(50)) + "Loading shards: 40%")
    assert log_text(LocalTransport("box"), host, "qwen", 3) == "line 48\nline 49\nLoading shards: 40%\n"
    with pytest.raises(FleetError, match="no server log for deployment other"):
        log_text(LocalTransport("box"), host, "other", 3)


def test_several_logs_are_prefixed_and_fleets_own_words_go_to_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = host_with_logs(tmp_path)
    view = LogsView({"HF_TOKEN": "hf_secretvalue123"}, raw=False, several=True)
    view.on_event(host, None, {"e": "line", "d": "a", "text": "token hf_secretvalue123 \x1b]0;owned\x07done"})
    view.on_event(host, "b", {"e": "switch", "d": "b", "log": "b-2.log"})
    view.on_event(host, "c", {"e": "missing", "d": "c"})
    out, err = capsys.readouterr()
    assert out.startswith("box/a | token ") and "hf_secretvalue123" not in out and "\x1b" not in out
    assert err.splitlines()[0] == "fleet: box/b restarted; following its new log b-2.log"
    assert "box: no server log for deployment c" in err and view.failures == [1]
    alone = LogsView({}, raw=False, several=False)
    alone.on_event(host, "a", {"e": "line", "d": "a", "text": "plain"})
    assert capsys.readouterr().out == "plain\n"  # one log: its lines as they are
    with pytest.raises(FleetError, match="no server log for deployment c"):
        alone.on_event(host, "c", {"e": "missing", "d": "c"})


def test_a_deployment_name_from_the_host_is_shown_as_plain_text_and_a_repeated_missing_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = host_with_logs(tmp_path)
    view = LogsView({}, raw=False, several=True)
    hostile = "a\x1b]0;owned\x07\nfleet: fake"
    view.on_event(host, None, {"e": "line", "d": hostile, "text": "x"})
    view.on_event(host, None, {"e": "switch", "d": hostile, "log": "b-2.log"})
    for _ in range(1000):
        view.on_event(host, None, {"e": "missing", "d": hostile})
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert not any(line.startswith("fleet: fake") for line in (out + err).splitlines())
    assert err.count("no server log") == 1 and view.failures == [1]


def test_a_fifo_in_place_of_a_log_is_not_waited_on(tmp_path: Path) -> None:
    """Reading a FIFO blocks until someone writes it: it is no log, and the step ends at once (a swap
    after that check is opened without blocking too)."""
    from fleet.host.logs import last_lines

    host = host_with_logs(tmp_path)
    os.mkfifo(tmp_path / "q-1.log")
    (tmp_path / "q.latest.log").symlink_to("q-1.log")
    with pytest.raises(FleetError, match="no server log for deployment q"):
        log_text(LocalTransport("box"), host, "q", 5)
    assert last_lines(str(tmp_path / "q-1.log"), 5) == ([], 0)


def test_a_huge_line_in_the_last_lines_is_cut_as_the_follower_cuts_it(tmp_path: Path) -> None:
    """A crash that dumps a 2 MiB line (or 200 KiB that JSON escapes sixfold) once broke the read."""
    host = host_with_logs(tmp_path)
    attempt(tmp_path, "q", 1, "")
    (tmp_path / "q-1.log").write_bytes(b"x" * (2 << 20) + b"\n" + b"\xff" * (200 << 10) + b"\nTraceback: boom\n")
    shown = log_text(LocalTransport("box"), host, "q", 5).splitlines()
    assert shown[0].startswith("x" * 100) and shown[0].endswith(
        f"[fleet: {(2 << 20) - (16 << 10)} more bytes of this line not shown]"
    )
    assert "more bytes of this line not shown" in shown[1] and shown[2] == "Traceback: boom"


def test_every_last_line_asked_for_arrives_however_slowly_it_is_read(tmp_path: Path) -> None:
    """`fleet logs -n 200000 | less`: the last lines are bounded already, so none is dropped for a reader
    that pauses (lines are dropped, and counted, only while following)."""
    import time

    host = host_with_logs(tmp_path)
    attempt(tmp_path, "q", 1, "".join(f"line {i} {'y' * 60}\n" for i in range(120_000)))
    got: list[LogsEvent] = []

    def slow(event: LogsEvent) -> bool:
        if len(got) == 10:
            time.sleep(2)  # the host's pipe fills meanwhile
        got.append(event)
        return True

    assert read_logs(LocalTransport("box"), host, names=["q"], lines=200_000, follow=False, on_event=slow) == 0
    lines = [e for e in got if e["e"] == "line"]
    assert len(lines) == 120_000 and lines[-1]["text"].startswith("line 119999 ")


def test_a_link_out_of_the_log_directory_is_no_log(tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-secret.txt"
    outside.write_text("root:x:0:0\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "q.latest.log").symlink_to(outside)
    with pytest.raises(FleetError, match="no server log for deployment q"):
        log_text(LocalTransport("box"), host_with_logs(logs), "q", 5)


def test_lines_dropped_while_following_are_counted_and_said(tmp_path: Path) -> None:
    """Following, a reader that pauses may lose lines (the host holds at most 4 MiB for it), but every
    line is either shown or counted in a `skipped` event, also when the log goes quiet after the burst."""
    import time

    host = host_with_logs(tmp_path)
    log = attempt(tmp_path, "q", 1, "start\n")
    follow = Following(host, ["q"])
    try:
        follow.until("start")
        follow.reading.clear()
        with log.open("a") as f:  # 12 MB: three times what the host holds for a reader
            f.writelines(f"burst {i} {'z' * 8000}\n" for i in range(1_500))
        time.sleep(3)  # not reading: the host's output backs up past its bound
        follow.reading.set()
        shown = skipped = 0
        while shown + skipped < 1_500:
            event = follow.events.get(timeout=120)
            shown += event["e"] == "line"
            skipped += event.get("lines", 0) if event["e"] == "skipped" else 0
        assert shown + skipped == 1_500
    finally:
        follow.close(log)


def test_a_secret_cut_with_its_line_is_not_shown_in_part() -> None:
    from fleet.secrets import redact

    cut = "token=hf_AbCdEfGhIj [fleet: 25 more bytes of this line not shown]"
    shown = redact(cut, {"HF_TOKEN": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123"})
    assert shown == "token=*** [fleet: 25 more bytes of this line not shown]"
    assert redact("hf_A [fleet: 1 more bytes of this line not shown]", {"T": "hf_AbCd"}) == (
        "*** [fleet: 1 more bytes of this line not shown]"
    )


def test_a_reader_catching_up_gets_the_backlog_as_fast_as_it_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's follow loop waits between looks at the log; what waits to be written goes out while it
    waits, as fleet reads it (it once went one pipe-full per look: 64 KiB every 0.25 s)."""
    import os
    import threading

    from fleet.host.follow import Output

    read_end, write_end = os.pipe()
    received = bytearray()
    reader = threading.Thread(
        target=lambda: [received.extend(c) for c in iter(lambda: os.read(read_end, 1 << 16), b"")]
    )
    reader.start()
    with os.fdopen(write_end, "w") as stdout:
        monkeypatch.setattr("sys.stdout", stdout)
        out = Output()
        out.emit({"e": "line", "text": "z" * (1 << 20)})  # 1 MiB: sixteen pipe-fulls
        out.wait(1.0)
        assert not out.pending  # all of it written within the one wait
    reader.join(10)
    os.close(read_end)
    assert len(received) > 1 << 20


def test_lines_nobody_reads_are_held_to_the_bound_then_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's output to a fleet that reads nothing: log lines beyond OUT_LIMIT waiting are dropped and
    counted, said in one `skipped` event; an event that is not a log line is never dropped."""
    import os

    from fleet.host.follow import OUT_LIMIT, Output

    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as stdout:
        monkeypatch.setattr("sys.stdout", stdout)
        out = Output()
        line = {"e": "line", "text": "z" * 8000}
        total = 3 * OUT_LIMIT // 8000
        for _ in range(total):
            out.emit(line)
        assert out.lines_held <= OUT_LIMIT + 9000 and out.skipped > total // 2
        dropped = out.skipped
        out.emit({"e": "log", "log": "q-2.log"})  # not a line: kept, and the count said before it
        assert out.skipped == 0
        tail = bytes(out.pending[-200:]).decode()
        assert f'{{"e": "skipped", "lines": {dropped}}}\n{{"e": "log", "log": "q-2.log"}}\n' in tail
    os.close(read_end)


@pytest.mark.parametrize("winding_down", [EOFError(), KeyboardInterrupt(), FleetError("the SSH connection dropped")])
def test_once_the_reader_went_away_how_the_stream_winds_down_is_not_the_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, winding_down: BaseException
) -> None:
    """`fleet logs | head -1` on a loaded machine ended "aborted", exit 130: after `head` went away, the
    stream's teardown raised (EOFError from a channel whose close could not be sent) and that was taken
    for the outcome. Once the reader is gone, the command ends as `tail` does (141), one host or several."""
    import click

    host = host_with_logs(tmp_path)
    signal = isinstance(winding_down, KeyboardInterrupt)  # a signal reaches the main thread alone
    for several in (False,) if signal else (False, True):
        view = LogsView({}, raw=False, several=several)

        def read_host(*_args: object, view: LogsView = view) -> int:
            view.reader_gone = True
            view.stop.set()
            raise winding_down

        monkeypatch.setattr(view, "read_host", read_host)
        targets = [(host, [None])] * (2 if several else 1)
        with pytest.raises(click.exceptions.Exit) as ended:
            view.run(None, targets, lines=10, follow=False)  # type: ignore[arg-type]
        assert ended.value.exit_code == 141 and view.failures == []
