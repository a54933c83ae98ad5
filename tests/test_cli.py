"""The command line: every subcommand documents itself with an example; errors map to exit codes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from fleet.cli import cli

COMMANDS = sorted(cli.commands)


def test_the_commands_the_readme_promises_exist() -> None:
    assert {"facts", "plan", "deploy", "restart", "stop", "status", "logs", "diagnose"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_has_help_with_an_example(command: str) -> None:
    r = run_cli(command, "--help")
    assert r.code == 0
    assert "Example" in r.out and f"fleet {command}" in r.out


def test_top_level_help_lists_examples() -> None:
    r = run_cli("--help")
    assert r.code == 0 and "fleet deploy qwen35-nvfp4 --host blackwell" in r.out


def test_version_is_the_packages_own() -> None:
    import tomllib

    packaged = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    r = run_cli("--version")
    assert r.code == 0 and r.out.strip() == f"fleet {packaged}"


def test_unknown_option_is_a_usage_error() -> None:
    r = run_cli("deploy", "--no-such-option")
    assert r.code == 2


def test_missing_inventory_is_a_config_error(tmp_path: Path) -> None:
    r = run_cli("-i", str(tmp_path / "nope.yaml"), "status")
    assert r.code == 2 and "nope.yaml: cannot read (No such file or directory)." in r.err


def test_health_that_cannot_run_is_unknown_not_critical(tmp_path: Path) -> None:
    """Nagios plugin guidelines: bad arguments or configuration are UNKNOWN (3); CRITICAL (2) would page
    someone about servers nobody checked."""
    bad = tmp_path / "hosts.yaml"
    bad.write_text("hosts:\n  a:\n    address: 127.0.0.9\n    port: x\n")
    lock = str(tmp_path / "health.lock")
    r = run_cli("-i", str(bad), "health", "--lock-file", lock)
    assert r.code == 3 and 'hosts.yaml:4: field "port" must be an integer' in r.err
    r = run_cli("-i", str(ROOT / "inventory" / "hosts.yaml"), "health", "--host", "ct130", "--lock-file", lock)
    assert r.code == 3 and 'no host or group named "ct130"' in r.err
    assert run_cli("health", "--no-such-option").code == 3
    assert run_cli("health", "--deadline", "0").code == 3
    assert run_cli("-i", str(bad), "status").code == 2  # every other command keeps exit 2 for bad input


def test_files_fleet_writes_are_checked_before_it_runs(tmp_path: Path) -> None:
    """Not a traceback after the sweep: the option, the path and what is wrong with it."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    r = run_cli("health", "--textfile", str(a_file / "fleet.prom"))
    assert r.code == 3 and f"Invalid value for '--textfile': {a_file} is not a directory" in r.err
    r = run_cli("health", "--log-file", str(tmp_path))
    assert r.code == 3 and f"{tmp_path} is a directory; give a file name in it." in r.err
    r = run_cli("cron", "install", "--log-file", str(a_file / "health.log"))
    assert r.code == 2 and "Invalid value for '--log-file'" in r.err


def test_fleets_cache_directory_is_made_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It holds the pool's sockets, the health lock and logs naming the hosts: made 0700, as the pool makes it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    bad = tmp_path / "hosts.yaml"
    bad.write_text("hosts: {}\n")
    assert run_cli("-i", str(bad), "health").code == 3  # the lock is taken (the directory made) first
    assert stat.S_IMODE(os.stat(tmp_path / "fleet").st_mode) == 0o700


def test_a_device_is_appended_to_but_never_replaced(tmp_path: Path) -> None:
    """--log-file /dev/null discards the log; --textfile /dev/null would have renamed a regular file over
    the device (as root), so it is refused and the device stays."""
    bad = tmp_path / "hosts.yaml"
    bad.write_text("hosts: {}\n")
    r = run_cli("-i", str(bad), "health", "--log-file", "/dev/null", "--lock-file", str(tmp_path / "l"))
    assert r.code == 3 and "no hosts defined" in r.err  # the run got past its options
    r = run_cli("health", "--textfile", "/dev/null")
    assert r.code == 3 and "Invalid value for '--textfile': /dev/null is not a regular file" in r.err
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_lock_file_that_is_a_link_or_a_fifo_is_refused_and_nothing_is_written_through_it(tmp_path: Path) -> None:
    """In a shared directory another user can put a link where the lock goes (fleet truncated and wrote
    the file it led to) or a FIFO (the run waited on it for good)."""
    bad = tmp_path / "hosts.yaml"
    bad.write_text("hosts: {}\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "fleet-health.lock"
    link.symlink_to(victim)
    r = run_cli("-i", str(bad), "health", "--lock-file", str(link))
    assert r.code == 3 and f"the health lock {link} cannot be opened" in r.err and victim.read_text() == "precious"
    fifo = tmp_path / "fifo.lock"
    os.mkfifo(fifo)
    r = run_cli("-i", str(bad), "health", "--lock-file", str(fifo))
    assert r.code == 3 and f"{fifo} cannot be written" in r.err


def test_a_path_root_may_access_but_not_create_is_refused_too() -> None:
    """os.access says yes to root everywhere; /proc takes no new file and /proc/loadavg no writes."""
    r = run_cli("health", "--lock-file", "/proc/fleet.lock")
    assert r.code == 3 and "/proc/fleet.lock cannot be written: no file can be created in /proc" in r.err
    assert "Traceback" not in r.err
    r = run_cli("health", "--textfile", "/proc/fleet/fleet.prom")
    assert r.code == 3 and "Invalid value for '--textfile': /proc/fleet/fleet.prom cannot be written" in r.err


def test_unknown_host_names_the_known_ones() -> None:
    r = run_cli("-i", str(ROOT / "inventory" / "hosts.yaml"), "facts", "--host", "ct130")
    assert r.code == 2 and 'no host or group named "ct130"' in r.err and "blackwell, ct129, gpu" in r.err


def test_diagnose_reads_stdin_and_prints_json(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr(
        sys,
        "stdin",
        io.TextIOWrapper(
            io.BytesIO(
                b"ValueError: Speculative decoding for Qwen3NextForCausalLM is not "
                b"compatible with radix cache when using --mamba-scheduler-strategy "
                b"no_buffer.To use radix cache ...\n"
            )
        ),
    )
    r = run_cli("diagnose", "-", "--json")
    assert r.code == 0
    assert '"category": "spec_decode_hybrid_mamba"' in r.out and '"signature": "sglang-spec-hybrid-no-buffer"' in r.out


def test_diagnose_reads_the_end_of_a_huge_log_only(tmp_path: Path) -> None:
    """A server log grows to gigabytes: the crash at its end is found without reading it all in."""
    log = tmp_path / "big.log"
    with open(log, "wb") as f:
        f.write(b"ValueError: Speculative decoding for Qwen3NextForCausalLM is not compatible with radix cache\n")
        f.truncate(1 << 30)  # 1 GiB, sparse: reading it through takes seconds and gigabytes of memory
        f.seek(0, 2)
        f.write(b"\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    started = time.monotonic()
    r = run_cli("diagnose", str(log), "--json")
    assert r.code == 0 and '"signature": "cuda-oom-startup"' in r.out
    assert time.monotonic() - started < 30  # a bound only a full read breaks, not a timing claim


# A client's text echoed in a request log line, with separators str.splitlines breaks a line at
ECHOED_OOM = (
    "[2026-12-07 10:00:01] Receive: obj=GenerateReqInput(rid='x', text='hi{sep}torch.OutOfMemoryError: "
    "CUDA out of memory. Tried to allocate 2.00 GiB{sep}')\n"
    "[2026-12-07 10:00:02] Received sigquit from a child process. It usually means the child failed.\n"
)


@pytest.mark.parametrize("sep", ["\v", "\f", "\x1c", "\x1e", "\x85", "\u2028", "\u2029"])
def test_diagnose_reads_a_line_as_the_watch_does_never_a_clients_separator_as_a_new_line(
    tmp_path: Path, sep: str
) -> None:
    """The crash a client's text names is not the engine's: no fix comes of it."""
    log = tmp_path / "echo.log"
    log.write_text(ECHOED_OOM.format(sep=sep), encoding="utf-8")
    r = run_cli("diagnose", str(log), "--json")
    assert r.code == 0 and '"fix": null' in r.out and "cuda-oom" not in r.out
    own = ECHOED_OOM.format(sep="\n[2026-12-07 10:00:01 TP0] ")  # a line the engine's logger began
    log.write_text(own, encoding="utf-8")
    assert '"signature": "cuda-oom-startup"' in run_cli("diagnose", str(log), "--json").out


def test_diagnose_of_a_healthy_log_is_healthy(tmp_path: Path) -> None:
    log = tmp_path / "ok.log"
    log.write_text(
        "[2026-11-29 10:00:00 TP0] Load weight end.\n[2026-11-29 10:00:09] The server is fired up and ready to roll!\n"
    )
    r = run_cli("diagnose", str(log))
    assert r.code == 0 and r.out.startswith("healthy")


def test_user_signatures_are_read_only_from_the_directory_named_with_crashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `crashes/` folder in the working directory (a checkout, a download) is not knowledge: only the
    directory the operator names is read (issue 39: a crafted one set --host 0.0.0.0 as a fix)."""
    (tmp_path / "crashes").mkdir()
    (tmp_path / "crashes" / "site.yaml").write_text(
        "- id: our-flaky-nfs\n  category: model_files_missing\n  patterns: ['Stale file handle']\n"
        "  explanation: the NFS model mount went stale; remount it\n  fix: null\n"
    )
    (tmp_path / "x.log").write_text("OSError: [Errno 116] Stale file handle\n")
    monkeypatch.chdir(tmp_path)
    assert "our-flaky-nfs" not in run_cli("diagnose", "x.log").out
    r = run_cli("--crashes", "crashes", "diagnose", "x.log")
    assert r.out.startswith("model_files_missing (our-flaky-nfs)")
    monkeypatch.setenv("FLEET_CRASHES", str(tmp_path / "crashes"))
    assert run_cli("diagnose", "x.log").out.startswith("model_files_missing (our-flaky-nfs)")
    missing = run_cli("--crashes", "nowhere", "diagnose", "x.log")
    assert missing.code == 2 and "--crashes nowhere: no such directory" in missing.err


@pytest.mark.parametrize(
    "fix",
    [
        "{set_flags: {--host: 0.0.0.0}}",
        "{set_flags: {--trust-remote-code: null}}",
        "{set_env: {LD_PRELOAD: /tmp/x.so}}",
        "{set_env: {NCCL_NET_PLUGIN: evil}}",
        "{set_flags: {--enable-custom-logit-processor: null}}",
        "{remove_flags: [--api-key]}",
        "{set_flags: {--model-path: /tmp/other}}",
        "{set_flags: {--mem-fraction-static: '0.8; touch /tmp/x'}}",
        # spellings a prefix match let through: a flag or variable with a newline after it, a value the
        # launcher reads as a secret's place, a derived fix fleet has no code for
        '{set_flags: {"--dtype\\n": half}}',
        '{set_env: {"SGLANG_ENABLE_SPEC_V2\\n": "1"}}',
        "{set_flags: {--dtype: 'fleet-secret:HF_TOKEN'}}",
        '{set_flags: {--dtype: "half\\n"}}',
        "{derive: run_anything}",
    ],
)
def test_a_knowledge_file_whose_fix_widens_exposure_or_runs_code_is_refused(tmp_path: Path, fix: str) -> None:
    (tmp_path / "site.yaml").write_text(
        "- id: crafted\n  category: other\n  patterns: ['^boom']\n  explanation: e\n  fix: " + fix + "\n"
    )
    (tmp_path / "x.log").write_text("boom\n")
    r = run_cli("--crashes", str(tmp_path), "diagnose", str(tmp_path / "x.log"))
    assert r.code == 2 and "site.yaml: signature #1: a fix" in r.err, r


def test_only_the_pool_command_itself_skips_the_pool() -> None:
    """`fleet pool stop` must not run in a process the pool forked; a host or playbook named "pool" may."""
    import click

    from fleet.launch import GLOBAL_OPTIONS_WITH_VALUE, command_word

    assert command_word(["pool", "stop"]) == "pool"
    assert command_word(["-i", "pool", "--debug", "--playbooks=x", "pool", "status"]) == "pool"
    assert command_word(["health", "--host", "pool"]) == "health"
    assert command_word(["--inventory", "pool", "deploy", "pool"]) == "deploy"
    assert command_word(["--debug"]) is None
    with_value = {o for p in cli.params if isinstance(p, click.Option) and not p.is_flag for o in p.opts}
    assert with_value == set(GLOBAL_OPTIONS_WITH_VALUE)


def test_help_starts_fast_without_importing_ssh_libraries() -> None:
    code = (
        "import sys, fleet.cli; fleet.cli.main(['--help']); "
        "print('LOADED' if {'paramiko', 'fabric', 'rich'} & set(sys.modules) else 'LEAN')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.strip().endswith("LEAN")


def _complete(words: str, env: dict[str, str]) -> list[str]:
    """What bash completion offers for the last word of `words` (click's protocol: type,value lines)."""
    n = len(words.split())
    cword = n if words.endswith(" ") else n - 1
    out = subprocess.run(
        [str(Path(sys.executable).parent / "fleet")],
        env={**os.environ, **env, "_FLEET_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(cword)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and not out.stderr, out.stderr
    return [line.split(",", 1)[1] for line in out.stdout.splitlines() if line]


def test_the_shell_completes_hosts_groups_playbooks_services_and_a_deployments_host(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(
        "hosts:\n  gpu-a: {address: 10.0.0.1}\n  gpu-b: {address: 10.0.0.2}\ngroups:\n  lab: {hosts: [gpu-a]}\n"
    )
    (tmp_path / "services").mkdir()
    (tmp_path / "services" / "chat.yaml").write_text("")
    env = {"FLEET_INVENTORY": str(inventory), "FLEET_PLAYBOOKS": str(ROOT / "playbooks"),
           "FLEET_SERVICES": str(tmp_path / "services")}  # fmt: skip
    assert _complete("fleet status --host ", env) == ["gpu-a", "gpu-b", "lab"]
    assert _complete("fleet deploy qwen36-27b --host gpu-", env) == ["gpu-a", "gpu-b"]
    assert _complete("fleet deploy qwen3", env) == ["qwen35-nvfp4", "qwen35-nvfp4-handwritten", "qwen35-two-nodes",
                                                    "qwen36-27b"]  # fmt: skip
    assert _complete("fleet forget gpu-b", env) == ["gpu-b/"]  # the deployment's name is the host's to say
    assert _complete("fleet up ", env) == ["chat"]
    assert _complete("fleet -i /nonexistent/hosts.yaml status --host ", env) == []  # nothing, and no traceback
