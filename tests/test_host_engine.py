"""The engine step (fleet/host/engine.py) in this process, with a stand-in `uv` on PATH that makes an
environment whose Python reports the version it was asked to install: what the step keeps, refuses and
removes, in milliseconds. Real virtual environments and a real pip installing real wheels are in
test_engines.py (slow tier) and over real sshd."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import host_python3_is_this_one, run_cli
from fleet.host import engine
from fleet.transfer_protocol import EngineRequest

# `uv venv --allow-existing --python PY ENV` and `uv pip install --python ENV/bin/python ... ENGINE==V`;
# the environment's python prints what was installed (what importlib.metadata would say), or
# $REPORTS when set (a package that reports another version than asked)
UV = """#!/bin/sh
echo "uv $*" >> "$UV_CALLS"
if [ "$1" = venv ]; then
  for last; do :; done
  mkdir -p "$last/bin"
  printf '#!/bin/sh\\ncat "$(dirname "$0")/../installed" 2>/dev/null\\n' > "$last/bin/python"
  chmod +x "$last/bin/python"
  echo "Creating virtual environment at: $last"
  exit 0
fi
[ -n "$UV_FAILS" ] && { echo "error: No solution found when resolving dependencies" ; exit 1; }
for last; do :; done
env_dir=$(dirname "$(dirname "$4")")
echo "${REPORTS:-${last#*==}}" > "$env_dir/installed"
echo "Installed 1 package"
printf 'no newline at the end'
"""


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A host whose only installer is the stand-in uv; what it was asked to do is in `uv-calls`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uv").write_text(UV)
    (bin_dir / "uv").chmod(0o755)
    host_python3_is_this_one(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    monkeypatch.setenv("UV_CALLS", str(tmp_path / "uv-calls"))
    return tmp_path / "state"


def run(state: Path, capsys: pytest.CaptureFixture[str], **request: Any) -> list[dict[str, Any]]:
    """The step as a host runs it: the request as its argument, the pip args on stdin, events on stdout."""
    asked: EngineRequest = {"engine": "sglang", "version": "0.5.23", "state_dir": str(state), **request}  # type: ignore[typeddict-item]
    pip_args = {"pip_args": asked.pop("pip_args", [])}
    # the step reads its stdin as fd 0, and takes it closing for fleet gone: a pipe held open while it runs
    read_end, write_end = os.pipe()
    os.write(write_end, json.dumps(pip_args).encode() + b"\n")
    saved_stdin, argv = os.dup(0), sys.argv
    os.dup2(read_end, 0)
    sys.argv = ["engine", json.dumps(asked)]
    try:
        engine.main()
    finally:
        sys.argv = argv
        os.dup2(saved_stdin, 0)
        for fd in (saved_stdin, read_end, write_end):
            os.close(fd)
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def ending(events: list[dict[str, Any]]) -> dict[str, Any]:
    return events[-1]


def test_an_install_streams_the_installer_and_marks_the_environment_whole_last(
    host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    said = run(host, capsys, action="install")
    assert ending(said) == {"e": "installed", "version": "0.5.23", "installer": "uv"}
    lines = [e["t"] for e in said if e["e"] == "line"]
    assert "Installed 1 package" in lines and lines[-1] == "no newline at the end"
    env = host / "engines" / "sglang-0.5.23"
    marker = json.loads((env / engine.MARKER).read_text())
    assert marker["version"] == "0.5.23" and marker["installer"] == "uv"
    assert not (env / engine.PENDING).exists()
    calls = (host.parent / "uv-calls").read_text()
    assert "--prerelease=allow" in calls  # SGLang's releases depend on pre-releases
    assert ending(run(host, capsys, action="install")) == {"e": "present", "version": "0.5.23"}


def test_an_index_password_goes_to_the_installers_environment_never_its_command_line(
    host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "https://ops:s3cret@pypi.example/simple"
    said = run(host, capsys, action="install", pip_args=["--index-url", url, "--no-cache"])
    assert ending(said)["e"] == "installed"
    calls = (host.parent / "uv-calls").read_text()
    assert "s3cret" not in calls and "--no-cache" in calls
    assert engine.installer_args([f"--extra-index-url={url}"], "PIP_") == ([], {"PIP_EXTRA_INDEX_URL": url}, None)
    refused = run(host, capsys, action="install", version="0.5.24", pip_args=[f"--find-links={url}"])
    assert "carries a password" in ending(refused)["why"] and not (host / "engines" / "sglang-0.5.24").exists()


def test_a_failed_install_is_refused_and_leaves_no_environment(
    host: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UV_FAILS", "1")
    said = run(host, capsys, action="install")
    assert ending(said) == {
        "e": "refused",
        "why": "uv could not install sglang==0.5.23 (exit 1); the environment is removed",
    }
    assert "error: No solution found when resolving dependencies" in [e.get("t") for e in said]
    assert not (host / "engines" / "sglang-0.5.23").exists()


def test_a_package_reporting_another_version_is_not_kept(
    host: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPORTS", "0.5.11")  # as uv without pre-releases picks an older SGLang
    said = run(host, capsys, action="install")
    assert ending(said)["why"] == "uv installed sglang 0.5.11, not 0.5.23; the environment is removed"
    assert not (host / "engines" / "sglang-0.5.23").exists()


def test_use_makes_a_version_current_and_says_which_was(host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for version in ("0.5.11", "0.5.23"):
        assert ending(run(host, capsys, action="install", version=version))["e"] == "installed"
    assert ending(run(host, capsys, action="use", version="0.5.11")) == {
        "e": "current",
        "version": "0.5.11",
        "previous": None,
    }
    assert ending(run(host, capsys, action="use")) == {"e": "current", "version": "0.5.23", "previous": "0.5.11"}
    assert os.readlink(host / "engines" / "sglang-current") == "sglang-0.5.23"  # relative


def test_use_refuses_what_is_not_whole_runs_no_longer_or_is_not_fleets(
    host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "no whole sglang 0.5.23 environment" in ending(run(host, capsys, action="use"))["why"]
    assert ending(run(host, capsys, action="install"))["e"] == "installed"
    env = host / "engines" / "sglang-0.5.23"
    (env / "installed").write_text("")  # its Python no longer answers (an OS upgrade took its interpreter)
    assert "no longer runs (its Python fails)" in ending(run(host, capsys, action="use"))["why"]
    again = run(host, capsys, action="install")  # made anew, not kept
    assert any("no longer runs" in e.get("t", "") for e in again) and ending(again)["e"] == "installed"
    link = host / "engines" / "sglang-current"
    link.symlink_to("/opt/my-own-venv")
    assert "is not fleet's symlink" in ending(run(host, capsys, action="use"))["why"]
    assert os.readlink(link) == "/opt/my-own-venv"


def test_what_fleet_did_not_make_is_never_removed_or_written_through(
    host: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    theirs = host / "engines" / "sglang-0.5.23"
    theirs.mkdir(parents=True)
    (theirs / "precious").write_text("keep")
    assert "fleet did not make it" in ending(run(host, capsys, action="install"))["why"]
    assert (theirs / "precious").read_text() == "keep"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other = tmp_path / "other-state"
    other.mkdir()
    (other / "engines").symlink_to(elsewhere)
    for action in ("install", "use"):
        assert "is a symlink" in ending(run(other, capsys, action=action))["why"]
    assert list(elsewhere.iterdir()) == []


def test_an_unfinished_environment_of_fleets_own_is_made_anew(host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cut = host / "engines" / "sglang-0.5.23"
    cut.mkdir(parents=True)
    (cut / engine.PENDING).write_text("")  # a Ctrl-C between making it and marking it whole
    (cut / "half-written").write_text("")
    assert ending(run(host, capsys, action="install"))["e"] == "installed"
    assert not (cut / "half-written").exists()


def test_a_python_that_is_not_there_or_a_second_install_at_once_is_refused(
    host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    said = run(host, capsys, action="install", python="/nope/python3")
    assert ending(said)["why"] == "there is no Python at /nope/python3 on this host (--python)"
    import fcntl

    (host / "engines").mkdir(parents=True, exist_ok=True)
    with open(host / "engines" / ".sglang-0.5.23.lock", "a") as held:  # another step installing it
        fcntl.flock(held, fcntl.LOCK_EX)
        said = run(host, capsys, action="install")
    assert ending(said)["why"] == "another fleet engine install of sglang 0.5.23 is running on this host"


def test_a_request_the_step_cannot_carry_out_is_answered_in_its_own_words(
    host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    said = run(host, capsys, action="upgrade")
    assert said == [{"e": "error", "error": "KeyError: 'upgrade'"}]


@pytest.mark.parametrize(
    ("got", "want", "same"),
    [("0.5.23", "0.5.23", True), ("0.5.23.0", "0.5.23", True), ("0.5.25+cu128", "0.5.25", True)]
    + [("0.5.23rc1", "0.5.23", False), ("0.5.2", "0.5.23", False), (None, "0.5.23", False), ("", "1", False)],
)
def test_versions_compare_as_pip_compares_releases(got: str | None, want: str, same: bool) -> None:
    assert engine.same_version(got, want) is same


def test_fleet_engine_install_and_use_on_a_host_and_their_refusals_exit_codes(
    host: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole command on a host reached by `connection: local`: fleet's side (control/engines.py) sends
    the step and reads its events; a refused install is a failed deploy (7), a refused use a failed
    pre-flight (4), and a spec that is not pinned is bad input (2), refused before anything runs."""
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"hosts:\n  box: {{connection: local, state_dir: {host}, engines: {{sglang: fleet}}}}\n")
    fleet = ["-i", str(inventory), "engine"]
    installed = run_cli(*fleet, "install", "sglang==0.5.23", "--host", "box")
    assert installed.code == 0 and "Installed 1 package" in installed.out + installed.err
    again = run_cli(*fleet, "install", "sglang==0.5.23.0", "--host", "box")  # the same version, spelt longer
    assert again.code == 0 and "already installed" in again.out
    used = run_cli(*fleet, "use", "sglang==0.5.23", "--host", "box")
    assert used.code == 0 and os.readlink(host / "engines" / "sglang-current") == "sglang-0.5.23"
    not_there = run_cli(*fleet, "use", "sglang==0.5.11", "--host", "box")
    assert not_there.code == 4 and "no whole sglang 0.5.11 environment" in not_there.err
    (host / "engines" / "sglang-0.5.11").mkdir()
    theirs = run_cli(*fleet, "install", "sglang==0.5.11", "--host", "box")
    assert theirs.code == 7 and "fleet did not make it" in theirs.err
    unpinned = run_cli(*fleet, "install", "sglang>=0.5", "--host", "box")
    assert unpinned.code == 2 and "not an engine and an exact released version" in unpinned.err


def test_an_environment_made_anew_is_marked_fleets_own_before_it_stops_being_whole(
    host: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step killed between taking the marker away and marking the environment unfinished would leave
    one the next install refuses as not fleet's; the pending mark is written first."""
    assert ending(run(host, capsys, action="install"))["e"] == "installed"
    env = host / "engines" / "sglang-0.5.23"
    (env / "installed").write_text("")  # its Python no longer answers
    removed = os.remove

    def killed_right_after(path: str) -> None:
        removed(path)
        if path.endswith(engine.MARKER):
            raise KeyboardInterrupt  # the step ends here

    monkeypatch.setattr(os, "remove", killed_right_after)
    with pytest.raises(KeyboardInterrupt):
        run(host, capsys, action="install")
    monkeypatch.setattr(os, "remove", removed)
    assert (env / engine.PENDING).exists() and not (env / engine.MARKER).exists()
    assert ending(run(host, capsys, action="install"))["e"] == "installed"  # made anew, not refused


def test_an_environment_another_user_could_plant_is_never_run(
    host: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A Python fleet runs (to ask its version, then as the engine) comes only from a directory nobody else
    may write: an engines directory others may write is refused before anything in it runs, and an
    environment that is not this user's alone is not fleet's, marker or not."""
    assert ending(run(host, capsys, action="install"))["e"] == "installed"
    ran = tmp_path / "ran"
    planted = host / "engines" / "sglang-0.5.30"
    (planted / "bin").mkdir(parents=True)
    (planted / engine.MARKER).write_text('{"engine": "sglang", "version": "0.5.30"}')
    (planted / "bin" / "python").write_text(f"#!/bin/sh\ntouch {ran}\necho 0.5.30\n")
    (planted / "bin" / "python").chmod(0o755)
    (host / "engines").chmod(0o777)
    for action in ("use", "install"):
        refused = ending(run(host, capsys, action=action, version="0.5.30"))
        assert refused["e"] == "refused" and "only they may write" in refused["why"]
    assert not ran.exists()
    (host / "engines").chmod(0o755)
    if os.geteuid() == 0:  # a directory another user made, in a directory of fleet's (made lax earlier)
        for p in (planted, planted / "bin", planted / engine.MARKER):
            os.chown(p, 4242, 4242)
        assert "no whole sglang 0.5.30" in ending(run(host, capsys, action="use", version="0.5.30"))["why"]
        assert "fleet did not make it" in ending(run(host, capsys, action="install", version="0.5.30"))["why"]
    planted.chmod(0o777)  # this user's, but others may write it: not fleet's either
    assert "no whole sglang 0.5.30" in ending(run(host, capsys, action="use", version="0.5.30"))["why"]
    assert not ran.exists()


def test_an_install_over_a_link_changes_nothing_where_it_points(
    host: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    shared = tmp_path / "shared-env"
    (shared / "bin").mkdir(parents=True)
    (shared / engine.MARKER).write_text('{"engine": "sglang", "version": "0.5.23"}')
    (host / "engines").mkdir(parents=True)
    (host / "engines" / "sglang-0.5.23").symlink_to(shared)
    assert "fleet did not make it" in ending(run(host, capsys, action="install"))["why"]
    assert sorted(p.name for p in shared.iterdir()) == sorted(["bin", engine.MARKER])


def test_engine_list_shows_a_directory_name_with_a_newline_as_one_line(host: Path, tmp_path: Path) -> None:
    """A directory name on the host is the host's text: it cannot add a line that reads as fleet's."""
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"hosts:\n  box: {{connection: local, state_dir: {host}, engines: {{sglang: fleet}}}}\n")
    (host / "engines" / "vllm-1.0\nbox: sglang==0.5.23: current").mkdir(parents=True)
    listed = run_cli("-i", str(inventory), "engine", "list", "--host", "box")
    assert listed.code == 0, listed.err
    assert [line for line in listed.out.splitlines() if line.startswith("box:")] == [
        "box: vllm==1.0\\nbox: sglang==0.5.23: current: unfinished, not used"
    ]
