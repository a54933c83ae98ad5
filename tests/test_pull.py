"""`fleet pull`: the real huggingface_hub client, run by the host's engine Python, downloads from a local
stand-in for the Hub (fleet_testbed.fakehub) onto a host reached by `connection: local`; fleet checks the
disk before, shows progress during, and proves the files whole before the model counts as present."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from fleet import events
from fleet.control import ops
from fleet.control.pull import HubAccess
from fleet.errors import PreflightError
from fleet.inventory import load_playbook
from fleet_testbed import nshost, simhost
from fleet_testbed.fakehub import FakeHub, Repo, make_model

pytest.importorskip("huggingface_hub")  # the engines' own client; `make` installs it with the test extras

REPO = "acme/tiny-qwen3"
SHARD = "model-00001-of-00002.safetensors"


class World:
    def __init__(self, root: Path, hub: FakeHub, models: Path | None = None) -> None:
        self.root, self.hub = root, hub
        self.source = make_model(root / "source")
        self.repo = hub.add(REPO, Repo(self.source))
        self.models = models or root / "models"
        self.inventory = root / "inventory.yaml"
        self.inventory.write_text(
            "hosts:\n  box:\n    connection: local\n"
            f"    engines: {{sglang: {sys.executable}}}\n"
            f"    models_dir: {self.models}\n    state_dir: {root}/state\n    log_dir: {root}/logs\n"
        )
        self.playbook = root / "tiny.yaml"
        self.playbook.write_text(
            "engine: sglang\nmodel: tiny-qwen3\nserved_name: tiny\n"
            f"hf_repo: {REPO}\nrevision: main\n"
            'smoke:\n  prompt: "Say hi"\n  expect: "(?i)hi"\n  any_answer: true\n'
        )

    @property
    def target(self) -> Path:
        return self.models / "tiny-qwen3"

    def pull(self, *extra: str) -> tuple[int, str, str]:
        r = run_cli("-i", str(self.inventory), "pull", str(self.playbook), "--host", "box", *extra)
        return r.code, r.out, r.err

    def same_as_source(self) -> bool:
        files = sorted(p.relative_to(self.source) for p in self.source.rglob("*") if p.is_file())
        return all((self.target / f).read_bytes() == (self.source / f).read_bytes() for f in files)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    hub = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # the host's own cache stays out of it
    yield World(tmp_path, hub)
    hub.close()


def test_pull_downloads_checks_every_file_and_only_then_puts_the_model_at_its_path(world: World) -> None:
    code, out, err = world.pull()
    assert code == 0, err
    assert world.same_as_source()
    assert not (world.models / "tiny-qwen3.fleet-partial").exists()
    assert not (world.target / ".cache").exists()  # the client's resume records go with the partial download
    marker = json.loads((world.target / ".fleet-pulled.json").read_text())
    assert marker["repo"] == REPO and marker["commit"] == world.repo.commit
    assert "sizes and 5 checksums verified" in out  # sha256 of the 2 LFS files, git blob ids of the other 3
    assert f"pulling commit {world.repo.commit[:12]}" in err and "100%" in err


def test_a_model_already_there_and_whole_is_verified_not_downloaded_again(world: World) -> None:
    assert world.pull()[0] == 0
    served = dict(world.hub.served)
    code, out, _ = world.pull()
    assert code == 0 and "already there and whole" in out
    assert world.hub.served == served


@pytest.mark.slow  # 48 MiB through a throttled stand-in Hub
def test_a_connection_cut_mid_file_is_resumed_from_where_it_stopped(world: World) -> None:
    # the client writes in 10 MiB pieces: a shard of 24 MiB cut at 16 MiB has 10 MiB to resume from
    make_model(world.source, shard_bytes=24 << 20)
    size = (world.source / SHARD).stat().st_size
    world.repo.cut_once[SHARD] = 16 << 20
    code, _, err = world.pull()
    assert code == 0, err
    assert world.same_as_source()
    assert size < world.hub.served[SHARD] < size + (16 << 20)  # the rest by a Range request, not all again


def test_a_file_the_hub_serves_truncated_is_named_and_the_model_never_appears(world: World) -> None:
    # the Hub's own listing has the short size: only the file's safetensors header shows it is cut
    world.repo.truncated[SHARD] = (world.source / SHARD).stat().st_size - 1000
    code, _, err = world.pull()
    assert code == 7
    assert f"{SHARD}: truncated" in err and "not whole" in err
    assert not world.target.exists()


def test_a_file_changed_since_fleet_checked_it_is_read_again_and_a_bad_checksum_fetches_it_anew(
    world: World,
) -> None:
    assert world.pull()[0] == 0
    served = dict(world.hub.served)
    # the three small files kept in git are read every time; the two weight files, unchanged since, are not
    assert "3 checksums read again" in world.pull()[1]
    data = bytearray((world.target / SHARD).read_bytes())
    data[-1] ^= 0xFF  # a bit flipped on the host's disk: same size, new mtime
    (world.target / SHARD).write_bytes(bytes(data))
    code, _, err = world.pull()
    assert code == 0, err
    assert world.same_as_source()
    assert world.hub.served[SHARD] == served[SHARD] + (world.source / SHARD).stat().st_size


def test_a_bad_checksum_in_a_directory_fleet_did_not_make_is_named_and_left_alone(world: World) -> None:
    shutil.copytree(world.source, world.target)
    data = bytearray((world.target / SHARD).read_bytes())
    data[-1] ^= 0xFF
    (world.target / SHARD).write_bytes(bytes(data))
    code, _, err = world.pull()
    assert code == 4 and f"{SHARD}: its sha256 is not the one the Hub lists" in err and "left as it is" in err
    assert (world.target / SHARD).read_bytes() == bytes(data)


def test_a_damaged_model_fleet_made_is_repaired_by_fetching_only_the_damaged_file(world: World) -> None:
    assert world.pull()[0] == 0
    other = "model-00002-of-00002.safetensors"
    with open(world.target / SHARD, "r+b") as f:
        f.truncate(5000)
    served = dict(world.hub.served)
    code, _, err = world.pull()
    assert code == 0, err
    assert world.same_as_source()
    assert world.hub.served[SHARD] == served[SHARD] + (world.source / SHARD).stat().st_size
    assert world.hub.served[other] == served[other]


def test_a_damaged_directory_fleet_did_not_make_is_reported_file_by_file_and_left_alone(world: World) -> None:
    shutil.copytree(world.source, world.target)
    (world.target / SHARD).write_bytes((world.source / SHARD).read_bytes()[:4000])
    before = {p.name: p.read_bytes() for p in world.target.iterdir()}
    code, _, err = world.pull()
    assert code == 4
    assert f"{SHARD}: " in err and "fleet did not make it" in err and "Move that directory away" in err
    assert {p.name: p.read_bytes() for p in world.target.iterdir()} == before
    assert world.hub.served == {}


def test_a_wrong_token_is_a_clear_refusal_and_the_token_is_in_no_output_and_no_argv(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.repo.token = "hf_right_token_0123456789"
    wrong = "hf_wrong_token_9876543210"
    monkeypatch.setenv("HF_TOKEN", wrong)
    argvs: list[bytes] = []

    def look(_handler: object) -> None:  # while the host's client talks to the Hub: every process's argv
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):  # gone meanwhile
                    argvs.append((proc / "cmdline").read_bytes())

    world.hub.on_request = look
    code, out, err = world.pull()
    assert code == 4 and "did not list" in err and "HF_TOKEN" in err
    assert argvs and not any(wrong.encode() in a for a in argvs)
    assert wrong not in out + err
    monkeypatch.setenv("HF_TOKEN", world.repo.token)
    world.hub.on_request = None
    code, _, err = world.pull()
    assert code == 0, err
    assert world.repo.token not in err


def test_no_disk_for_the_checkpoint_is_refused_with_the_numbers_before_anything_is_downloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=755", "tmpfs", str(small)], check=True)
    hub = FakeHub()
    try:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        world = World(tmp_path, hub, models=small)
        code, _, err = world.pull()
        assert code == 4 and "not enough disk" in err and "nothing downloaded" in err
        assert "Free space on the host" in err
        assert hub.served == {} and not world.target.exists()
    finally:
        hub.close()
        subprocess.run(["umount", str(small)], check=False)


@pytest.mark.slow  # 48 MiB through a throttled stand-in Hub
def test_ctrl_c_mid_pull_leaves_nothing_a_deploy_would_take_and_the_next_pull_keeps_whole_files(
    world: World,
) -> None:
    make_model(world.source, shard_bytes=24 << 20)
    slow = "model-00002-of-00002.safetensors"
    world.repo.slow[slow] = 4 << 20  # about 6 s; the first shard comes at once
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'testbed'}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet", "-i", str(world.inventory), "pull", str(world.playbook), "--host", "box"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env=env,
    )
    assert proc.stderr is not None
    seen = b""
    while not re.search(rb"box: [5-9][0-9]% ", seen):  # the first shard on disk, the second under way
        line = proc.stderr.readline()
        assert line, seen
        seen += line
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    proc.stderr.close()
    assert not world.target.exists()  # nothing at the model's path: a deploy finds no model, not half of one
    assert (world.models / "tiny-qwen3.fleet-partial" / SHARD).exists()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _pull_steps_running(world.target):
        time.sleep(0.2)
    assert not _pull_steps_running(world.target)  # the host side stopped with its client
    first = world.hub.served[SHARD]
    world.repo.slow.clear()
    code, _, err = world.pull()
    assert code == 0, err
    assert "24.0 MiB there from an earlier pull" in err
    assert world.same_as_source()
    assert world.hub.served[SHARD] == first  # kept, not fetched again
    assert not list(world.target.rglob("*.incomplete"))


def _pull_steps_running(target: Path) -> bool:
    """This test's own pull step on the host (its source names host/pull.py, its arguments the path):
    other tests' pulls may run beside it in other workers."""
    pattern = "host/pull[.]py.*" + "".join("[.]" if c == "." else c for c in str(target))
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return bool(out.strip())


def test_a_playbook_without_hf_repo_says_where_to_add_it(world: World) -> None:
    world.playbook.write_text(world.playbook.read_text().replace(f"hf_repo: {REPO}\n", ""))
    code, _, err = world.pull()
    assert code == 2 and "has no hf_repo:" in err and str(world.playbook) in err


def test_a_malformed_hf_repo_is_refused_with_its_file_and_line(world: World) -> None:
    world.playbook.write_text(world.playbook.read_text().replace(f"hf_repo: {REPO}", "hf_repo: ../../etc"))
    code, _, err = world.pull()
    assert code == 2 and f"{world.playbook}:4" in err and "owner/name" in err


def test_the_marker_records_the_commit_and_every_file_as_checked(world: World) -> None:
    assert world.pull()[0] == 0
    marker = json.loads((world.target / ".fleet-pulled.json").read_text())
    assert marker["commit"] == world.repo.commit and marker["revision"] == "main"
    sizes = {p.name: p.stat().st_size for p in world.source.iterdir()}
    assert {n: v[0] for n, v in marker["verified"].items()} == sizes


@pytest.fixture
def simulated(tmp_path: Path) -> Iterator[tuple[nshost.NamespaceHost, FakeHub, Path]]:
    """A simulated 2-GPU host whose model is not there yet, the Hub that has it (under the shipped
    playbook's own hf_repo:), and that playbook."""
    if not nshost.available():
        pytest.skip("needs root, unshare and nsenter")
    h = nshost.NamespaceHost(tmp_path, simhost.CT129, nshost.loopback_address())
    model = h.dir / "models" / "Qwen3.6-27B"
    hub = FakeHub()
    shipped = ROOT / "playbooks" / "qwen36-27b.yaml"
    repo = load_playbook("qwen36-27b", ROOT / "playbooks").spec.hf_repo
    assert repo == "Qwen/Qwen3.6-27B"
    hub.add(repo, Repo(make_model(tmp_path / "hub" / "Qwen3.6-27B", config=model / "config.json")))
    shutil.rmtree(model)
    playbook = tmp_path / "qwen36-27b.yaml"
    playbook.write_text(shipped.read_text())
    yield h, hub, playbook
    hub.close()
    h.close()


def test_deploy_pulls_a_missing_model_first_and_then_serves_it(
    simulated: tuple[nshost.NamespaceHost, FakeHub, Path],
) -> None:
    h, hub, playbook = simulated
    seen: list[events.Event] = []
    pb = load_playbook(str(playbook), ROOT / "playbooks")
    result = ops.deploy(
        h.transport(), h.host, pb, force=False, engine_check=False, progress=seen.append, hub=HubAccess(None, hub.url)
    )
    assert result.ok, result.reason
    kinds = [e.kind for e in seen if not isinstance(e, events.LogLine)]
    assert kinds[0] == "model_pull_planned" and kinds.index("planned") > kinds.index("model_pull_progress")
    assert (h.dir / "models" / "Qwen3.6-27B" / ".fleet-pulled.json").exists()


def test_deploy_with_no_pull_refuses_a_missing_model_and_says_how_to_get_it(
    simulated: tuple[nshost.NamespaceHost, FakeHub, Path],
) -> None:
    h, hub, playbook = simulated
    pb = load_playbook(str(playbook), ROOT / "playbooks")
    with pytest.raises(PreflightError) as refused:
        ops.deploy(h.transport(), h.host, pb, force=False, engine_check=False, progress=lambda e: None, hub=None)
    assert "does not exist" in refused.value.message and "fleet pull" in refused.value.message
    assert hub.served == {} and not (h.dir / "models" / "Qwen3.6-27B").exists()


# --- found by an adversarial pass: each was a real defect ------------------------------------------------


def test_a_token_with_a_stray_newline_is_refused_before_anything_is_sent_and_never_shown(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_abcdef123\r")
    code, out, err = world.pull()
    assert code == 2 and "whitespace or control characters" in err
    assert "hf_secret_abcdef123" not in out + err and world.hub.served == {}


def test_an_endpoint_with_a_password_in_it_is_refused(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", world.hub.url.replace("http://", "http://me:pw@"))
    code, _, err = world.pull()
    assert code == 2 and "without a user or password" in err and "pw@" not in err


def test_a_listing_that_names_files_outside_the_model_directory_is_refused_and_touches_nothing(
    world: World,
) -> None:
    assert world.pull()[0] == 0
    victim = world.models / "victim.txt"
    victim.write_text("the operator's")
    world.repo.extra["../victim.txt"] = b"hostile"
    code, _, err = world.pull()
    assert code == 4 and "outside the model directory" in err and "../victim.txt" in err
    assert victim.read_text() == "the operator's" and world.same_as_source()


def test_a_partial_directory_fleet_did_not_make_is_never_written_into(world: World) -> None:
    precious = world.root / "precious"
    precious.mkdir()
    (precious / "config.json").write_text("mine")
    world.models.mkdir()
    (world.models / "tiny-qwen3.fleet-partial").symlink_to(precious)
    code, _, err = world.pull()
    assert code == 4 and "fleet did not make it" in err
    assert [p.name for p in precious.iterdir()] == ["config.json"] and (precious / "config.json").read_text() == "mine"
    assert not world.target.exists()


def test_a_models_directory_others_may_write_is_refused_and_nothing_is_written_or_removed_through_it(
    world: World,
) -> None:
    """Another user who may write the models directory could plant a partial download fleet resumes (with
    a link in it that fleet removes through), a marker that makes changed weights "whole", or a link where
    fleet's lock goes: such a directory is refused before anything is made or read in it."""
    victim = world.root / "victim"
    (victim / "huggingface").mkdir(parents=True)
    (victim / "huggingface" / "keep").write_text("mine")
    world.models.mkdir()
    world.models.chmod(0o1777)
    partial = world.models / "tiny-qwen3.fleet-partial"
    partial.mkdir()
    (partial / ".fleet-partial-of-fleet").write_text("")
    (partial / ".cache").symlink_to(victim)
    (world.models / ".tiny-qwen3.fleet-pull.lock").symlink_to(world.root / "made-through-a-link")
    code, _, err = world.pull()
    assert code == 4 and "only they may write" in err and "models_dir" in err
    assert (victim / "huggingface" / "keep").read_text() == "mine"
    assert world.hub.served == {} and not world.target.exists()
    assert not (world.root / "made-through-a-link").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="files of another user need root to make")
def test_a_marker_another_user_wrote_does_not_make_changed_weights_whole(world: World) -> None:
    assert world.pull()[0] == 0
    shard = world.target / SHARD
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, another byte
    shard.write_bytes(bytes(data))
    marker = json.loads((world.target / ".fleet-pulled.json").read_text())
    marker["verified"][SHARD] = [shard.stat().st_size, shard.stat().st_mtime_ns]  # the stamp of the change
    (world.target / ".fleet-pulled.json").write_text(json.dumps(marker))
    os.chown(world.target / ".fleet-pulled.json", 4242, 4242)
    code, _, err = world.pull()
    assert code == 4 and "fleet did not make it" in err and SHARD in err


def test_a_partial_download_keeps_no_file_the_listing_does_not_name(world: World) -> None:
    """Cut mid-download, then re-sharded upstream: the old layout's shards in fleet's own partial copy are
    not carried into the model."""
    world.models.mkdir()
    partial = world.models / "tiny-qwen3.fleet-partial"
    partial.mkdir()
    (partial / ".fleet-partial-of-fleet").write_text("")
    (partial / "model-00009-of-00009.safetensors").write_bytes(b"stale")
    (partial / "tokenizer.json").symlink_to(world.root / "tiny.yaml")
    code, _, err = world.pull()
    assert code == 0, err
    names = {p.name for p in world.target.iterdir()} - {".fleet-pulled.json"}
    assert names == {p.name for p in world.source.iterdir()}
    assert not (world.target / "tokenizer.json").is_symlink()


def test_a_fifo_or_a_link_to_a_secret_named_like_a_shard_is_named_without_waiting_or_quoting_it(
    tmp_path: Path,
) -> None:
    from fleet.host.model_files import _safetensors_problem

    os.mkfifo(tmp_path / "model-00001-of-00002.safetensors")
    assert _safetensors_problem(str(tmp_path / "model-00001-of-00002.safetensors")) == "not a regular file"
    secret = tmp_path / "token"
    secret.write_text("hf_SECRETtoken1234567890")
    (tmp_path / "model-00002-of-00002.safetensors").symlink_to(secret)
    said = _safetensors_problem(str(tmp_path / "model-00002-of-00002.safetensors"))
    assert said is not None and str(int.from_bytes(b"hf_SECRE", "little")) not in said, said


def test_something_at_the_models_path_that_is_not_a_directory_is_refused_before_downloading(world: World) -> None:
    world.models.mkdir()
    world.target.write_text("a file")
    code, _, err = world.pull()
    assert code == 4 and "is not a directory" in err and world.hub.served == {}
    assert world.target.read_text() == "a file"


def test_a_revision_the_hub_does_not_know_is_refused_even_with_a_model_there(world: World) -> None:
    assert world.pull()[0] == 0
    world.playbook.write_text(world.playbook.read_text().replace("revision: main", "revision: v9"))
    world.hub.repos[REPO].known_revisions = {"main"}
    code, _, err = world.pull()
    assert code == 4 and "did not list" in err


def test_a_new_commit_upstream_is_fetched_beside_the_model_and_swapped_in_only_when_whole(world: World) -> None:
    assert world.pull()[0] == 0
    first = world.repo.commit
    make_model(world.source, seed=8)  # the weights changed upstream; every size stays the same
    assert world.repo.commit != first
    world.repo.truncated[SHARD] = (world.source / SHARD).stat().st_size - 1000  # and the first try is broken
    code, _, err = world.pull()
    assert code == 7 and f"{SHARD}: truncated" in err
    marker = json.loads((world.target / ".fleet-pulled.json").read_text())
    assert marker["commit"] == first  # the model that was there is still there, whole
    world.repo.truncated.clear()
    code, _, err = world.pull()
    assert code == 0, err
    assert world.same_as_source()
    assert json.loads((world.target / ".fleet-pulled.json").read_text())["commit"] == world.repo.commit


def test_a_model_resharded_upstream_keeps_no_file_of_the_old_layout(world: World) -> None:
    assert world.pull()[0] == 0
    shutil.rmtree(world.source)
    make_model(world.source, shards=1)
    code, _, err = world.pull()
    assert code == 0, err
    names = {p.name for p in world.target.iterdir()} - {".fleet-pulled.json"}
    assert names == {p.name for p in world.source.iterdir()}


def test_a_small_file_changed_in_place_is_found_by_its_git_blob_id_and_fetched_again(world: World) -> None:
    assert world.pull()[0] == 0
    config = world.target / "config.json"
    config.write_text(config.read_text().replace("qwen3", "qwen2"))  # same size, another model type
    code, _, err = world.pull()
    assert code == 0, err
    assert world.same_as_source()


def test_progress_counts_only_what_this_pull_fetched() -> None:
    from fleet.control.pull import _progress

    kept = _progress(24 << 20, 48 << 20, had=24 << 20, elapsed=1.0)  # an earlier pull's files, nothing new yet
    assert kept.rate_bps == 0 and kept.eta_s is None
    going = _progress(34 << 20, 48 << 20, had=24 << 20, elapsed=2.0)
    assert going.rate_bps == 5 << 20 and going.eta_s == pytest.approx(2.8)
    assert _progress(0, 1, had=0, elapsed=0.0).eta_s is None
