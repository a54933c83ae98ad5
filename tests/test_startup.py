"""An engine's start-up read from its own lines (fleet.startup): phases on the real logs of the corpus and
on both engines' spellings across versions, a timeline, an ETA from earlier starts, stall bounds, and the
host's history of starts (fleet.host.startup)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fleet.host.startup import KEYS_KEPT, STARTS_KEPT, StartupWatch, remember_startup, startup_history
from fleet.startup import (
    PHASE_QUIET_BOUND_S,
    PHASES,
    STALL_FLOOR_S,
    StartupTimeline,
    history_key,
    phase_now,
    phase_of_line,
    stall_bound,
    startup_eta,
    typical_startup,
)
from test_corpus import CORPUS

# What a start-up line says, in words an operator would grep for, independent of fleet's patterns.
SAID = {
    "weights": ("Load weight", "checkpoint shards", "Loading weights took", "Model loading took"),
    "graphs": ("Capture cuda graph", "Capturing batches", "Capturing CUDA graph", "Graph capturing finished"),
    "kv_cache": ("KV Cache is allocated", "Memory pool end", "Available KV cache memory", "# GPU blocks"),
    "compile": ("Dynamo bytecode transform", "Compiling a graph", "torch.compile takes", "DeepGEMM"),
    "warmup": ("Uvicorn running", "Starting vLLM API server", "template warmup", "modal warmup"),
    "download": ("Downloading",),
}
# A line that reports or quotes a failure is not the engine moving along
FAILURE = re.compile(r"(Error|Exception|failed|Traceback|^\s+File |^\s|disable torch compile)")


def corpus_lines() -> list[tuple[str, str]]:
    return [
        (log.name, line.rstrip("\n"))
        for log in sorted((CORPUS / "cases").glob("*.log"))
        for line in log.read_text(errors="replace").splitlines()
    ]


def test_every_start_up_line_of_the_real_logs_gives_its_phase() -> None:
    seen: dict[str, set[str]] = {}
    for name, line in corpus_lines():
        said = [phase for phase, words in SAID.items() if any(w in line for w in words)]
        if not said or FAILURE.search(line):
            continue
        got = phase_of_line(line)
        assert got is not None and got[0] == said[0], (name, line)
        seen.setdefault(said[0], set()).add(name)
    # both engines' logs in the corpus reach these phases
    assert {"weights", "graphs", "kv_cache", "compile", "warmup", "download"} <= set(seen)
    assert len(seen["graphs"]) >= 5 and len(seen["weights"]) >= 4


def test_failures_and_quoted_text_in_the_real_logs_never_move_a_phase() -> None:
    for name, line in corpus_lines():
        if FAILURE.search(line):
            assert phase_of_line(line) is None, (name, line)


@pytest.mark.parametrize(
    "line",
    [
        'INFO:     127.0.0.1:5555 - "POST /generate HTTP/1.1" 200 OK Capture cuda graph begin',
        "[2026-01-01 10:00:00] Receive: obj=GenerateReqInput(text='Load weight begin')",
        "(APIServer pid=1) INFO 05-06 04:33:07 [logger.py:43] Received request chatcmpl-1: prompt: "
        "'Loading safetensors checkpoint shards:  10% Completed | 1/9 ['",
        "Capture cuda graph begin",  # not a log record of the engine's: no prefix
        "Exception: Capture cuda graph failed: out of memory",
    ],
)
def test_a_request_or_a_bare_phrase_is_not_the_engine_s_start_up(line: str) -> None:
    assert phase_of_line(line) is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # SGLang 0.5.11 and 0.5.23 spellings
        ("[2026-12-04 10:00:00 TP0] Init torch distributed begin.", ("distributed", False, None, None)),
        ("[2026-12-04 10:00:00 TP0] Init parallel begin.", ("distributed", False, None, None)),
        ("[2026-12-04 10:05:01 TP0] Memory pool end. avail mem=13.58 GB", ("kv_cache", False, None, None)),
        ("[2026-12-04 10:00:01 TP0] Load weight begin. avail mem=78.38 GB", ("weights", False, None, None)),
        (
            "Loading safetensors checkpoint shards:  56% Completed | 5/9 [00:13<00:11,  2.87s/it]",
            ("weights", False, 5, 9),
        ),
        ("[2026-12-04 10:05:00 TP0] Load weight end. type=Qwen3ForCausalLM", ("weights", True, None, None)),
        ("[2026-12-04 10:05:01 TP0] KV Cache is allocated. #tokens: 100", ("kv_cache", False, None, None)),
        ("[2026-12-04 10:05:02 TP0] Capture cuda graph begin. This can take up to", ("graphs", False, None, None)),
        (
            "[2026-12-04 10:05:02 TP0] Capture target decode CUDA graph begin. backend=full",
            ("graphs", False, None, None),
        ),
        ("Capturing batches (bs=8 avail_mem=11.18 GB):  35%|███▌      | 8/23 [00:03<00:06]", ("graphs", False, 8, 23)),
        ("[2026-12-04 10:05:40 TP0] Capture target decode CUDA graph end. bs=[1]", ("graphs", True, None, None)),
        ("INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)", ("warmup", False, None, None)),
        # vLLM, with and without the process prefix, and behind `docker logs --timestamps`
        ("(EngineCore pid=7) INFO 05-18 06:19:19 [gpu_model_runner.py:1] Starting to load model /m",
         ("weights", False, None, None)),
        ("INFO 06-22 02:54:36 [backends.py:193] Compiling a graph for general shape takes 14.65 s",
         ("compile", False, None, None)),
        ("2025-04-06T07:55:21.1Z INFO 04-06 00:55:21 [gpu_worker.py:1] Available KV cache memory: 2 GiB",
         ("kv_cache", False, None, None)),
        ("Capturing CUDA graphs (decode, FULL):  50%|█████     | 1/2 [00:00<00:00,  1.92it/s]",
         ("graphs", False, 1, 2)),
        # vLLM 0.32 on CPU (the one CI runs)
        ("(EngineCore pid=357) INFO 12-04 09:52:00 [kv_cache_utils.py:2327] CPU KV cache size: 281,965 tokens, "
         "Maximum concurrency for 512 tokens per request: 550.71x", ("kv_cache", False, None, None)),
        ("(APIServer pid=344) INFO 12-04 09:52:01 [entry.py:140] Starting vLLM server on http://127.0.2.9:8011",
         ("warmup", False, None, None)),
        # a progress bar that redraws itself with carriage returns
        ("Loading safetensors checkpoint shards:   0% Completed | 0/9 [\rLoading safetensors checkpoint shards:  "
         "11% Completed | 1/9 [00:01<00:08]\r", ("weights", False, 1, 9)),
    ],
)  # fmt: skip
def test_both_engines_spellings_give_their_phase_and_progress(line: str, expected: tuple[object, ...]) -> None:
    assert phase_of_line(line) == expected


SGLANG_START = [
    (0.0, "[t TP0] Init torch distributed begin."),
    (2.0, "[t TP0] Load weight begin. avail mem=78.38 GB"),
    (3.0, "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01]"),
    (60.0, "Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:02<00:00]"),
    (61.0, "[t TP0] Load weight end. type=X"),
    (70.0, "[t TP0] KV Cache is allocated. #tokens: 1"),
    (72.0, "[t TP0] Capture cuda graph begin. This can take up to several minutes."),
    (100.0, "[t TP0] Capture cuda graph end. Time elapsed: 28 s"),
    (101.0, "INFO:     Uvicorn running on http://0.0.0.0:30000"),
]


def timeline_of(lines: list[tuple[float, str]], ready_at: float) -> StartupTimeline:
    t = StartupTimeline()
    for at, line in lines:
        t.feed(line.replace("[t ", "[2026-12-04 10:00:00 "), at)
    t.close(ready_at)
    return t


def test_a_timeline_is_the_phases_as_they_came_and_how_long_each_took() -> None:
    t = timeline_of(SGLANG_START, ready_at=104.0)
    assert [s[0] for s in t.spans] == ["distributed", "weights", "kv_cache", "graphs", "warmup"]
    assert t.durations() == {"distributed": 2.0, "weights": 68.0, "kv_cache": 2.0, "graphs": 29.0, "warmup": 3.0}
    assert set(t.durations()) <= set(PHASES)


def test_progress_and_a_new_phase_are_worth_saying_a_repeated_line_is_not() -> None:
    t = StartupTimeline()
    assert t.feed("[2026-12-04 10:00:00 TP0] Load weight begin.", 1.0)
    assert not t.feed("[2026-12-04 10:00:00 TP1] Load weight begin.", 1.1)  # another rank says the same
    assert t.feed("Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01]", 5.0)
    assert t.moved_at == 5.0 and (t.done, t.of) == (1, 2)
    assert t.feed("[2026-12-04 10:00:00 TP0] Load weight end.", 9.0)  # the end of the phase
    assert not t.feed("[2026-12-04 10:00:00 TP1] Load weight end.", 9.5) and t.moved_at == 9.5


def history(*ready_s: float, outcome: str = "ready") -> list[dict[str, object]]:
    out = []
    for total in ready_s:
        t = timeline_of(SGLANG_START, ready_at=total)
        out.append({"outcome": outcome, "ready_s": total, "phases": t.durations(), "order": [s[0] for s in t.spans]})
    return out


def test_no_eta_on_a_first_start_and_none_from_starts_that_failed() -> None:
    assert startup_eta(None, "weights", 5.0, 7.0) is None
    assert typical_startup(history(104.0, outcome="exited")) is None


def test_the_eta_is_what_is_left_of_this_phase_and_the_usual_length_of_the_rest() -> None:
    typical = typical_startup(history(104.0, 104.0, 110.0))
    assert typical is not None and typical["starts"] == 3
    # in the weights phase (68 s here) for 10 s: 58 s of it, then kv_cache 2 + graphs 28 + warmup 3 (+6 s
    # the slowest start spent warming up is not the median)
    assert startup_eta(typical, "weights", 10.0, 12.0) == pytest.approx(58.0 + 2.0 + 29.0 + 3.0)
    # the phase's own progress bar says more than the clock: 1 of 2 shards done
    assert startup_eta(typical, "weights", 10.0, 12.0, done=1, of=2) == pytest.approx(34.0 + 2.0 + 29.0 + 3.0)
    assert startup_eta(typical, "warmup", 5.0, 120.0) == 0.0  # late, not negative


def test_a_phase_stalls_after_a_multiple_of_its_usual_length_or_its_documented_bound() -> None:
    typical = typical_startup(history(104.0))
    assert stall_bound(typical, "graphs") == pytest.approx(3 * 29.0)
    assert stall_bound(typical, "distributed") == STALL_FLOOR_S  # 3 x 2 s is less than the floor
    assert stall_bound(typical, "compile") == PHASE_QUIET_BOUND_S["compile"]  # never ran here
    assert stall_bound(None, "weights") == PHASE_QUIET_BOUND_S["weights"]
    assert stall_bound(typical, None) is None  # before the first phase: the progress timeout's


def test_the_watcher_calls_a_quiet_phase_stalled_and_a_progressing_one_not(tmp_path: Path) -> None:
    key = history_key("/models/q", "sglang", "0.5.11", (0, 1))
    for entry in history(104.0):
        remember_startup(str(tmp_path), key, entry)
    watch = StartupWatch({"state_dir": str(tmp_path), "startup_key": key}, started=1000.0)
    said = watch.line("[2026-12-04 10:00:00 TP0] Capture cuda graph begin.", 1072.0)
    assert said is not None and said["phase"] == "graphs" and said["usual_s"] == 29.0 and said["starts"] == 1
    assert said["eta_s"] == pytest.approx(29.0 + 3.0)
    # a slow capture that keeps printing its progress is not stalled
    for i in range(1, 10):
        assert watch.line(f"Capturing batches (bs=1 avail_mem=1 GB):  {i}0%|█| {i}/10 [00:0{i}<00:01]", 1072.0 + 80 * i)
        assert watch.stalled(1072.0 + 80 * i + 60) is None
    quiet_since = 1072.0 + 80 * 9
    stall = watch.stalled(quiet_since + 3 * 29.0 + 1)
    assert stall is not None and stall["what"] == "stall" and stall["phase"] == "graphs"
    assert stall["bound_s"] == pytest.approx(87.0) and stall["after_s"] == pytest.approx(88.0)
    entry = watch.record("stalled", quiet_since + 88.0)
    assert entry is not None and entry["outcome"] == "stalled" and entry["order"] == ["graphs"]
    assert watch.record("exited", quiet_since + 90.0) is None  # once
    kept = startup_history(str(tmp_path), key)
    assert [h["outcome"] for h in kept] == ["ready", "stalled"]


def test_the_hosts_history_is_bounded_per_start_and_in_combinations(tmp_path: Path) -> None:
    for i in range(STARTS_KEPT + 3):
        remember_startup(str(tmp_path), "a", {"outcome": "ready", "ready_s": float(i), "phases": {}})
    assert [h["ready_s"] for h in startup_history(str(tmp_path), "a")] == [float(i) for i in range(3, 13)]
    for i in range(KEYS_KEPT + 5):
        remember_startup(str(tmp_path), f"k{i}", {"outcome": "ready"})
    kept = json.loads((tmp_path / "startup.json").read_text())
    assert len(kept) == KEYS_KEPT and "a" not in kept and f"k{KEYS_KEPT + 4}" in kept


def test_a_corrupt_history_is_no_history(tmp_path: Path) -> None:
    (tmp_path / "startup.json").write_text('{"k": "not a list"')
    assert startup_history(str(tmp_path), "k") == []
    remember_startup(str(tmp_path), "k", {"outcome": "ready"})
    assert startup_history(str(tmp_path), "k") == [{"outcome": "ready"}]


@pytest.mark.parametrize(
    "bad",
    [
        {"phases": {"weights": "sixty"}},
        {"phases": {"weights": -1.0}},
        {"phases": {"\x1b[2Jweights": 1.0}},
        {"ready_s": None},
        {"order": "weights"},
        {"order": ["weights", 7]},
    ],
)
def test_a_kept_start_that_fleet_did_not_write_is_no_history(bad: dict[str, object]) -> None:
    """A hand-edited or half-written startup.json must not stop the watcher (it reads it at every start)."""
    kept = {"outcome": "ready", "ready_s": 10.0, "phases": {"weights": 6.0}, "order": ["weights"], **bad}
    assert typical_startup([kept]) is None
    assert typical_startup([kept, *history(104.0)]) == typical_startup(history(104.0))


def test_a_playbook_that_waits_through_stalls_hears_of_each_quiet_spell_once(tmp_path: Path) -> None:
    watch = StartupWatch({"state_dir": str(tmp_path), "startup_key": None, "on_stall": "wait"}, started=0.0)
    watch.line("[2026-12-04 10:00:00 TP0] Capture cuda graph begin.", 1.0)
    bound = PHASE_QUIET_BOUND_S["graphs"]
    first = watch.stalled(1.0 + bound + 1)
    assert first is not None and first["e"] == "stalled" and "what" not in first and first["phase"] == "graphs"
    assert watch.stalled(1.0 + bound + 2) is None and watch.stalled(1.0 + 5 * bound) is None  # the same spell
    moved = 1.0 + 5 * bound
    watch.line("Capturing batches (bs=1 avail_mem=1 GB):  50%|█| 1/2 [00:01<00:01]", moved)  # it moved: a new spell
    assert watch.stalled(moved + bound / 2) is None
    again = watch.stalled(moved + bound + 1)
    assert again is not None and again["e"] == "stalled"


def write_phase_dir(tmp_path: Path) -> Path:
    d = tmp_path / "deployments" / "q"
    d.mkdir(parents=True)
    return d


def test_the_current_phase_is_left_for_status_at_most_once_a_second_and_gone_when_the_start_ends(
    tmp_path: Path,
) -> None:
    d = write_phase_dir(tmp_path)
    a = {"state_dir": str(tmp_path), "startup_key": "k", "deployment": "q", "run_id": "r1"}
    watch = StartupWatch(a, started=1000.0)
    watch.line("[2026-12-04 10:00:00 TP0] Load weight begin. avail mem=78.00 GB", 1002.0)
    said = json.loads((d / "phase.json").read_text())
    assert (
        said["phase"] == "weights" and said["run_id"] == "r1" and (said["started"], said["since"]) == (1000.0, 1002.0)
    )
    for i, now in enumerate((1002.3, 1002.6), start=1):  # progress within the second: not written again
        watch.line(f"Loading safetensors checkpoint shards:  {i}0% Completed | {i}/10 [00:0{i}<00:09,  1.0it/s]", now)
    assert json.loads((d / "phase.json").read_text())["done"] is None
    watch.line("Loading safetensors checkpoint shards:  30% Completed | 3/10 [00:03<00:07,  1.0it/s]", 1003.5)
    assert json.loads((d / "phase.json").read_text())["done"] == 3
    watch.line("[2026-12-04 10:00:03 TP0] Capture cuda graph begin.", 1003.6)  # a new phase: at once
    assert json.loads((d / "phase.json").read_text())["phase"] == "graphs"
    watch.record("exited", 1004.0)
    assert not (d / "phase.json").exists()


def test_status_ages_the_watchers_eta_and_trusts_only_this_runs_well_formed_phase() -> None:
    said = {"phase": "graphs", "run_id": "r1", "started": 100.0, "since": 150.0, "updated": 160.0, "eta_s": 30.0,
            "done": 3, "of": 36, "starts": 2}  # fmt: skip
    now = phase_now(said, "r1", 170.0)
    assert now is not None and (now["elapsed_s"], now["in_phase_s"], now["eta_s"]) == (70.0, 20.0, 20.0)
    assert (now["done"], now["of"], now["starts"], now["title"]) == (3, 36, 2, "capturing CUDA graphs")
    assert phase_now(said, "r1", 500.0)["eta_s"] == 0.0  # type: ignore[index]  # late: "about 0 s", never negative
    assert phase_now(said, "another run", 170.0) is None  # what an earlier run left
    for bad in ({"phase": "\x1b]0;pwned\x07"}, {"started": "soon"}, {"since": None}, {"updated": True}):
        assert phase_now({**said, **bad}, "r1", 170.0) is None
    assert phase_now({**said, "eta_s": "x", "done": -1}, "r1", 170.0)["eta_s"] is None  # type: ignore[index]


def test_a_timeline_shows_each_kept_start_safely_and_counts_what_it_cannot_show() -> None:
    from fleet.cli.timeline import history_lines

    starts = [
        *history(104.0),
        {**history(98.0)[0], "outcome": "ready\x1b[2J\u202e", "fixes": ["cuda-graph-oom\r\nFAKE ROW"]},
        {"outcome": "ready", "ready_s": "fast", "phases": {}},  # not what fleet writes
        {**history(140.0)[0], "outcome": "stalled", "at": "yesterday"},
    ]
    lines = history_lines("ct129/q", history_key("/m/q\x1b[31m", "sglang", "0.5.11", (0, 1)), True, starts)
    text = "\n".join(lines)
    assert "\x1b" not in text and "\u202e" not in text and "\r" not in text and len(lines) == 2 + 3 + 1 + 1
    assert (
        lines[0].startswith("ct129/q: /m/q") and "sglang 0.5.11 on GPUs 0,1 (this deployment's; 3 starts)" in lines[0]
    )
    assert lines[4].split()[:2] == ["?", "stalled"]  # an unreadable time is a question mark, not a crash
    assert lines[5].split()[:4] == ["median", "of", "1", "ready"]  # of the starts that reached ready (said so)
    assert lines[6] == "  (1 kept entries not shown: not in the shape fleet writes)"


def test_a_restart_or_heal_keeps_the_playbooks_start_up_bounds_from_the_record() -> None:
    from fleet.control.ops import recorded_bounds
    from fleet.facts.recorded import parse_recorded

    def bounds(record: dict[str, object]) -> dict[str, object]:
        return recorded_bounds(parse_recorded(record))

    assert bounds({"ready_timeout_s": 1800, "on_stall": "wait"}) == {"ready_timeout_s": 1800.0, "on_stall": "wait"}
    assert bounds({}) == {}  # a record from before they were kept: the defaults
    for bad in ({"ready_timeout_s": True}, {"ready_timeout_s": -5}, {"ready_timeout_s": 1e9}, {"on_stall": "rm -rf"}):
        assert bounds(bad) == {}
