"""`fleet engine audit sglang==X`: every playbook planned on every host with the new version, the changes
in one table, and each new command line checked by that version's real parser and resolution on this
machine (the oracle's SGLang 0.5.23 stands for "a local Python with the new version"), against a
stand-in for the host's GPU. Nothing on any host changes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import sglang_oracle
from conftest import ROOT, run_cli
from factsdata import RTX_A6000, RTX_PRO_6000, facts
from fleet.control import audit, placing
from fleet.crashes import builtin_signatures
from fleet_testbed import simhost
from test_plan import host, playbook

ORACLE_PYTHON = sglang_oracle.ORACLE / ".venv" / "bin" / "python"
LAYERS_0511 = ":".join(str(sglang_oracle.ORACLE / ".venv" / "layers" / d) for d in ("sglang-0.5.11", "deps-0.5.11"))


def upgrade(pb_name: str, host_name: str, gpu: tuple, count: int, version: str = "0.5.23") -> audit.Audit:
    pb = playbook(pb_name)
    f = facts(host_name, gpu, count, model=pb.spec.model)
    now = placing.place_and_plan(host(host_name), pb, f, pb.name, None, replace=False, show_refusal=True).result
    then_facts = audit.with_version(f, "sglang", version)
    then = placing.place_and_plan(
        host(host_name), pb, then_facts, pb.name, None, replace=False, show_refusal=True
    ).result
    return audit.compare(host_name, pb.name, now, then, builtin_signatures())


def test_the_motivating_deployment_sees_its_renamed_flag_and_the_crashes_it_loses() -> None:
    row = upgrade("qwen35-nvfp4", "blackwell", RTX_PRO_6000, 8)
    assert row.now == "0.5.11" and row.verdict == "changes" and not row.refusals
    assert row.renamed == ("--mamba-scheduler-strategy -> --mamba-radix-cache-strategy  (hybrid-spec-extra-buffer)",)
    assert not any("mamba" in line for line in row.removed + row.added)  # a rename, not a removal and an addition
    assert row.crashes and row.defaults  # signatures and defaults kept to version ranges that change


def test_an_upgrade_says_what_sglang_decides_differently_for_this_plan_on_its_gpu() -> None:
    """Llama-3.1-8B (published config) on one 24 GB RTX 4090: 0.5.23 doubled the prefill chunk and the
    CUDA-graph batch SGLang picks on such a card and changed its memory budget; the command line sets none
    of them, so only the audit's defaults say so. The real resolution of both versions is held to these
    lines on every cell of the planner matrix (tests/test_plan_matrix.py)."""
    from factsdata import CONFIGS

    llama = CONFIGS.parent / "matrix" / "Llama-3.1-8B-Instruct"
    pb = playbook("qwen36-27b", model=llama.name, speculative=None)
    f = facts("blackwell", ("NVIDIA GeForce RTX 4090", "8.9", 24564), 1, model=llama)
    now = placing.place_and_plan(host("blackwell"), pb, f, pb.name, None, replace=False, show_refusal=True).result
    then_facts = audit.with_version(f, "sglang", "0.5.23")
    then = placing.place_and_plan(
        host("blackwell"), pb, then_facts, pb.name, None, replace=False, show_refusal=True
    ).result
    row = audit.compare("box", pb.name, now, then, builtin_signatures())
    assert "~ default chunked prefill: 2048 -> 4096" in "\n".join(row.defaults)
    assert "~ default CUDA graph max batch: 24 -> 48" in "\n".join(row.defaults)
    fraction = next(line for line in row.defaults if "memory fraction" in line)
    assert fraction.startswith("~ default memory fraction: 0.8") and "-> 0.7" in fraction
    assert all("\n" not in line for line in row.defaults)
    same = audit.compare("box", pb.name, now, now, builtin_signatures())
    assert not same.defaults  # the same version decides nothing differently


def test_a_plan_the_new_version_refuses_is_a_refusal_row() -> None:
    row = upgrade("qwen35-nvfp4", "ct129", RTX_A6000, 2)
    assert row.verdict == "refused" and any("weights need" in r for r in row.refusals)


def test_the_same_version_changes_nothing() -> None:
    row = upgrade("qwen36-27b", "ct129", RTX_A6000, 2, version="0.5.11")
    assert row.verdict == "same" and not (row.removed or row.renamed or row.added or row.changed or row.crashes)


def test_the_command_line_goes_to_the_local_parser_with_the_model_config_and_cuda() -> None:
    assert audit._local_args(["--model-path", "/models/x", "--tp-size", "8"], "/tmp/m") == [
        "--model-path", "/tmp/m", "--tp-size", "8", "--device", "cuda",
    ]  # fmt: skip


@pytest.mark.ssh
def test_an_upgrade_audited_over_the_simulated_fleet_with_the_real_parser(
    fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both hosts run SGLang 0.5.11. The audit for 0.5.23 plans every playbook on both, runs the real
    0.5.23 parser and resolution on every plan pre-flight accepts, and finds the one that 0.5.23 rejects:
    a hand-set --cuda-graph-max-bs, ambiguous since 0.5.14 split it."""
    sglang_oracle.require_oracle()
    books = tmp_path / "playbooks"
    books.mkdir()
    for name in ("qwen35-nvfp4", "qwen36-27b"):
        (books / f"{name}.yaml").write_text((ROOT / "playbooks" / f"{name}.yaml").read_text())
    (books / "graphs.yaml").write_text(
        (ROOT / "playbooks" / "qwen36-27b.yaml").read_text() + 'extra_args: [--cuda-graph-max-bs, "32"]\n'
    )
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(books))
    before = {h: sorted(p.name for p in (fleet_env.host_dir(h) / "state").rglob("*")) for h in ("blackwell", "ct129")}
    r = run_cli("engine", "audit", "sglang==0.5.23", "--parser", str(ORACLE_PYTHON), "--json")
    assert r.code == 4, r.out + r.err  # something is refused
    rows = {(x["host"], x["playbook"]): x for x in map(json.loads, r.out.splitlines())}
    assert set(rows) == {(h, p) for h in ("blackwell", "ct129") for p in ("qwen35-nvfp4", "qwen36-27b", "graphs")}
    assert rows[("blackwell", "qwen35-nvfp4")]["parser"] == "accepted"
    assert rows[("blackwell", "qwen35-nvfp4")]["renamed"]
    assert rows[("ct129", "qwen36-27b")]["parser"] == "accepted"
    graphs = rows[("blackwell", "graphs")]
    assert graphs["verdict"] == "refused" and graphs["parser"].startswith("rejected")
    assert "ambiguous option: --cuda-graph-max-bs" in graphs["parser"]
    assert rows[("ct129", "qwen35-nvfp4")]["verdict"] == "refused"  # pre-flight: it does not fit there
    assert rows[("ct129", "qwen35-nvfp4")]["parser"] == "not checked"
    after = {h: sorted(p.name for p in (fleet_env.host_dir(h) / "state").rglob("*")) for h in ("blackwell", "ct129")}
    assert after == before  # nothing installed or written on any host
    table = run_cli("engine", "audit", "sglang==0.5.23", "--parser", str(ORACLE_PYTHON), "--host", "blackwell")
    assert table.code == 4 and "blackwell/graphs" in table.out and "renamed: --mamba-scheduler-strategy" in table.out


@pytest.mark.ssh
def test_a_groups_ranks_and_a_host_without_the_engine_have_rows_of_their_own(
    fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A playbook over several hosts is audited rank by rank on its own hosts (it was left out without a
    word), and a host that has no environment of the engine says so instead of having no row."""
    books = tmp_path / "playbooks"
    books.mkdir()
    single = (ROOT / "playbooks" / "qwen36-27b.yaml").read_text().replace("default_host: ct129\n", "")
    group = single + "hosts: [blackwell, ct129]\ndist_port: 50000\n"
    (books / "pair.yaml").write_text(group)
    (books / "far.yaml").write_text(group.replace("hosts: [blackwell, ct129]", "hosts: [far-a, far-b]"))
    (books / "typo.yaml").write_text(group.replace("hosts: [blackwell, ct129]", "hosts: [blackwell, blackwel]"))
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        fleet_env.inventory.read_text().replace(
            "\ngroups:", "\n  cpubox:\n    address: 127.0.0.3\n    engines: {vllm: /usr/bin/python3}\ngroups:", 1
        )
    )
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(books))
    monkeypatch.setenv("FLEET_INVENTORY", str(inventory))
    r = run_cli("engine", "audit", "sglang==0.5.23", "--json")
    rows = {(x["host"], x["playbook"]): x for x in map(json.loads, r.out.splitlines())}
    far, typo = ("far-a,far-b", "far[group]"), ("blackwell,blackwel", "typo[group]")
    expected = {("blackwell", "pair[rank 0]"), ("ct129", "pair[rank 1]"), ("cpubox", "-"), far, typo}
    assert set(rows) == expected, r.out
    assert rows[far]["verdict"] == "skipped" and "none of its hosts (far-a, far-b)" in rows[far]["skipped"]
    # a group some of whose hosts are known is a mistake to fix, not a group for other boxes
    assert rows[typo]["verdict"] == "unknown" and 'names "blackwel"' in rows[typo]["error"]
    assert r.code == (4 if any(x["verdict"] == "refused" for x in rows.values()) else 1)  # never 0 with it
    assert rows[("cpubox", "-")]["verdict"] == "skipped" and "no sglang" in rows[("cpubox", "-")]["skipped"]
    assert all(rows[k]["parser"] == "not checked" for k in rows if k[1].startswith("pair["))  # none asked for
    assert "went through sglang 0.5.23's own parser" in r.err  # said: nothing was checked by it


@pytest.mark.ssh
def test_a_parser_of_another_version_is_refused_before_any_host_is_asked(fleet_env: simhost.Sandbox) -> None:
    sglang_oracle.require_oracle()
    wrong = f"env PYTHONPATH={LAYERS_0511} {ORACLE_PYTHON}"
    r = run_cli("engine", "audit", "sglang==0.5.23", "--parser", wrong)
    assert r.code == 2 and "it has sglang 0.5.11, not 0.5.23" in r.err, r.err


@pytest.mark.realparser
@pytest.mark.parametrize(
    ("version", "parser"),
    [("0.5.23", [str(ORACLE_PYTHON)]), ("0.5.11", [f"PYTHONPATH={LAYERS_0511}", str(ORACLE_PYTHON)])],
)
def test_fleets_engine_check_runs_whole_in_the_real_sglang_against_a_stand_in_gpu(
    version: str, parser: list[str]
) -> None:
    """The check a deploy runs on a host, run here in the real package: it resolves the plan and reads the
    model registry (found by review: the released wheels' `sglang.srt` is a namespace package with no
    __file__, and the check failed there as could_not_check after resolution had passed)."""
    sglang_oracle.require_oracle()
    assert audit.local_version(parser, "sglang") == version
    pb = playbook("qwen35-nvfp4")
    f = audit.with_version(facts("blackwell", RTX_PRO_6000, 8, model=pb.spec.model), "sglang", version)
    r = placing.place_and_plan(host("blackwell"), pb, f, pb.name, None, replace=False).result
    plan = r.plan
    assert plan is not None
    assert audit.parser_verdict(parser, plan, r.gpus, f.model) == "accepted"
    # NEXTN on this hybrid model without extra_buffer: refused by resolution itself (engines.md §2.1)
    wrong = replace(plan, flags=tuple(replace(x, value="no_buffer") if "mamba" in x.name else x for x in plan.flags))
    said = audit.parser_verdict(parser, wrong, r.gpus, f.model)
    assert said.startswith("rejected: ") and ("no_buffer" in said or "radix cache" in said), said


def test_a_command_line_not_checked_is_unknown_not_the_same() -> None:
    """Found by review: a parser that could not run left the row `same` and the exit 0."""
    assert audit.Audit("h", "p", "0.5.11", parser="could_not_check: ImportError: x").verdict == "unknown"
    assert audit.Audit("h", "p", "-", error="unreachable").verdict == "unknown"
    assert audit.Audit("h", "p", "0.5.11", parser="accepted").verdict == "same"
    # found by review: asked for, and not run on this one (the model ships its own code, a group's rank)
    why = "not checked: the model ships its own code (auto_map), which fleet never runs on this machine"
    assert audit.Audit("h", "p", "0.5.11", parser=why).verdict == "unknown"
    assert audit.Audit("h", "p", "0.5.11").verdict == "same"  # no parser asked for: the plans alone


def test_a_host_never_names_code_for_this_machine_to_run() -> None:
    """Found by review: a host's config.json with auto_map (and a playbook that trusts the model's code)
    made the local SGLang import a module named there, on the operator's machine. The model's own code
    is never run here: such a model is not checked, the copy drops auto_map, and --trust-remote-code
    does not reach the local parser."""
    pb = playbook("qwen36-27b")
    f = facts("ct129", RTX_A6000, 2, model=pb.spec.model)
    r = placing.place_and_plan(host("ct129"), pb, f, pb.name, None, replace=False).result
    plan = r.plan
    assert plan is not None and f.model is not None and isinstance(f.model.config, dict)
    hostile = replace(f.model, config={**f.model.config, "auto_map": {"AutoConfig": "/x--m.C"}})
    said = audit.parser_verdict(["/nonexistent/python"], plan, r.gpus, hostile)
    assert said.startswith("not checked: the model ships its own code")
    assert "auto_map" not in audit.without_code({"auto_map": {}, "architectures": ["X"]})
    assert "--trust-remote-code" not in audit._local_args(["--model-path", "/m", "--trust-remote-code"], "/t")


@pytest.mark.parametrize("parser", ["'x", "", "python -I", "A=1", "=1 python"])
def test_a_parser_that_is_not_a_python_command_is_refused(parser: str) -> None:
    from fleet.cli.audit import _parser
    from fleet.errors import ConfigError

    with pytest.raises(ConfigError, match="--parser"):
        _parser(parser, "sglang", "0.5.23")


def test_an_audit_row_is_one_line_whatever_a_playbooks_name_or_a_hosts_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Found by an adversarial pass: a newline in a playbook's file name forged a row of the table."""
    from fleet.cli.audit import _table

    forged = audit.Audit("box", "evil\nbox/ok  0.5.11  same", "0.5.11", refusals=("a\nrefusals: forged",))
    _table([forged], "sglang", "0.5.23", checked=False)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and out[2].startswith("box/evil\\nbox/ok") and out[3] == "    refusals: a\\nrefusals: forged"
