"""`fleet pull --from`: a model pushed to hosts without internet, from a directory here or from another host
that has it, relayed by fleet; resumed per file after a cut, checked by size and sha256 before it counts.
Hosts are reached by `connection: local` here, and over real SSH between two simulated hosts at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from fleet.hostscripts import script_for
from fleet.transport.local import LocalTransport
from fleet_testbed import simhost
from fleet_testbed.fakehub import make_model

PLAYBOOK = 'engine: sglang\nmodel: tiny\nserved_name: tiny\nsmoke:\n  prompt: "Say hi"\n  expect: "(?i)hi"\n'


class Fleet:
    """Three hosts on this machine (a, b, c), each with its own models directory, and a model here."""

    def __init__(self, root: Path, shard_bytes: int = 256 << 10) -> None:
        self.root = root
        self.source = make_model(root / "here" / "tiny", shards=3, shard_bytes=shard_bytes)
        self.inventory = root / "inventory.yaml"
        hosts = "".join(
            f"  {h}:\n    connection: local\n    engines: {{sglang: {sys.executable}}}\n"
            f"    models_dir: {root / h}/models\n    state_dir: {root / h}/state\n    log_dir: {root / h}/logs\n"
            for h in ("a", "b", "c")
        )
        self.inventory.write_text("hosts:\n" + hosts)
        self.playbook = root / "tiny.yaml"
        self.playbook.write_text(PLAYBOOK)

    def model(self, host: str) -> Path:
        return self.root / host / "models" / "tiny"

    def partial(self, host: str) -> Path:
        return self.root / host / "models" / "tiny.fleet-partial"

    def push(self, *argv: str) -> tuple[int, str, str]:
        r = run_cli("-i", str(self.inventory), "pull", str(self.playbook), *argv)
        return r.code, r.out, r.err

    def argv(self, *argv: str) -> list[str]:
        return [sys.executable, "-m", "fleet", "-i", str(self.inventory), "pull", str(self.playbook), *argv]

    def same(self, host: str, source: Path | None = None) -> bool:
        source = source or self.source
        names = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
        got = sorted(p.relative_to(self.model(host)) for p in self.model(host).rglob("*") if p.is_file())
        return got == sorted([*names, Path(".fleet-pulled.json")]) and all(
            (self.model(host) / n).read_bytes() == (source / n).read_bytes() for n in names
        )


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path)


def test_a_push_from_a_directory_here_puts_the_whole_model_at_its_path_checked_and_marked(fleet: Fleet) -> None:
    code, out, err = fleet.push("--host", "a", "--from", str(fleet.source))
    assert code == 0, err
    assert "a: pushed" in out and "6 checksums verified" in out and f"pushing from {fleet.source}" in err
    assert fleet.same("a") and not fleet.partial("a").exists()
    marker = json.loads((fleet.model("a") / ".fleet-pulled.json").read_text())
    assert marker["pushed_from"] == str(fleet.source)


def test_one_copy_on_a_host_is_pushed_to_several_hosts_and_a_second_push_sends_nothing(fleet: Fleet) -> None:
    assert fleet.push("--host", "a", "--from", str(fleet.source))[0] == 0
    code, out, err = fleet.push("--host", "b", "--host", "c", "--from", "a", "--json")
    assert code == 0, err
    results = {r["host"]: r for r in json.loads(out)}
    assert {h: (r["outcome"], r["source"], r["sent"]) for h, r in results.items()} == {
        "b": ("pushed", "a", results["b"]["bytes"]),
        "c": ("pushed", "a", results["c"]["bytes"]),
    }
    assert fleet.same("b") and fleet.same("c")
    code, out, _ = fleet.push("--host", "b", "--host", "c", "--from", "a", "--json")
    assert code == 0 and [(r["outcome"], r["sent"]) for r in json.loads(out)] == [("present", 0), ("present", 0)]


def test_a_source_that_is_not_whole_is_refused_before_any_host_is_touched(fleet: Fleet) -> None:
    shard = fleet.source / "model-00002-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    code, _, err = fleet.push("--host", "a", "--from", str(fleet.source))
    assert code == 4 and "is not whole, so it is not pushed" in err and "model-00002-of-00003" in err
    assert not (fleet.root / "a" / "models").exists()


def test_a_source_or_destination_named_wrong_is_a_clear_error_that_changes_nothing(fleet: Fleet) -> None:
    code, _, err = fleet.push("--host", "a", "--from", "nosuchhost")
    assert code == 2 and 'no host named "nosuchhost"' in err and "./model" in err
    code, _, err = fleet.push("--host", "a", "--from", "./nosuchdir")
    assert code == 2 and "no such directory here" in err
    code, _, err = fleet.push("--host", "a", "--host", "b", "--from", "a")
    assert code == 2 and "also a host to push to" in err
    assert not (fleet.root / "a" / "models").exists() and not (fleet.root / "b" / "models").exists()


def test_a_damaged_directory_fleet_did_not_make_is_left_as_it_is_and_a_whole_one_counts(fleet: Fleet) -> None:
    theirs = make_model(fleet.model("a"), shards=3, shard_bytes=256 << 10)
    (theirs / "model-00003-of-00003.safetensors").unlink()
    code, _, err = fleet.push("--host", "a", "--from", str(fleet.source))
    assert code == 4 and "fleet did not make it" in err and "model-00003-of-00003.safetensors: missing" in err
    assert not (theirs / "model-00003-of-00003.safetensors").exists() and not fleet.partial("a").exists()
    make_model(fleet.model("b"), shards=3, shard_bytes=256 << 10)  # whole, same sizes: taken as the model
    code, out, _ = fleet.push("--host", "b", "--from", str(fleet.source))
    assert code == 0 and "already there and whole" in out
    assert not (fleet.model("b") / ".fleet-pulled.json").exists()


def test_file_names_fleet_would_not_write_are_refused_before_anything_is_written(fleet: Fleet) -> None:
    (fleet.source / "evil\nname.json").write_text("{}")
    code, _, err = fleet.push("--host", "a", "--from", str(fleet.source))
    assert code == 4 and "fleet will not write" in err and "evil\nname" not in err
    assert not fleet.model("a").exists() and not fleet.partial("a").exists()


def test_no_disk_for_the_model_is_refused_with_the_numbers_before_anything_is_sent(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    fleet = Fleet(tmp_path)
    models = tmp_path / "a" / "models"
    models.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(models)], check=True)
    try:
        code, _, err = fleet.push("--host", "a", "--from", str(fleet.source))
        assert code == 4 and "not enough disk" in err and "nothing sent" in err
        assert "Free space on the host" in err
        assert not fleet.model("a").exists()
        assert not any(fleet.partial("a").glob("*.safetensors"))
    finally:
        subprocess.run(["umount", str(models)], check=False)


def _receive(partial_of: Path, stream: bytes) -> list[dict[str, object]]:
    """The receiving step alone, fed by hand: a hostile or broken source."""
    said: list[dict[str, object]] = []
    buf = bytearray()

    def keep(chunk: bytes) -> bool:
        buf.extend(chunk)
        return True

    script = script_for("receive", {"path": str(partial_of), "from": "test"}, [sys.executable])
    LocalTransport("here").stream(script, keep, stdin=iter([stream]), timeout_s=60)
    said = [json.loads(line) for line in bytes(buf).splitlines() if line.strip()]
    return said


def _offer(files: dict[str, bytes]) -> bytes:
    listing = {n: {"size": len(b), "mtime_ns": 1} for n, b in files.items()}
    return json.dumps({"files": listing, "marker": None}).encode() + b"\n"


def _frame(name: str, data: bytes, sha256: str | None = None) -> bytes:
    import hashlib

    head = json.dumps({"name": name, "offset": 0, "size": len(data)}).encode() + b"\n"
    return head + data + json.dumps({"sha256": sha256 or hashlib.sha256(data).hexdigest()}).encode() + b"\n"


def test_bytes_that_do_not_match_what_the_source_read_are_refused_and_not_kept(tmp_path: Path) -> None:
    files = {"config.json": b'{"model_type": "qwen3"}'}
    said = _receive(tmp_path / "m", _offer(files) + _frame("config.json", files["config.json"], "0" * 64))
    assert said[-1]["e"] == "refused" and said[-1]["kind"] == "source" and "sha256" in str(said[-1]["why"])
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.fleet-partial" / "config.json").exists()


def test_a_source_that_sends_what_was_not_asked_for_writes_nothing_outside_the_model(tmp_path: Path) -> None:
    files = {"config.json": b'{"model_type": "qwen3"}'}
    said = _receive(tmp_path / "m", _offer(files) + _frame("../escaped.json", b"{}"))
    assert said[-1]["kind"] == "source" and "not asked for" in str(said[-1]["why"])
    assert not (tmp_path / "escaped.json").exists() and not (tmp_path / "m").exists()


def test_a_stream_that_ends_midway_is_a_cut_that_keeps_what_came(tmp_path: Path) -> None:
    files = {"config.json": b'{"model_type": "qwen3"}', "big.bin": os.urandom(4096)}
    stream = _offer(files) + _frame("big.bin", files["big.bin"])[:3000]
    said = _receive(tmp_path / "m", stream)
    assert said[-1]["kind"] == "cut" and not (tmp_path / "m").exists()
    kept = (tmp_path / "m.fleet-partial" / "big.bin").read_bytes()
    assert kept and files["big.bin"].startswith(kept)


@pytest.mark.slow  # 96 MiB through the relay, twice
def test_ctrl_c_mid_push_leaves_no_model_and_the_next_push_resumes_and_resends_a_changed_file(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, shard_bytes=32 << 20)
    proc = subprocess.Popen(
        fleet.argv("--host", "a", "--from", str(fleet.source)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "testbed")),
    )
    deadline = time.monotonic() + 60
    while _bytes_in(fleet.partial("a")) < 40 << 20:  # the first shard whole, the second under way
        assert proc.poll() is None and time.monotonic() < deadline, "the push ended before it could be cut"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    assert not fleet.model("a").exists()  # nothing at the model's path: a deploy finds no model, not half of one
    kept = _bytes_in(fleet.partial("a"))
    assert kept >= 40 << 20
    third = fleet.source / "model-00003-of-00003.safetensors"
    make_model(tmp_path / "other", shards=3, shard_bytes=32 << 20, seed=99)
    third.write_bytes((tmp_path / "other" / third.name).read_bytes())  # same size, new content and mtime
    code, out, err = fleet.push("--host", "a", "--from", str(fleet.source), "--json")
    assert code == 0, err
    [result] = json.loads(out)
    assert result["outcome"] == "pushed" and result["sent"] < result["bytes"]
    assert fleet.same("a")  # the changed file was sent whole again, not spliced onto its old start


def _bytes_in(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


@pytest.mark.ssh
def test_a_push_between_two_hosts_over_ssh_resumes_after_the_connection_is_cut(fleet_env: simhost.Sandbox) -> None:
    """blackwell has the model; ct129 gets it through fleet's two SSH connections; ct129's is cut midway."""
    sb = fleet_env
    source = make_model(sb.host_dir("blackwell") / "models" / "tiny", shards=4, shard_bytes=32 << 20)
    target = sb.host_dir("ct129") / "models" / "tiny"
    partial = sb.host_dir("ct129") / "models" / "tiny.fleet-partial"
    playbook = sb.root / "push-tiny.yaml"
    playbook.write_text(PLAYBOOK)
    argv = [sys.executable, "-m", "fleet", "pull", str(playbook), "--host", "ct129", "--from", "blackwell"]
    try:
        log = sb.root / "push-tiny.err"
        with log.open("wb") as stderr:
            proc = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=stderr, env=dict(os.environ, PYTHONPATH=str(ROOT / "testbed"))
            )
        deadline = time.monotonic() + 120
        while _bytes_in(partial) < 40 << 20:
            assert proc.poll() is None and time.monotonic() < deadline, "the push ended before it could be cut"
            time.sleep(0.01)
        simhost.drop_connections(sb, _spec(sb, "ct129"))
        code = proc.wait(timeout=60)
        assert code != 0 and not target.exists(), log.read_text()
        assert "was not pushed" in log.read_text() or "connection dropped" in log.read_text()
        kept = _bytes_in(partial)
        assert kept >= 40 << 20
        r = run_cli("pull", str(playbook), "--host", "ct129", "--from", "blackwell", "--json")
        assert r.code == 0, r.err
        [result] = json.loads(r.out)
        assert result["outcome"] == "pushed" and result["sent"] <= result["bytes"] - (kept - (32 << 20))
        names = sorted(p.name for p in source.iterdir())
        assert all((target / n).read_bytes() == (source / n).read_bytes() for n in names)
    finally:
        import shutil

        shutil.rmtree(source, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(partial, ignore_errors=True)


def _spec(sb: simhost.Sandbox, name: str) -> simhost.HostSpec:
    return next(s for s in sb.specs if s.name == name)
