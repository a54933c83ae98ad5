"""`fleet pull --from`: a model pushed to hosts without internet, from a directory here or from another host
that has it, relayed by fleet; resumed per file after a cut, checked by size and sha256 before it counts.
Hosts are reached by `connection: local` here, and over real SSH between two simulated hosts at the end."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, run_cli
from fleet.hostscripts import script_for
from fleet.transport.local import LocalTransport
from fleet_testbed import simhost
from fleet_testbed.fakehub import make_model

PLAYBOOK = (
    "engine: sglang\nmodel: tiny\nserved_name: tiny\n"
    'smoke:\n  prompt: "Say hi"\n  expect: "(?i)hi"\n  any_answer: true\n'
)


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
    assert code == 0 and "already there, and fleet did not make it" in out and "nothing sent" in out
    assert not (fleet.model("b") / ".fleet-pulled.json").exists()


def test_file_names_fleet_would_not_write_are_refused_before_anything_is_written(fleet: Fleet) -> None:
    (fleet.source / "evil\nname.json").write_text("{}")
    (fleet.source / "tok\x1b[31mred.json").write_text("{}")
    code, _, err = fleet.push("--host", "a", "--from", str(fleet.source))
    assert code == 4 and "fleet will not write" in err and "evil\nname" not in err
    # each named as the operator can find it, with the push's own advice (not the Hub pull's)
    assert "evil\\x0aname.json" in err and "tok\\x1b[31mred.json" in err and "Rename or remove" in err
    assert "hf_repo" not in err
    assert not fleet.model("a").exists() and not fleet.partial("a").exists()


def test_no_disk_for_the_model_is_refused_with_the_numbers_before_anything_is_sent(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    fleet = Fleet(tmp_path)
    models = tmp_path / "a" / "models"
    models.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=755", "tmpfs", str(models)], check=True)
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


def _offer(files: dict[str, bytes], mtime_ns: int = 1) -> bytes:
    listing = {n: {"size": len(b), "mtime_ns": mtime_ns} for n, b in files.items()}
    return json.dumps({"files": listing, "marker": None}).encode() + b"\n"


def _frame(name: str, content: bytes, offset: int = 0, sha256: str | None = None) -> bytes:
    """What an honest source sends for `content` from `offset`: the bytes, then the whole file's sha256."""
    import hashlib

    head = json.dumps({"name": name, "offset": offset, "size": len(content) - offset}).encode() + b"\n"
    digest = sha256 or hashlib.sha256(content).hexdigest()
    return head + content[offset:] + json.dumps({"sha256": digest}).encode() + b"\n"


def _asked(said: list[dict[str, object]]) -> dict[str, int]:
    [need] = [e["need"] for e in said if e["e"] == "need"]
    return {str(n): int(off) for n, off, *_ in need}  # type: ignore[attr-defined]


def test_bytes_that_do_not_match_what_the_source_read_are_refused_and_not_kept(tmp_path: Path) -> None:
    files = {"config.json": b'{"model_type": "qwen3"}'}
    said = _receive(tmp_path / "m", _offer(files) + _frame("config.json", files["config.json"], sha256="0" * 64))
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
    proc = _started(fleet.argv("--host", "a", "--from", str(fleet.source)))
    _until_holds(proc, fleet.partial("a"), 40 << 20, "it could be cut")  # the first shard whole, the second under way
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


def _started(argv: list[str], stderr: Any = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """fleet run as a process of its own, to be interrupted or cut midway."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "testbed"))
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr, env=env)


def _until_holds(proc: subprocess.Popen[bytes], partial: Path, nbytes: int, what: str, within_s: float = 60) -> None:
    """Wait, the push still running, until its partial copy holds `nbytes`: then `what` happens midway."""
    deadline = time.monotonic() + within_s
    while _bytes_in(partial) < nbytes:
        assert proc.poll() is None and time.monotonic() < deadline, f"the push ended before {what}"
        time.sleep(0.005)


def _bytes_in(path: Path) -> int:
    """Bytes under `path` while the push writes there: a file it renames (its progress record's .tmp) may
    be gone between the listing and the look, and counts as nothing."""
    total = 0
    with contextlib.suppress(FileNotFoundError):  # the copy itself renamed into place: nothing more is partial
        for p in path.rglob("*"):
            with contextlib.suppress(FileNotFoundError):
                total += p.stat().st_size if p.is_file() else 0
    return total


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
            proc = _started(argv, stderr)
        _until_holds(proc, partial, 40 << 20, "it could be cut", within_s=120)
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
        shutil.rmtree(source, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(partial, ignore_errors=True)


def _spec(sb: simhost.Sandbox, name: str) -> simhost.HostSpec:
    return next(s for s in sb.specs if s.name == name)


# --- found by an adversarial pass: each was a real defect ------------------------------------------------

CONFIG = b'{"model_type": "qwen3"}'


def test_a_file_begun_from_an_older_source_is_never_resumed_onto_its_new_content(tmp_path: Path) -> None:
    """Cut while x.bin was under way (version 1), cut again early in version 2 (same sizes, new mtimes):
    the third push must not take version 1's bytes for the start of version 2's x.bin."""
    model = tmp_path / "m"
    v1 = {"config.json": CONFIG, "a.bin": b"A" * 4096, "x.bin": b"O" * 4096}
    v2 = {"config.json": CONFIG, "a.bin": b"a" * 4096, "x.bin": b"N" * 4096}
    _receive(model, _offer(v1, 1) + _frame("a.bin", v1["a.bin"]) + _frame("x.bin", v1["x.bin"])[:3000])
    said = _receive(model, _offer(v2, 2) + _frame("a.bin", v2["a.bin"])[:100])
    assert said[-1]["kind"] == "cut" and _asked(said)["x.bin"] == 0
    said = _receive(model, _offer(v2, 2))
    asked = _asked(said)
    assert asked["x.bin"] == 0  # its old bytes were removed when version 2 was first planned
    stream = _offer(v2, 2) + b"".join(_frame(n, v2[n], asked[n]) for n in sorted(asked)) + b'{"end": true}\n'
    said = _receive(model, stream)
    assert said[-1]["e"] == "pulled", said[-1]
    assert all((model / n).read_bytes() == b for n, b in v2.items())


def test_bytes_kept_from_a_cut_push_are_proved_with_the_whole_file_before_they_count(tmp_path: Path) -> None:
    """A source that failed midway once wrote its error among a file's bytes; whatever the kept bytes are,
    the resumed file is checked whole (the source hashes the part it does not send) and refused if wrong."""
    model = tmp_path / "m"
    files = {"config.json": CONFIG, "big.bin": os.urandom(8192)}
    garbage = json.dumps({"error": "OSError: [Errno 5] Input/output error"}).encode() + b"\n"
    head = json.dumps({"name": "big.bin", "offset": 0, "size": 8192}).encode() + b"\n"
    _receive(model, _offer(files) + _frame("config.json", CONFIG) + head + files["big.bin"][:3000] + garbage)
    said = _receive(model, _offer(files))
    kept = _asked(said)["big.bin"]
    assert kept == 3000 + len(garbage)
    said = _receive(model, _offer(files) + _frame("big.bin", files["big.bin"], kept))
    assert said[-1]["kind"] == "source" and "not the file the source read" in str(said[-1]["why"])
    assert not model.exists() and not (tmp_path / "m.fleet-partial" / "big.bin").exists()
    said = _receive(model, _offer(files))
    assert _asked(said) == {"big.bin": 0}
    said = _receive(model, _offer(files) + _frame("big.bin", files["big.bin"]) + b'{"end": true}\n')
    assert said[-1]["e"] == "pulled" and (model / "big.bin").read_bytes() == files["big.bin"]


def test_a_source_that_ends_without_sending_every_file_asked_for_is_refused(tmp_path: Path) -> None:
    files = {"config.json": CONFIG, "a.bin": b"A" * 100, "x.bin": b"X" * 100}
    said = _receive(tmp_path / "m", _offer(files) + _frame("a.bin", files["a.bin"]) + b'{"end": true}\n')
    assert said[-1]["kind"] == "source" and "without sending config.json, x.bin" in str(said[-1]["why"])
    assert not (tmp_path / "m").exists()


def test_new_weights_of_the_same_sizes_are_pushed_over_a_model_fleet_pushed(fleet: Fleet) -> None:
    assert fleet.push("--host", "a", "--from", str(fleet.source))[0] == 0
    tuned = make_model(fleet.root / "tuned", shards=3, shard_bytes=256 << 10, seed=99)
    for shard in tuned.glob("*.safetensors"):  # a fine-tune: the same sizes, new bytes in every shard
        (fleet.source / shard.name).write_bytes(shard.read_bytes())
    code, out, err = fleet.push("--host", "a", "--from", str(fleet.source), "--json")
    assert code == 0, err
    [result] = json.loads(out)
    assert result["outcome"] == "pushed" and fleet.same("a")
    assert result["sent"] < result["bytes"]  # config.json and the rest, unchanged at the source, were kept
    code, out, _ = fleet.push("--host", "a", "--from", str(fleet.source), "--json")
    assert json.loads(out)[0]["outcome"] == "present"


def hf_snapshot(fleet: Fleet) -> Path:
    """The source as a Hugging Face cache snapshot: its files links into the repository's blobs/."""
    repo = fleet.root / "hub" / "models--org--m"
    snapshot = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    shutil.copytree(fleet.source, snapshot)
    for f in sorted(snapshot.iterdir()):
        (repo / "blobs" / f.name).write_bytes(f.read_bytes())
        f.unlink()
        f.symlink_to(Path("../../blobs") / f.name)
    return snapshot


def test_links_in_the_source_are_sent_as_their_files_and_never_followed_into_directories(fleet: Fleet) -> None:
    snapshot = hf_snapshot(fleet)
    assert fleet.push("--host", "a", "--from", str(snapshot))[0] == 0
    assert not (fleet.model("a") / "tokenizer_config.json").is_symlink() and fleet.same("a")
    (snapshot / "loop").symlink_to(".")
    (snapshot / "etc").symlink_to("/etc")
    (snapshot / "gone.json").symlink_to(fleet.root / "nowhere")
    code, _, err = fleet.push("--host", "b", "--from", str(snapshot))
    assert code == 4 and "loop: a link to a directory" in err and "etc: a link to a directory" in err
    assert "gone.json: a link to nothing" in err and not (fleet.root / "b" / "models").exists()


@pytest.mark.parametrize("layout", ["a directory", "a cache snapshot"])
def test_a_link_out_of_the_model_is_never_read_or_sent(fleet: Fleet, layout: str) -> None:
    """`fleet pull --from DIR` followed a link in DIR to a 0600 file of the operator's outside it and
    copied its contents to the GPU host (issue 39). A link may lead only into the model (and a cache
    snapshot's own blobs/)."""
    source = fleet.source if layout == "a directory" else hf_snapshot(fleet)
    private = fleet.root / "id_ed25519"
    private.write_text("-----BEGIN OPENSSH PRIVATE KEY----- not for the GPU host\n")
    private.chmod(0o600)
    (source / "extra.json").symlink_to(private)
    code, _, err = fleet.push("--host", "b", "--from", str(source))
    assert code == 4 and "extra.json: a link leading out of the model directory" in err
    copied = [
        p for p in (fleet.root / "b").rglob("*") if p.is_file() and "PRIVATE KEY" in p.read_text(errors="replace")
    ]
    assert copied == []


def test_a_link_planted_in_the_partial_copy_never_leads_a_write_outside_it(fleet: Fleet) -> None:
    (fleet.source / "sub" / "deep").mkdir(parents=True)
    (fleet.source / "sub" / "deep" / "x.txt").write_text("x")
    outside = fleet.root / "outside"
    outside.mkdir()
    partial = fleet.partial("a")
    partial.mkdir(parents=True)
    (partial / ".fleet-partial-of-fleet").write_text("")
    (partial / "sub").symlink_to(outside)
    code, _, err = fleet.push("--host", "a", "--from", str(fleet.source))
    assert code == 0, err
    assert list(outside.iterdir()) == [] and not (fleet.model("a") / "sub").is_symlink() and fleet.same("a")


def test_source_files_keep_their_permissions_at_most(fleet: Fleet) -> None:
    (fleet.source / "private.json").write_text("{}")
    (fleet.source / "private.json").chmod(0o600)
    assert fleet.push("--host", "a", "--from", str(fleet.source))[0] == 0
    assert (fleet.model("a") / "private.json").stat().st_mode & 0o777 == 0o600


def test_a_from_with_control_characters_is_shown_escaped(fleet: Fleet) -> None:
    code, _, err = fleet.push("--host", "a", "--from", "./no\nerror: forged line")
    assert code == 2 and "\nerror: forged" not in err


@pytest.mark.slow  # 64 MiB through the relay
def test_a_source_file_rewritten_while_it_is_sent_is_refused_not_installed_half_old(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, shard_bytes=64 << 20)
    shard = fleet.source / "model-00001-of-00003.safetensors"
    proc = _started(fleet.argv("--host", "a", "--from", str(fleet.source)), subprocess.PIPE)
    _until_holds(proc, fleet.partial("a"), 8 << 20, "the file could change")
    with shard.open("r+b") as f:  # in place, same size: the old start is already sent
        f.seek(60 << 20)
        f.write(b"\xaa" * 4096)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 7 and b"changed while it was read" in err
    assert not fleet.model("a").exists()
    code, _, err2 = fleet.push("--host", "a", "--from", str(fleet.source))
    assert code == 0, err2
    assert fleet.same("a")


# --- found by a second adversarial pass ------------------------------------------------------------------


def test_a_commit_the_source_names_never_stands_for_its_files(fleet: Fleet) -> None:
    (fleet.source / ".fleet-pulled.json").write_text(json.dumps({"repo": "acme/tiny", "commit": "c0ffee"}))
    assert fleet.push("--host", "a", "--from", str(fleet.source))[0] == 0
    tuned = make_model(fleet.root / "tuned", shards=3, shard_bytes=256 << 10, seed=99)
    for shard in tuned.glob("*.safetensors"):  # new bytes, the same sizes, the marker still says c0ffee
        (fleet.source / shard.name).write_bytes(shard.read_bytes())
    code, out, err = fleet.push("--host", "a", "--from", str(fleet.source), "--json")
    assert code == 0, err
    assert json.loads(out)[0]["outcome"] == "pushed"
    assert all((fleet.model("a") / s.name).read_bytes() == s.read_bytes() for s in tuned.glob("*.safetensors"))
    marker = json.loads((fleet.model("a") / ".fleet-pulled.json").read_text())
    assert "commit" not in marker and marker["source"]["commit"] == "c0ffee"  # its word, kept as such


def test_a_file_gone_from_the_source_is_gone_from_the_model_after_the_next_push(fleet: Fleet) -> None:
    (fleet.source / "generation_config.json").write_text("{}")
    assert fleet.push("--host", "a", "--from", str(fleet.source))[0] == 0
    (fleet.source / "generation_config.json").unlink()
    code, out, _ = fleet.push("--host", "a", "--from", str(fleet.source), "--json")
    assert code == 0 and json.loads(out)[0]["outcome"] == "pushed" and json.loads(out)[0]["sent"] == 0
    assert not (fleet.model("a") / "generation_config.json").exists() and fleet.same("a")


def test_a_file_of_the_model_changed_in_place_is_sent_again_and_only_it(fleet: Fleet) -> None:
    assert fleet.push("--host", "a", "--from", str(fleet.source))[0] == 0
    shard = fleet.model("a") / "model-00002-of-00003.safetensors"
    with shard.open("r+b") as f:  # the same size: only its mtime says it changed
        f.seek(-10, os.SEEK_END)
        f.write(b"\0" * 10)
    code, out, _ = fleet.push("--host", "a", "--from", str(fleet.source), "--json")
    [result] = json.loads(out)
    assert code == 0 and result["outcome"] == "pushed" and result["sent"] == shard.stat().st_size
    assert fleet.same("a")


def test_a_copy_pushed_on_from_a_host_is_known_as_the_same_and_not_sent_again(fleet: Fleet) -> None:
    assert fleet.push("--host", "a", "--host", "b", "--from", str(fleet.source))[0] == 0
    code, out, _ = fleet.push("--host", "b", "--from", "a", "--json")
    assert code == 0 and [(r["outcome"], r["sent"]) for r in json.loads(out)] == [("present", 0)]


def test_fleets_own_files_in_the_source_are_not_sent(fleet: Fleet) -> None:
    (fleet.source / ".fleet-pulled.json.tmp").write_text("{")  # a marker write cut midway
    assert fleet.push("--host", "a", "--from", str(fleet.source))[0] == 0
    code, out, _ = fleet.push("--host", "a", "--from", str(fleet.source), "--json")
    assert code == 0 and json.loads(out)[0]["outcome"] == "present"
    files = _offer({".fleet-push-done": b"x", "config.json": CONFIG})  # and a source listing them is refused
    said = _receive(fleet.root / "m", files)
    assert said[-1]["kind"] == "listing" and ".fleet-push-done" in str(said[-1]["problems"])


def test_the_source_sends_only_files_it_lists_itself_whatever_a_host_asks(fleet: Fleet) -> None:
    from fleet.control.push import _asked_for
    from fleet.errors import HostStepError

    secret = fleet.root / "secret.txt"
    secret.write_text("do not send")
    st = secret.stat()
    listed = {"config.json": {"size": 10, "mtime_ns": 5}}
    for need in ([["../secret.txt", 0, st.st_size, st.st_mtime_ns]], [[str(secret), 0, st.st_size, st.st_mtime_ns]]):
        with pytest.raises(HostStepError, match="did not list"):
            _asked_for("a", need, listed)
        script = script_for("send", {"op": "send", "path": str(fleet.source)}, [sys.executable])
        request = json.dumps({"need": need}).encode() + b"\n"
        out = LocalTransport("here").run(script, stdin=request, timeout_s=60).stdout
        assert b"do not send" not in out and b"is not a file of this model" in out


def test_a_header_line_too_long_is_the_sources_fault_not_a_cut(tmp_path: Path) -> None:
    files = {"config.json": CONFIG}
    said = _receive(tmp_path / "m", _offer(files) + b"x" * (70 << 10))
    assert said[-1]["kind"] == "source" and "more than" in str(said[-1]["why"])


def test_a_source_directory_named_with_escapes_and_newlines_is_shown_safely(fleet: Fleet) -> None:
    odd = fleet.root / "esc\x1b[31mred\nerror: forged"
    shutil.copytree(fleet.source, odd / "tiny")
    code, out, err = fleet.push("--host", "a", "--from", str(odd / "tiny"))
    assert code == 0, err
    assert "\x1b" not in out + err and "\nerror: forged" not in out + err
