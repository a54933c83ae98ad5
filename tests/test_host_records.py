"""fleet's records on a host (fleet.host.records): versioned on every read and write, a newer fleet's record
refused and kept, an older one migrated, and a deployment's status moved only along its transitions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.host.records import (
    HEALS_FILE,
    HOST_WIDE,
    LEARNED_FILE,
    LOCK_FILE,
    ROUTER_FILE,
    SCHEMA_KEY,
    SCHEMAS,
    STATE_FILE,
    TRANSITIONS,
    RecordTooNew,
    change_status,
    load_record,
    may_become,
    read_record,
    write_record,
)
from fleet.protocol import FAILED, READY, STARTING, STATE_SCHEMA, STOPPED, UNVERIFIED
from test_step_ahead import release  # an act request whose lock takes the deployment `small`


def put(directory: Path, name: str, data: object) -> Path:
    path = directory / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_a_record_written_by_a_newer_fleet_is_refused_and_kept_as_it_is(tmp_path: Path, name: str) -> None:
    path = put(tmp_path, name, {SCHEMA_KEY: SCHEMAS[name] + 1, "status": "paused-by-a-future-fleet"})
    before = path.read_bytes()
    with pytest.raises(RecordTooNew, match=rf"{name} was written by a newer fleet .*upgrade this one"):
        read_record(str(path))
    record, error = load_record(str(path))
    if name in HOST_WIDE:  # the host's own files: absent to this fleet, and no fault of the host
        assert record is None and error is None
    else:
        assert record is None and error is not None and "newer fleet" in error
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [name]  # not set aside


def test_an_older_fleets_records_are_migrated_as_they_are_read(tmp_path: Path) -> None:
    heals = put(tmp_path, HEALS_FILE, [100.0, 200.0])  # version 0: the list alone
    learned = put(tmp_path, LEARNED_FILE, {"qwen|sglang": [{"signature": "nextn-mamba"}]})  # the dict alone
    state = put(tmp_path, STATE_FILE, {"status": READY, "pid": 42})  # one server per host: version 1
    lock = put(tmp_path, LOCK_FILE, {"run_id": "r1"})  # before versions
    assert read_record(str(heals)) == {SCHEMA_KEY: 1, "times": [100.0, 200.0]}
    assert read_record(str(learned)) == {SCHEMA_KEY: 1, "fixes": {"qwen|sglang": [{"signature": "nextn-mamba"}]}}
    assert read_record(str(state)) == {SCHEMA_KEY: STATE_SCHEMA, "status": READY, "pid": 42}
    assert load_record(str(lock)) == ({SCHEMA_KEY: 1, "run_id": "r1"}, None)


def test_every_write_says_its_records_version(tmp_path: Path) -> None:
    for name in (STATE_FILE, ROUTER_FILE, "anything-else.json"):
        write_record(str(tmp_path / name), {"pid": 7, SCHEMA_KEY: 99})  # a caller cannot claim another version
        assert json.loads((tmp_path / name).read_text())[SCHEMA_KEY] == SCHEMAS.get(name, 1)


@pytest.mark.parametrize("version", ["2", True, -1, 1.5, None])
def test_a_version_that_is_not_a_number_makes_the_file_no_record_set_aside(tmp_path: Path, version: object) -> None:
    path = put(tmp_path, LOCK_FILE, {SCHEMA_KEY: version, "run_id": "r1"})
    assert load_record(str(path))[1] is not None
    assert read_record(str(path)) is None
    assert [p.name.split("-")[0] for p in tmp_path.iterdir()] == ["lock.json.corrupt"]


@pytest.mark.parametrize("name", [HEALS_FILE, STATE_FILE, LEARNED_FILE])
@pytest.mark.parametrize("data", ["not a list", [1, 2], 7])
def test_a_file_in_no_shape_a_record_ever_had_is_no_record(tmp_path: Path, name: str, data: object) -> None:
    if name == HEALS_FILE and isinstance(data, list):
        return  # heals were a list before versions
    path = put(tmp_path, name, data)
    record, error = load_record(str(path))
    assert record is None and error == f"{path}: not a JSON object"  # as `fleet health` shows it
    assert read_record(str(path)) is None


# Every status to every status: the table in fleet.host.records, spelled out once more as what it means.
ALLOWED = {
    (STARTING, READY),
    (STARTING, UNVERIFIED),
    (STARTING, FAILED),
    (STARTING, STOPPED),
    (UNVERIFIED, STARTING),  # its watch resumed
    (UNVERIFIED, READY),
    (UNVERIFIED, FAILED),
    (UNVERIFIED, STOPPED),
    (READY, FAILED),  # a group gave up after this rank was proven
    (READY, STOPPED),
    (FAILED, STOPPED),
    (STOPPED, FAILED),  # a group stopped its ranks, then gave up
}
STATUSES = (STARTING, READY, UNVERIFIED, FAILED, STOPPED)


@pytest.mark.parametrize("current", STATUSES)
@pytest.mark.parametrize("new", STATUSES)
def test_a_status_moves_only_along_its_transitions(current: str, new: str) -> None:
    assert may_become(current, new) == (current == new or (current, new) in ALLOWED)
    assert set(TRANSITIONS) == set(STATUSES)


def test_a_late_watcher_cannot_revive_a_deployment_stopped_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / STATE_FILE
    write_record(str(path), {"status": STOPPED, "run_id": "r1", "reason": "replaced by deployment big"})
    before = path.read_bytes()
    assert not change_status(str(path), READY, {"ready_at": 1.0}, "r1")
    assert path.read_bytes() == before


def test_a_status_change_is_for_its_own_runs_record_only(tmp_path: Path) -> None:
    path = tmp_path / STATE_FILE
    write_record(str(path), {"status": STARTING, "run_id": "r2"})
    assert not change_status(str(path), UNVERIFIED, {"reason": "r1 went away"}, "r1")
    assert change_status(str(path), UNVERIFIED, {"reason": "r2 went away"}, "r2")
    assert change_status(str(path), STARTING, {"reason": None}, "r2")  # its watch resumed: the reason goes
    record = read_record(str(path))
    assert record is not None and record["status"] == STARTING and "reason" not in record


def test_a_status_change_on_a_host_without_a_record_starts_one(tmp_path: Path) -> None:
    assert change_status(str(tmp_path / STATE_FILE), STOPPED, {"reason": "stopped by fleet stop"})
    record = read_record(str(tmp_path / STATE_FILE))
    assert record is not None and record["status"] == STOPPED and record[SCHEMA_KEY] == STATE_SCHEMA


def test_a_newer_fleets_host_wide_records_never_fail_a_deploy_and_are_left_as_they_are(tmp_path: Path) -> None:
    """The learned fixes and the start-up history are the host's, shared by every fleet using it: one
    written by a newer fleet is read as empty here and left alone, and the server this run proved is
    still recorded ready and its lock released (a state or lock record is this run's own: those refuse)."""
    from fleet.host.startup import remember_startup, startup_history
    from fleet.host.watch import on_success, run_lock

    directory = tmp_path / "deployments" / "small"
    directory.mkdir(parents=True)
    write_record(str(directory / STATE_FILE), {"status": STARTING, "run_id": "r1"})
    write_record(str(directory / LOCK_FILE), {"run_id": "r1"})
    newer = {SCHEMA_KEY: 99, "fixes": {"k": "a shape this fleet cannot know"}}
    learned = put(tmp_path, LEARNED_FILE, newer)
    startup = put(tmp_path, "startup.json", {SCHEMA_KEY: 99})
    before = learned.read_bytes(), startup.read_bytes()
    request = {
        "state_dir": str(tmp_path),
        "deployment": "small",
        "run_id": "r1",
        "success_state": {"status": READY, "attempts": 1},
        "learned_key": "k",
        "learned": [{"signature": "cuda-graph-capture-failed"}],
    }
    on_success(request, run_lock(request))  # type: ignore[arg-type]
    assert (read_record(str(directory / STATE_FILE)) or {})["status"] == READY
    assert not (directory / LOCK_FILE).exists()
    assert startup_history(str(tmp_path), "k") == []
    with pytest.raises(RecordTooNew):
        remember_startup(str(tmp_path), "k", {"outcome": READY})  # the watcher's own caller skips it
    assert (learned.read_bytes(), startup.read_bytes()) == before


def test_a_record_is_read_only_from_a_regular_file_of_bounded_size(tmp_path: Path) -> None:
    """A FIFO in a record's place would hang every step that reads it; a link would be followed out of
    fleet's directory; a huge file would be read whole into every probe. None of them is read."""
    import os

    fifo = tmp_path / LOCK_FILE
    os.mkfifo(fifo)
    assert read_record(str(fifo)) is None  # returns at once, and the next write replaces it
    assert "not a regular file" in (load_record(str(fifo))[1] or "")
    secret = put(tmp_path, "elsewhere.json", {"run_id": "not fleet's"})
    (tmp_path / STATE_FILE).symlink_to(secret)
    assert read_record(str(tmp_path / STATE_FILE)) is None and load_record(str(tmp_path / STATE_FILE))[0] is None
    write_record(str(tmp_path / STATE_FILE), {"status": STOPPED})  # replaces the link, not its target
    assert json.loads(secret.read_text()) == {"run_id": "not fleet's"}
    huge = put(tmp_path, HEALS_FILE, {"times": [1.0] * (1 << 20)})
    assert "larger than 4 MiB" in (load_record(str(huge))[1] or "")


def test_json_nested_past_pythons_stack_is_no_record_and_set_aside(tmp_path: Path) -> None:
    path = tmp_path / LOCK_FILE
    path.write_text("[" * 100_000 + "]" * 100_000)  # 200 KB: under the size bound
    assert "not JSON fleet reads (RecursionError)" in (load_record(str(path))[1] or "")
    assert read_record(str(path)) is None and not path.exists()  # set aside, renamed


def test_a_status_that_is_not_a_word_never_stops_a_change(tmp_path: Path) -> None:
    path = put(tmp_path, STATE_FILE, {"status": ["ready"], "run_id": "r1"})
    assert may_become(["ready"], STOPPED)
    assert change_status(str(path), STOPPED, {"reason": "stopped by fleet stop"})
    assert (read_record(str(path)) or {})["status"] == STOPPED


def test_the_hosts_guard_is_never_waited_on_when_it_is_not_a_file(tmp_path: Path) -> None:
    import os

    from fleet.host.records import GUARD_FILE, host_guard

    os.mkfifo(tmp_path / GUARD_FILE)
    with pytest.raises(OSError), host_guard(str(tmp_path)):  # at once: a FIFO with no reader
        pass


def test_another_deployments_newer_record_still_protects_its_server_and_blocks_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop of this deployment goes on; the newer fleet's server is still a sibling, left running."""
    import os

    import fleet.host.free as free
    import fleet.host.lock as lock

    theirs = tmp_path / "deployments" / "theirs"
    theirs.mkdir(parents=True)
    put(theirs, STATE_FILE, {SCHEMA_KEY: 99, "status": READY, "pgid": os.getpgid(0), "gpus": [2, 3]})
    monkeypatch.setattr(free, "recorded_group_is_ours", lambda pgid, st: True)  # identity is tested elsewhere
    siblings, _, gpus = lock.sibling_groups(str(tmp_path), "mine", [], every=[0, 1, 2, 3])
    assert siblings == {os.getpgid(0): "theirs"} and gpus == {2, 3}
    assert json.loads((theirs / STATE_FILE).read_text())[SCHEMA_KEY] == 99


def test_forget_leaves_a_deployment_a_newer_fleet_wrote_records_for(tmp_path: Path) -> None:
    import fleet.host.lock as lock

    directory = tmp_path / "deployments" / "old"
    directory.mkdir(parents=True)
    write_record(str(directory / STATE_FILE), {"status": STOPPED})
    write_record(str(directory / LOCK_FILE), {"run_id": "r1"})
    put(directory, HEALS_FILE, {SCHEMA_KEY: 99, "times": [1.0]})
    assert lock.forget(str(directory)) == {"forgotten": False, "newer": [HEALS_FILE]}
    # nothing removed; the lock is the act step's to release (RunLock), as for every refusal
    assert sorted(p.name for p in directory.iterdir()) == [HEALS_FILE, LOCK_FILE, STATE_FILE]


def test_forget_takes_the_secrets_directory_of_a_container_deployment_with_it(tmp_path: Path) -> None:
    """The directory a container's launcher reads its secrets from is fleet's: forgotten with the records
    (and what a killed step left in it); anything else in it, or a link in its place, is somebody's."""
    import os

    import fleet.host.lock as lock

    directory = tmp_path / "deployments" / "boxed"
    secrets = directory / "secrets"
    secrets.mkdir(parents=True)
    write_record(str(directory / STATE_FILE), {"status": STOPPED})
    write_record(str(directory / LOCK_FILE), {"run_id": "r1"})
    (secrets / "notes.txt").write_text("mine")
    assert lock.forget(str(directory)) == {"forgotten": False, "left": ["secrets"]}
    assert (secrets / "notes.txt").exists()
    (secrets / "notes.txt").unlink()
    os.symlink(tmp_path, secrets / "env-boxed-1.json")  # a link by the name fleet writes
    assert lock.forget(str(directory)) == {"forgotten": False, "left": ["secrets"]}
    (secrets / "env-boxed-1.json").unlink()
    (secrets / "env-boxed-1.json").write_text("{}")  # left by a step killed before its launcher read it
    assert lock.forget(str(directory)) == {"forgotten": True}
    assert not directory.exists() and tmp_path.exists()

    linked = tmp_path / "deployments" / "linked"
    linked.mkdir()
    write_record(str(linked / LOCK_FILE), {"run_id": "r2"})
    os.symlink(tmp_path, linked / "secrets")
    assert lock.forget(str(linked)) == {"forgotten": False, "left": ["secrets"]}


def test_a_step_lets_its_runs_lock_go_only_through_run_lock(tmp_path: Path) -> None:
    """RunLock: released when the step ends if it says so (an exception too), at once with release_now
    (before the step says it is done), once; never another run's lock."""
    from fleet.host.records import RunLock

    lock_file = tmp_path / LOCK_FILE

    def held_by(run_id: str) -> None:
        write_record(str(lock_file), {"run_id": run_id})

    held_by("r1")
    with pytest.raises(RuntimeError), RunLock(str(tmp_path), "r1", release=True, guard_root=str(tmp_path)):
        raise RuntimeError("the step failed")
    assert not lock_file.exists()  # a failed step leaves no lock behind
    held_by("r1")
    with RunLock(str(tmp_path), "r1", release=False, guard_root=str(tmp_path)):
        pass
    assert lock_file.exists()  # a watch that ends with a failed attempt keeps it for the relaunch
    with RunLock(str(tmp_path), "r1", release=False, guard_root=str(tmp_path)) as lock:
        lock.release_now()
        assert not lock_file.exists()  # before the step's last word
        held_by("r2")  # another run takes the deployment at once
        lock.release_now()
    assert (read_record(str(lock_file)) or {})["run_id"] == "r2"  # released once: r2's is never touched
    with RunLock(str(tmp_path), "r1", release=True, guard_root=str(tmp_path)):
        pass
    assert (read_record(str(lock_file)) or {})["run_id"] == "r2"


def test_a_record_another_user_could_have_written_names_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record names the process groups fleet stops: one planted where another user can write (a state_dir
    under /tmp that they made first) would have fleet stop a group they chose."""
    import os

    write_record(str(tmp_path / STATE_FILE), {"status": READY, "pgid": 4242})
    assert read_record(str(tmp_path / STATE_FILE)) is not None  # fleet's own: mode 0600
    os.chmod(tmp_path / STATE_FILE, 0o666)
    assert read_record(str(tmp_path / STATE_FILE)) is None
    assert "not a file of this user's alone" in str(load_record(str(tmp_path / STATE_FILE))[1])
    os.chmod(tmp_path / STATE_FILE, 0o600)
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)  # the file is now another user's
    assert read_record(str(tmp_path / STATE_FILE)) is None


@pytest.mark.parametrize("where", ["", "deployments"])
def test_a_state_dir_others_may_write_is_refused_before_anything_is_read(tmp_path: Path, where: str) -> None:
    import os

    import fleet.host.lock as lock

    state = tmp_path / "state"
    (state / "deployments" / "small").mkdir(parents=True)
    os.chmod(state / where, 0o1777)  # sticky and open to all, as /tmp is
    planted = state / "deployments" / "small" / STATE_FILE
    planted.write_text(json.dumps({"status": READY, "pgid": os.getpgid(0)}))
    taken = lock.take_lock(release(state)["lock"])
    assert taken["status"] == "unwritable" and "only they may write" in str(taken.get("error"))
    assert not (state / "deployments" / "small" / LOCK_FILE).exists()


def test_a_directory_any_user_could_move_away_is_not_trusted(tmp_path: Path) -> None:
    """A directory of fleet's user alone is still another's to replace when a directory above it is open
    to all without the sticky bit: they rename it and put theirs in its place. /tmp's sticky bit stops that."""
    import os

    from fleet.host.records import not_ours_alone, unsafe_state_dir

    open_to_all = tmp_path / "shared"
    models = open_to_all / "team" / "models"
    models.mkdir(parents=True)
    os.chmod(open_to_all, 0o777)
    for why in (not_ours_alone(str(models)), unsafe_state_dir(str(models))):
        assert why is not None and f"inside {open_to_all}, which any user may write" in why
    os.chmod(open_to_all, 0o1777)  # sticky: only an entry's owner may rename it
    assert not_ours_alone(str(models)) is None and unsafe_state_dir(str(models)) is None
    link = tmp_path / "models-link"
    link.symlink_to(models)
    os.chmod(open_to_all, 0o777)  # a link to it is judged where it leads
    assert "any user may write" in str(not_ours_alone(str(link)))


def test_a_lock_whose_holders_pid_now_names_another_process_is_taken_over(tmp_path: Path) -> None:
    """After a reboot, or fleet killed mid-step, the lock's holder pid soon names another long-lived
    process (pid 1 here): the lock says when its holder started, and a different start is no holder. A
    lock whose holder still runs as it started stays held."""
    import os
    import subprocess
    import time

    import fleet.host.lock as lock
    from fleet.host.procs import started_as

    state = tmp_path / "state"
    (state / "deployments" / "small").mkdir(parents=True)
    path = state / "deployments" / "small" / LOCK_FILE
    holder = subprocess.Popen(["sleep", "30"])
    try:
        for pid, started, held in (
            (1, [started_as(1)[0], -5], False),  # pid 1 runs, but it is not the process that took the lock
            (1, ["another-boot", started_as(1)[1]], False),  # the same start time, in another boot
            (holder.pid, started_as(holder.pid), True),  # the holder, still running
            (holder.pid, None, True),  # an older fleet's lock: its live pid is all it says
        ):
            old = {"run_id": "other", "owner": "x", "since": 1, "holder_pid": pid, "holder_start": started}
            path.write_text(json.dumps(old))
            os.utime(path, (time.time() - 3600,) * 2)  # long past the grace between round trips
            taken = lock.take_lock(release(state)["lock"])
            assert (taken["status"] == "held") is held, (pid, started, taken)
            if not held:
                assert json.loads(path.read_text())["holder_start"] == started_as(os.getpid())
    finally:
        holder.kill()
        holder.wait()


def test_a_deployment_directory_that_is_a_link_is_neither_listed_nor_written_through(tmp_path: Path) -> None:
    """deployments/NAME linked to another user's directory was read as a deployment (its record naming
    the process groups fleet stops) and heal wrote there."""
    import os

    import fleet.host.lock as lock
    from fleet.host.records import deployment_names

    state = tmp_path / "state"
    (state / "deployments" / "real").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / STATE_FILE).write_text(json.dumps({"status": FAILED, "pgid": os.getpgid(0)}))
    (state / "deployments" / "small").symlink_to(elsewhere)
    assert deployment_names(str(state)) == ["real"]
    taken = lock.take_lock(release(state)["lock"])  # the deployment `small`: the link
    assert taken["status"] == "unwritable" and "a link, or another's" in str(taken.get("error"))
    assert sorted(p.name for p in elsewhere.iterdir()) == [STATE_FILE]
