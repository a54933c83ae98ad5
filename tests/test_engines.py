"""`fleet engine install/use`: real virtual environments and a real pip on a host reached by
`connection: local`, installing real wheels (two versions of a package named like the engine, built
here) from a local package index; switched back and forth, and read back by the facts the planner uses."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, host_python3_is_this_one, run_cli
from fleet.inventory import load_inventory

pytestmark = pytest.mark.slow  # real venvs and pip installs: seconds each


def wheel(index: Path, name: str, version: str, body: str = "") -> Path:
    """A real wheel of `name` at `version`, as pip installs any other."""
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n{body}",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{name}-{version}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: fleet-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},{len(text.encode())}"
        for path, text in files.items()
    ]
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join([*record, f"{name}-{version}.dist-info/RECORD,,"]) + "\n"
    index.mkdir(parents=True, exist_ok=True)
    out = index / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return out


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    index = tmp_path / "index"
    for version in ("0.5.11", "0.5.23"):
        wheel(index, "sglang", version)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the package index is this directory: no network needed
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    # the host's python3 is this run's own (host code needs only the standard library, test_layers holds
    # that), so coverage follows the engine step as it follows every other host step
    (tmp_path / "bin").mkdir()
    host_python3_is_this_one(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "hosts:\n  box:\n    connection: local\n    engines: {sglang: fleet}\n"
        f"    state_dir: {tmp_path}/state\n    log_dir: {tmp_path}/logs\n    models_dir: {tmp_path}/models\n"
    )
    return inventory


def engines(inventory: Path) -> dict[str, object]:
    facts = json.loads(run_cli("-i", str(inventory), "facts", "--host", "box", "--json").out)
    return {"version": facts["engines"]["sglang"].get("version"), "managed": facts["managed_engines"]}


def test_install_two_versions_switch_back_and_forth_and_the_facts_follow(box: Path) -> None:
    for version in ("0.5.23", "0.5.11"):
        r = run_cli("-i", str(box), "engine", "install", f"sglang=={version}", "--host", "box")
        assert r.code == 0, r.err
        assert "is installed (pip)" in r.out
    assert engines(box)["version"] is None  # installed, neither current yet: `fleet` names no environment

    assert run_cli("-i", str(box), "engine", "use", "sglang==0.5.23", "--host", "box").code == 0
    assert engines(box)["version"] == "0.5.23"
    r = run_cli("-i", str(box), "engine", "use", "sglang==0.5.11", "--host", "box")
    assert r.code == 0 and "(was 0.5.23)" in r.out
    seen = engines(box)
    assert seen["version"] == "0.5.11"
    assert {(e["version"], e["whole"], e["current"]) for e in seen["managed"]} == {  # type: ignore[union-attr]
        ("0.5.11", True, True),
        ("0.5.23", True, False),
    }
    listed = run_cli("-i", str(box), "engine", "list", "--host", "box")
    assert "sglang==0.5.11: current" in listed.out and "sglang==0.5.23: installed" in listed.out


def test_a_second_install_of_the_same_version_changes_nothing(box: Path, tmp_path: Path) -> None:
    assert run_cli("-i", str(box), "engine", "install", "sglang==0.5.23", "--host", "box").code == 0
    env = tmp_path / "state" / "engines" / "sglang-0.5.23"
    before = (env / ".fleet-engine.json").read_text()
    r = run_cli("-i", str(box), "engine", "install", "sglang==0.5.23", "--host", "box")
    assert r.code == 0 and "already installed" in r.out
    assert (env / ".fleet-engine.json").read_text() == before


def test_a_version_the_index_lacks_is_refused_and_leaves_no_environment_that_could_be_used(
    box: Path, tmp_path: Path
) -> None:
    r = run_cli("-i", str(box), "engine", "install", "sglang==9.9.9", "--host", "box")
    assert r.code == 7 and "could not install sglang==9.9.9" in r.err
    assert "No matching distribution" in r.err  # pip's own words, streamed
    use = run_cli("-i", str(box), "engine", "use", "sglang==9.9.9", "--host", "box")
    assert use.code == 4 and "no whole sglang 9.9.9 environment" in use.err
    assert not (tmp_path / "state" / "engines" / "sglang-current").exists()


def test_a_package_that_reports_another_version_than_asked_is_not_used(box: Path, tmp_path: Path) -> None:
    # a wheel whose file name says one version and whose metadata another (as a mislabelled mirror serves)
    index = Path(os.environ["PIP_FIND_LINKS"])
    real = wheel(tmp_path / "other", "sglang", "0.5.12")
    (index / "sglang-0.5.13-py3-none-any.whl").write_bytes(real.read_bytes())
    r = run_cli("-i", str(box), "engine", "install", "sglang==0.5.13", "--host", "box")
    assert r.code == 7
    assert not (tmp_path / "state" / "engines" / "sglang-0.5.13" / ".fleet-engine.json").exists()


def test_an_unpinned_spec_is_refused_before_anything_runs(box: Path) -> None:
    r = run_cli("-i", str(box), "engine", "install", "sglang>=0.5", "--host", "box")
    assert r.code == 2 and "exact released version" in r.err and "sglang==0.5.23" in r.err


def test_the_inventory_names_fleets_environments_by_keyword(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "hosts:\n  a:\n    connection: local\n    state_dir: /srv/fleet\n"
        '    engines: {sglang: fleet, vllm: "fleet==0.11.0"}\n'
    )
    engines = load_inventory(inventory).hosts["a"].settings.engines
    assert engines == {
        "sglang": "/srv/fleet/engines/sglang-current/bin/python",
        "vllm": "/srv/fleet/engines/vllm-0.11.0/bin/python",
    }
    inventory.write_text('hosts:\n  a:\n    connection: local\n    engines: {sglang: "fleet==;rm -rf /"}\n')
    r = run_cli("-i", str(inventory), "facts", "--host", "a")
    assert r.code == 2 and f"{inventory}:" in r.err


class SlowIndex:
    """A package index (pip's --find-links page) on loopback that sends its wheel slowly."""

    def __init__(self, wheel_path: Path, rate_bps: int) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        data, name = wheel_path.read_bytes(), wheel_path.name

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "":
                    body = f'<html><body><a href="{name}">{name}</a></body></html>'.encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                step = rate_bps // 10
                for i in range(0, len(data), step):
                    try:
                        self.wfile.write(data[i : i + step])
                    except OSError:
                        return
                    time.sleep(0.1)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_ctrl_c_mid_install_stops_the_installer_and_leaves_nothing_that_could_be_used(
    box: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = wheel(tmp_path / "big", "sglang", "0.6.0", body=f"BLOB = {os.urandom(1 << 20).hex()!r}\n")
    index = SlowIndex(big, 100_000)  # about 20 s for the wheel
    monkeypatch.setenv("PIP_FIND_LINKS", index.url)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet", "-i", str(box), "engine", "install", "sglang==0.6.0", "--host", "box"],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(ROOT / "testbed")},
        )
        assert proc.stderr is not None
        seen = b""
        while b"Collecting sglang" not in seen:  # pip's own words: the download has begun
            line = proc.stderr.readline()
            assert line, seen
            seen += line
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        proc.stderr.close()
        env = tmp_path / "state" / "engines" / "sglang-0.6.0"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _installers(env):
            time.sleep(0.2)
        assert not _installers(env)  # pip went with fleet
        assert not (env / ".fleet-engine.json").exists()
        assert run_cli("-i", str(box), "engine", "use", "sglang==0.6.0", "--host", "box").code == 4
    finally:
        index.close()


def _installers(env: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", f"{env}/bin/python -m pip"], capture_output=True, text=True).stdout
    return out.splitlines()


def test_plan_with_another_engine_version_shows_the_upgrade_as_a_diff(tmp_path: Path) -> None:
    from fleet_testbed import simhost

    h = simhost.build_host(tmp_path, simhost.CT129)  # SGLang 0.5.11, its simulated GPUs, reached locally
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "hosts:\n  ct129:\n    connection: local\n"
        f"    engines: {{sglang: {h}/env/bin/python}}\n    gpu_devices: {h}/dev/nvidia*\n"
        f"    models_dir: {h}/models\n    state_dir: {h}/state\n    log_dir: {h}/logs\n"
    )
    argv = ["-i", str(inventory), "--playbooks", str(ROOT / "playbooks"), "plan", "qwen36-27b", "--host", "ct129"]
    r = run_cli(*argv, "--engine", "sglang==0.5.23")
    assert r.code == 0, r.err
    assert r.out.startswith("upgrade preview: sglang 0.5.11 -> 0.5.23 (not installed: fleet engine install sglang")
    assert r.out.index("+ --mamba-radix-cache-strategy") < r.out.index("today's plan:")  # the diff first
    # the crash knowledge that differs: one failure gone with the upgrade, one that only the new version has
    assert "- known crash sglang-spec-hybrid-no-buffer (0.5.10 to 0.5.13)" in r.out
    assert "+ known crash sglang-no-buffer-overlap (0.5.14 and later)" in r.out
    diff = run_cli(*argv, "--engine", "sglang==0.5.23", "--diff")  # the diff alone
    assert diff.code == 0 and diff.out == r.out[: r.out.index("\ntoday's plan:")], diff.out
    assert run_cli(*argv, "--diff").code == 2  # no upgrade to show
    preview = json.loads(run_cli(*argv, "--engine", "sglang==0.5.23", "--json").out)["upgrade_preview"]
    assert preview["plan"]["engine_version"] == "0.5.23" and preview["diff"]
    wrong = run_cli(*argv, "--engine", "vllm==0.11.0")
    assert wrong.code == 2 and "runs sglang, not vllm" in wrong.err


def test_the_upgrade_preview_runs_the_engines_own_check_in_the_installed_versions_environment(
    tmp_path: Path,
) -> None:
    """0.5.23 installed beside the host's 0.5.11 (its own environment: the simulated SGLang, whose parser
    is held to that version's flags): the preview plans from that environment and asks its parser."""
    from fleet_testbed import simhost

    h = simhost.build_host(tmp_path, simhost.CT129)
    env = simhost.engine_env(h, "0.5.23")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "hosts:\n  ct129:\n    connection: local\n"
        f"    engines: {{sglang: {h}/env/bin/python}}\n    gpu_devices: {h}/dev/nvidia*\n"
        f"    models_dir: {h}/models\n    state_dir: {h}/state\n    log_dir: {h}/logs\n"
    )
    argv = ["-i", str(inventory), "plan", "--host", "ct129", "--engine", "sglang==0.5.23"]
    r = run_cli(*argv, str(ROOT / "playbooks" / "qwen36-27b.yaml"))
    assert r.code == 0, r.err
    assert "(installed: fleet engine use sglang==0.5.23" in r.out
    assert "the engine's own check, in that version's environment: accepted" in r.out
    # 0.5.23 resolves in resolve_once(), not prepare_server_args: its resolution is what is shown
    assert "the engine resolved: " in r.out and "mamba strategy extra_buffer" in r.out.split("the engine resolved")[1]
    preview = json.loads(run_cli(*argv, str(ROOT / "playbooks" / "qwen36-27b.yaml"), "--json").out)["upgrade_preview"]
    assert (
        preview["plan"]["argv"][0] == str(env / "bin" / "python") and preview["engine_check"]["verdict"] == "accepted"
    )

    unknown = tmp_path / "qwen36-27b.yaml"
    unknown.write_text((ROOT / "playbooks" / "qwen36-27b.yaml").read_text() + "extra_args: [--no-such-flag-anywhere]\n")
    r = run_cli(*argv, str(unknown))
    assert "the engine's own check, in that version's environment: rejected" in r.out
    assert "--no-such-flag-anywhere" in r.out.split("engine's own check")[1]


# --- found by an adversarial pass: each was a real defect ------------------------------------------------


def test_an_environment_without_its_marker_is_an_error_in_the_facts_not_a_version(box: Path, tmp_path: Path) -> None:
    env = tmp_path / "state" / "engines" / "sglang-0.5.11"
    assert run_cli("-i", str(box), "engine", "install", "sglang==0.5.11", "--host", "box").code == 0
    (env / ".fleet-engine.json").unlink()  # as an install cut short leaves it
    box.write_text(box.read_text().replace("{sglang: fleet}", '{sglang: "fleet==0.5.11"}'))
    facts = json.loads(run_cli("-i", str(box), "facts", "--host", "box", "--json").out)
    assert facts["engines"]["sglang"].get("version") is None and "not whole" in facts["engines"]["sglang"]["error"]


def test_versions_compare_as_pip_compares_them(box: Path, tmp_path: Path) -> None:
    index = Path(os.environ["PIP_FIND_LINKS"])
    wheel(index, "sglang", "0.5.24.0")  # metadata 0.5.24.0 is release 0.5.24
    wheel(index, "sglang", "0.5.25+cu128")  # a build label, as vLLM's and PyTorch's indexes name builds
    assert run_cli("-i", str(box), "engine", "install", "sglang==0.5.24", "--host", "box").code == 0
    again = run_cli("-i", str(box), "engine", "install", "sglang==0.5.24.0", "--host", "box")
    assert again.code == 0 and "already installed" in again.out  # one environment, not a second
    assert run_cli("-i", str(box), "engine", "install", "sglang==0.5.25", "--host", "box").code == 0
    assert sorted(p.name for p in (tmp_path / "state" / "engines").iterdir() if not p.name.startswith(".")) == [
        "sglang-0.5.24",
        "sglang-0.5.25",
    ]


def test_a_directory_fleet_did_not_make_is_never_removed(box: Path, tmp_path: Path) -> None:
    theirs = tmp_path / "state" / "engines" / "sglang-0.5.11"
    (theirs / "data").mkdir(parents=True)
    (theirs / "data" / "precious").write_text("keep")
    r = run_cli("-i", str(box), "engine", "install", "sglang==0.5.11", "--host", "box")
    assert r.code == 7 and "fleet did not make it" in r.err
    assert (theirs / "data" / "precious").read_text() == "keep"


def test_an_engines_directory_that_is_a_symlink_is_refused(box: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "engines").symlink_to(elsewhere)
    r = run_cli("-i", str(box), "engine", "install", "sglang==0.5.11", "--host", "box")
    assert r.code == 7 and "is a symlink" in r.err and list(elsewhere.iterdir()) == []


def test_an_environment_that_no_longer_runs_is_made_anew_and_not_made_current(box: Path, tmp_path: Path) -> None:
    assert run_cli("-i", str(box), "engine", "install", "sglang==0.5.11", "--host", "box").code == 0
    python = tmp_path / "state" / "engines" / "sglang-0.5.11" / "bin" / "python"
    python.unlink()
    python.symlink_to("/nonexistent/python3")  # its interpreter was removed (a pyenv version, an OS upgrade)
    use = run_cli("-i", str(box), "engine", "use", "sglang==0.5.11", "--host", "box")
    assert use.code == 4 and "no longer runs" in use.err
    again = run_cli("-i", str(box), "engine", "install", "sglang==0.5.11", "--host", "box")
    assert again.code == 0 and "is installed" in again.out
    assert run_cli("-i", str(box), "engine", "use", "sglang==0.5.11", "--host", "box").code == 0


def test_the_facts_name_the_versions_own_environment_and_a_switch_is_not_the_same_plan(
    box: Path, tmp_path: Path
) -> None:
    from fleet.control.adopt import runs_this_plan
    from fleet.facts.recorded import parse_recorded

    for v in ("0.5.11", "0.5.23"):
        assert run_cli("-i", str(box), "engine", "install", f"sglang=={v}", "--host", "box").code == 0
    assert run_cli("-i", str(box), "engine", "use", "sglang==0.5.23", "--host", "box").code == 0
    facts = json.loads(run_cli("-i", str(box), "facts", "--host", "box", "--json").out)
    # the command line names sglang-0.5.23 itself: `fleet engine use` later does not move a running plan
    assert facts["engines"]["sglang"]["python"] == str(
        tmp_path / "state" / "engines" / "sglang-0.5.23" / "bin" / "python"
    )

    class Facts:
        servers = [type("P", (), {"pid": 7})()]

    record = {"status": "ready", "playbook": "p", "pid": 7, "plan": {"argv": ["x"], "env": [], "secret_env": []}}
    plan = type(
        "Plan", (), {"to_json": lambda self: {"argv": ["x"], "env": [], "secret_env": [], "engine_version": "0.5.11"}}
    )()
    record["plan"]["engine_version"] = "0.5.23"  # type: ignore[index]
    assert not runs_this_plan(parse_recorded(record), Facts(), plan, "p")  # type: ignore[arg-type]


def test_use_leaves_a_current_link_fleet_did_not_make(box: Path, tmp_path: Path) -> None:
    assert run_cli("-i", str(box), "engine", "install", "sglang==0.5.11", "--host", "box").code == 0
    link = tmp_path / "state" / "engines" / "sglang-current"
    link.symlink_to(tmp_path / "my-own-venv")
    r = run_cli("-i", str(box), "engine", "use", "sglang==0.5.11", "--host", "box")
    assert r.code == 4 and "not fleet's symlink" in r.err and os.readlink(link) == str(tmp_path / "my-own-venv")


def test_a_python_that_is_not_there_is_a_clear_refusal(box: Path) -> None:
    r = run_cli("-i", str(box), "engine", "install", "sglang==0.5.11", "--host", "box", "--python", "/nope/python3")
    assert r.code == 7 and "no Python at /nope/python3" in r.err


def test_a_second_install_of_the_same_version_while_one_runs_is_refused(
    box: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = wheel(tmp_path / "big", "sglang", "0.6.0", body=f"BLOB = {os.urandom(1 << 20).hex()!r}\n")
    index = SlowIndex(big, 100_000)
    monkeypatch.setenv("PIP_FIND_LINKS", index.url)
    argv = ["-i", str(box), "engine", "install", "sglang==0.6.0", "--host", "box"]
    first = subprocess.Popen(
        [sys.executable, "-m", "fleet", *argv],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT / "testbed")},
    )
    try:
        assert first.stderr is not None
        seen = b""
        while b"Collecting sglang" not in seen:
            line = first.stderr.readline()
            assert line, seen
            seen += line
        second = run_cli(*argv)
        assert second.code == 7 and "another fleet engine install of sglang 0.6.0 is running" in second.err
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=30)
        assert first.stderr is not None
        first.stderr.close()
        index.close()


def test_real_engine_releases_from_the_package_index_install_switch_and_plan_with_their_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang 0.5.11 and 0.5.23 as released, from the package index this machine reaches (without their
    dependencies: the environment proves its version by the package's own metadata, and the planner only
    needs that version). Each switch changes the plan to that version's flags."""
    from fleet_testbed import simhost

    for variable in ("PIP_NO_INDEX", "PIP_FIND_LINKS"):
        monkeypatch.delenv(variable, raising=False)
    h = simhost.build_host(tmp_path, simhost.CT129)  # its simulated GPUs and model, reached locally
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "hosts:\n  ct129:\n    connection: local\n    engines: {sglang: fleet}\n"
        f"    gpu_devices: {h}/dev/nvidia*\n"
        f"    models_dir: {h}/models\n    state_dir: {h}/state\n    log_dir: {h}/logs\n"
    )
    inv = ["-i", str(inventory), "--playbooks", str(ROOT / "playbooks")]
    for version in ("0.5.11", "0.5.23"):
        r = run_cli(*inv, "engine", "install", f"sglang=={version}", "--host", "ct129", "--pip-arg=--no-deps")
        assert r.code == 0, r.err
    for version in ("0.5.11", "0.5.23"):
        [site] = (h / "state" / "engines" / f"sglang-{version}").glob("lib/python*/site-packages")
        assert (site / f"sglang-{version}.dist-info").is_dir()
        assert (site / "sglang" / "srt" / "server_args.py").exists()  # the real release
        # its NVML, as the engine's own dependency nvidia-ml-py would be: the host's simulated GPUs
        (site / "pynvml.py").symlink_to(simhost.TESTBED / "simpkgs" / "pynvml.py")
        (site / "fleet-sim-host.pth").write_text(
            f"{simhost.TESTBED.parent}\nimport os; os.environ.setdefault('SIM_HOST_DIR', {str(h)!r})\n"
        )
    for version, flag, gone in (
        ("0.5.23", "--mamba-radix-cache-strategy", "--mamba-scheduler-strategy"),
        ("0.5.11", "--mamba-scheduler-strategy", "--mamba-radix-cache-strategy"),
        ("0.5.23", "--mamba-radix-cache-strategy", "--mamba-scheduler-strategy"),
    ):
        assert run_cli(*inv, "engine", "use", f"sglang=={version}", "--host", "ct129").code == 0
        plan = json.loads(run_cli(*inv, "plan", "qwen36-27b", "--host", "ct129", "--json").out)["plan"]
        assert plan["engine_version"] == version
        assert flag in plan["argv"] and gone not in plan["argv"]
        assert plan["argv"][0] == str(h / "state" / "engines" / f"sglang-{version}" / "bin" / "python")


def test_plan_check_runs_the_engines_own_check_and_shows_what_it_resolves(tmp_path: Path) -> None:
    """`fleet plan --check`: the check a deploy makes before stopping anything, alone: its verdict and what
    the engine resolved for the settings the plan leaves to it; an architecture it cannot load exits 4."""
    import shutil

    from fleet_testbed import simhost

    h = simhost.build_host(tmp_path, simhost.CT129)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "hosts:\n  ct129:\n    connection: local\n"
        f"    engines: {{sglang: {h}/env/bin/python}}\n    gpu_devices: {h}/dev/nvidia*\n"
        f"    models_dir: {h}/models\n    state_dir: {h}/state\n    log_dir: {h}/logs\n"
    )
    argv = ["-i", str(inventory), "plan", "--host", "ct129", "--check"]
    r = run_cli(*argv, str(ROOT / "playbooks" / "qwen36-27b.yaml"))
    assert r.code == 0, r.err
    assert "the engine's own check on ct129: accepted" in r.out
    assert "the engine resolved: " in r.out and "speculative EAGLE" in r.out
    assert not (h / "state" / "deployments").exists() or not any((h / "state" / "deployments").iterdir())

    shutil.copytree(simhost.MODELS / "Qwen3.6-27B", h / "models" / "Made-Up", dirs_exist_ok=True)
    simhost.write_weights(h / "models" / "Made-Up")  # sparse, as the simulated host's own
    config = json.loads((h / "models" / "Made-Up" / "config.json").read_text())
    (h / "models" / "Made-Up" / "config.json").write_text(json.dumps({**config, "architectures": ["MadeUpLM"]}))
    made_up = tmp_path / "made-up.yaml"
    made_up.write_text((ROOT / "playbooks" / "qwen36-27b.yaml").read_text().replace("Qwen3.6-27B", "Made-Up"))
    r = run_cli(*argv, str(made_up))
    assert r.code == 4 and "the engine's own check on ct129: rejected" in r.out
    assert "'MadeUpLM' is not a registered model" in r.out


def test_an_index_password_given_with_pip_arg_is_never_on_a_command_line(
    box: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--pip-arg=--index-url=https://user:PASSWORD@...` was in the host's process list for the whole
    install (the step's argv and pip's), readable by every user (issue 39). A real index that wants the
    password (HTTP basic auth) looks at every process's command line while pip asks it: none holds it."""
    import http.server
    import threading

    for variable in ("PIP_NO_INDEX", "PIP_FIND_LINKS"):
        monkeypatch.delenv(variable, raising=False)
    index = tmp_path / "index"
    password = "s3cr3t-index-pw"
    expected = "Basic " + base64.b64encode(f"ann:{password}".encode()).decode()
    seen: dict[str, list[str]] = {"argv": [], "auth": []}

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            for pid in os.listdir("/proc"):  # every process's command line, as `ps` shows them to anyone
                if pid.isdigit():
                    try:
                        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
                    except OSError:
                        continue
                    if password.encode() in argv:
                        seen["argv"].append(argv.decode(errors="replace")[:200])
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="index"')
                self.end_headers()
                return
            seen["auth"].append(self.path)
            name = self.path.rstrip("/").rsplit("/", 1)[-1]
            if self.path.startswith("/simple/"):
                links = "".join(f'<a href="/files/{w.name}">{w.name}</a>' for w in index.glob(f"{name}-*.whl"))
                body = f"<html><body>{links}</body></html>".encode()
            else:
                body = (index / name).read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "text/html" if self.path.startswith("/simple/") else "application/zip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://ann:{password}@127.0.0.1:{server.server_address[1]}/simple"
    try:
        install = ("-i", str(box), "engine", "install", "sglang==0.5.11", "--host", "box")
        r = run_cli(*install, f"--pip-arg=--index-url={url}")
    finally:
        server.shutdown()
        server.server_close()
    assert r.code == 0, r.out + r.err
    assert seen["auth"] and seen["argv"] == []
    assert password not in r.out + r.err
    refused = run_cli("-i", str(box), "engine", "install", "sglang==0.5.23", "--host", "box", f"--pip-arg={url}")
    assert refused.code != 0 and "outside --index-url" in refused.out + refused.err
