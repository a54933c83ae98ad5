"""Every streamed host step (watch, logs, pull, receive, engine) is read by one bounded reader:
fleet.hostscripts.EventLines."""

from __future__ import annotations

import json

import pytest

from fleet.errors import HostStepError
from fleet.hostscripts import EVENT_BYTES, EventLines, json_lines


def test_an_event_cut_across_chunks_is_read_once_whole() -> None:
    reader = EventLines("ct129", "watch")
    line = json.dumps({"e": "line", "o": 10, "t": "loading weights"}).encode() + b"\n"
    assert reader.feed(line[:7]) == []
    assert reader.feed(line[7:] + b"\n\n") == [{"e": "line", "o": 10, "t": "loading weights"}]
    assert reader.said == 1


def test_a_host_that_never_ends_a_line_is_refused_before_it_grows_fleets_memory() -> None:
    reader = EventLines("ct129", "pull")
    reader.feed(b'{"e": "progress", "x": "' + b"a" * (EVENT_BYTES // 2))
    with pytest.raises(HostStepError, match=r"ct129: fleet's pull step sent a line of over 1048576 bytes"):
        reader.feed(b"a" * (EVENT_BYTES // 2 + 2))


def test_stray_output_and_the_no_python_answer_are_error_events_not_crashes() -> None:
    reader = EventLines("ct129", "engine")
    said = reader.feed(
        b"Traceback (most recent call last): boom\n"
        b'{"error": "no Python to run it: tried python3"}\n'
        b"[1, 2]\n"
        b'{"e": "done"}\n'
    )
    assert said == [
        {"e": "error", "error": "Traceback (most recent call last): boom"},
        {"e": "error", "error": "no Python to run it: tried python3"},
        {"e": "error", "error": "[1, 2]"},
        {"e": "done"},
    ]


def test_json_lines_hands_each_event_on_and_keeps_the_bound() -> None:
    seen: list[dict[str, object]] = []
    on_chunk = json_lines(seen.append, "blackwell", "receive")
    assert on_chunk(b'{"e": "need", "need": []}\n{"e": "pul') is True
    assert on_chunk(b'led"}\n') is True
    assert seen == [{"e": "need", "need": []}, {"e": "pulled"}]
    with pytest.raises(HostStepError, match="receive step"):
        on_chunk(b"x" * (EVENT_BYTES + 1))
