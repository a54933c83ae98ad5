"""The simulator and fleet's plans against the REAL SGLang argument parsers (0.5.11 and 0.5.23).

Uses the sglang-oracle from ../shared/tools (built into .cache/sglang-oracle by `make oracle`): the
real wheels' `prepare_server_args` / resolution on a fake GPU. For each command line the simulator must
accept or reject exactly what the real parser of that version does, and every command line fleet
generates must be accepted by the real parser of the version it targets.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec
import pytest

import sglang_oracle
from conftest import ROOT
from factsdata import RTX_A6000, RTX_PRO_6000, facts
from fleet.inventory import load_inventory, load_playbook
from fleet.plan import Fix, apply_fix, weight_cache
from fleet.plan.build import build_plan
from fleet_testbed import simhost
from fleet_testbed.sglang_flags import build_parser, parse_version
from fleet_testbed.sglang_sim import SimError, resolve

pytestmark = pytest.mark.realparser
MODELS = simhost.MODELS
Q35 = "/models/Qwen3.5-397B-A17B-NVFP4"
Q36 = "/models/Qwen3.6-27B"
HAND = (
    f"--model-path {Q35} --tp 8 --speculative-algorithm NEXTN --speculative-num-draft-tokens 2 "
    "--speculative-eagle-topk 1 --quantization modelopt_fp4 --moe-runner-backend flashinfer_cutlass "
    "--fp4-gemm-backend flashinfer_cudnn --mem-fraction-static 0.85 --host 0.0.0.0 --port 30000 --trust-remote-code"
)


@dataclass(frozen=True)
class Case:
    name: str
    version: str
    resolve: bool
    argv: tuple[str, ...]
    gpu: str = "sm120"
    expect: str = "accepted"


def _fleet_plan(
    playbook: str,
    host: str,
    gpus: tuple,
    version: str,
    fixes: tuple[Fix, ...] = (),
    placed: tuple[int, ...] | None = None,
    port: int | None = None,
    speculative: bool = True,
    parsers: str | None = None,
) -> tuple[str, ...]:
    """`placed`, `port`: a deployment on some of the host's GPUs, beside another (its own --nccl-port);
    `speculative`: False plans the playbook without its speculative: section; `parsers`: its parsers:."""
    inv = load_inventory(ROOT / "inventory" / "hosts.yaml")
    pb = load_playbook(playbook, ROOT / "playbooks")
    if not speculative:
        pb = replace(pb, spec=msgspec.structs.replace(pb.spec, speculative=None))
    if parsers:
        pb = replace(pb, spec=msgspec.structs.replace(pb.spec, parsers=parsers))
    model = pb.spec.model
    f = facts(host, gpus[0], gpus[1], version=version, model=model)
    r = build_plan(inv.hosts[host], pb, f, f"/models/{model}", gpu_indices=placed, port=port)
    assert r.plan is not None
    plan = r.plan
    for i, fix in enumerate(fixes):
        plan = apply_fix(plan, fix, f"fix{i}", "test")
    return tuple(plan.engine_args())


def _cached_plan(part: str) -> tuple[str, ...]:
    """Qwen3.6-27B on the 2x A6000 box with weight_cache: on 0.5.23: the engine's command line, or the one
    fleet starts the weight cache daemon with (its server flags: the daemon hands them to
    prepare_server_args, weight_cache/daemon.py __main__)."""
    inv = load_inventory(ROOT / "inventory" / "hosts.yaml")
    pb = load_playbook("qwen36-27b", ROOT / "playbooks")
    pb = replace(pb, spec=msgspec.structs.replace(pb.spec, speculative=None, weight_cache=True))
    f = facts("ct129", RTX_A6000, 2, version="0.5.23", model=pb.spec.model)
    r = build_plan(inv.hosts["ct129"], pb, f, f"/models/{pb.spec.model}")
    assert r.plan is not None and not r.errors, r.verdicts
    return tuple(r.plan.engine_args() if part == "engine" else weight_cache.daemon_argv(r.plan)[3:])


def _group_rank_plan(version: str, rank: int) -> tuple[str, ...]:
    """qwen35-nvfp4 spread over two 8-GPU Blackwell boxes (tp 16), as rank `rank` runs it."""
    from fleet.plan.group import Node, rank_plan

    inv = load_inventory(ROOT / "inventory" / "hosts.yaml")
    pb = load_playbook("qwen35-nvfp4", ROOT / "playbooks")
    pb = replace(pb, spec=msgspec.structs.replace(pb.spec, hosts=["blackwell", "blackwell-2"], tp=16))
    f = facts("blackwell", RTX_PRO_6000, 8, version=version, model=pb.spec.model)
    r = build_plan(inv.hosts["blackwell"], pb, f, f"/models/{pb.spec.model}", nodes=2)
    assert r.plan is not None, r.verdicts
    nodes = [Node(0, "blackwell", "10.0.0.1", "ens1f0"), Node(1, "blackwell-2", "10.0.0.2", "ens1f0")]
    return tuple(rank_plan(r.plan, nodes, rank, 50000).engine_args())


SPEC_ONE_STEP = "--speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2"
CASES = [
    # issue 41: what fleet starts for a weight cache, and what the real 0.5.23 refuses of it
    Case("weight-cache-engine-0523", "0.5.23", True, _cached_plan("engine"), gpu="sm86"),
    Case("weight-cache-daemon-0523", "0.5.23", True, _cached_plan("daemon"), gpu="sm86"),
    Case(
        "weight-cache-with-speculative-0523",
        "0.5.23",
        True,
        (*_cached_plan("engine"), *shlex.split(f"--speculative-algorithm NEXTN {SPEC_ONE_STEP}")),
        gpu="sm86",
        expect="rejected",
    ),
    Case("weight-cache-on-0511", "0.5.11", False, _cached_plan("engine"), expect="rejected"),
    Case("motivating-parse-0511", "0.5.11", False, tuple(shlex.split(HAND))),
    Case(
        "new-flag-on-0511",
        "0.5.11",
        False,
        (*shlex.split(HAND), "--mamba-radix-cache-strategy", "extra_buffer"),
        expect="rejected",
    ),
    Case("marlin-on-0511", "0.5.11", False, (*shlex.split(HAND), "--moe-runner-backend", "marlin"), expect="rejected"),
    Case("cuda-graph-max-bs-0511", "0.5.11", False, (*shlex.split(HAND), "--cuda-graph-max-bs", "32")),
    Case(
        "old-flag-on-0523",
        "0.5.23",
        False,
        (*shlex.split(HAND), "--mamba-scheduler-strategy", "extra_buffer"),
        expect="rejected",
    ),
    Case("ambiguous-on-0523", "0.5.23", False, (*shlex.split(HAND), "--cuda-graph-max-bs", "32"), expect="rejected"),
    Case("marlin-on-0523", "0.5.23", False, (*shlex.split(HAND), "--moe-runner-backend", "marlin")),
    Case("graph-decode-0523", "0.5.23", False, (*shlex.split(HAND), "--cuda-graph-max-bs-decode", "32")),
    Case("motivating-resolve-0511", "0.5.11", True, tuple(shlex.split(HAND)), expect="rejected"),
    Case(
        "extra-buffer-no-steps-0511",
        "0.5.11",
        True,
        (*shlex.split(HAND), "--mamba-scheduler-strategy", "extra_buffer"),
        expect="rejected",
    ),
    Case("motivating-resolve-0523", "0.5.23", True, tuple(shlex.split(HAND)), expect="rejected"),
    Case(
        "qwen36-nofix-0511",
        "0.5.11",
        True,
        tuple(
            shlex.split(
                f"--model-path {Q36} --tp 2 --speculative-algorithm NEXTN --speculative-num-steps 3 "
                "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --host 0.0.0.0 --port 30000"
            )
        ),
        gpu="sm86",
        expect="rejected",
    ),
    Case(
        "fleet-qwen35-blackwell-0511",
        "0.5.11",
        True,
        _fleet_plan("qwen35-nvfp4", "blackwell", (RTX_PRO_6000, 8), "0.5.11"),
    ),
    Case(
        "fleet-qwen35-blackwell-0523",
        "0.5.23",
        True,
        _fleet_plan("qwen35-nvfp4", "blackwell", (RTX_PRO_6000, 8), "0.5.23"),
    ),
    Case(
        "fleet-qwen36-ct129-0511",
        "0.5.11",
        True,
        _fleet_plan("qwen36-27b", "ct129", (RTX_A6000, 2), "0.5.11"),
        gpu="sm86",
    ),
    Case(  # a hybrid model without NEXTN: extra_buffer rather than no_buffer, which turns overlap off
        "fleet-qwen36-no-spec-ct129-0511",
        "0.5.11",
        True,
        _fleet_plan("qwen36-27b", "ct129", (RTX_A6000, 2), "0.5.11", speculative=False),
        gpu="sm86",
    ),
    Case(
        "fleet-qwen36-ct129-0523",
        "0.5.23",
        True,
        _fleet_plan("qwen36-27b", "ct129", (RTX_A6000, 2), "0.5.23"),
        gpu="sm86",
    ),
    *(  # parsers: auto -- the family's names on 0.5.11, SGLang's own detection (auto) on 0.5.23
        Case(
            f"fleet-qwen36-parsers-{version.replace('.', '')}",
            version,
            True,
            _fleet_plan("qwen36-27b", "ct129", (RTX_A6000, 2), version, parsers="auto"),
            gpu="sm86",
        )
        for version in ("0.5.11", "0.5.23")
    ),
    *(
        Case(
            f"fleet-placed-beside-another-{version.replace('.', '')}",
            version,
            True,
            _fleet_plan("qwen36-27b", "blackwell", (RTX_PRO_6000, 8), version, placed=(6, 7), port=30010),
        )
        for version in ("0.5.11", "0.5.23")
    ),
    *(  # one model over two hosts: every rank's command line, as the real parser of each version reads it
        Case(f"fleet-group-rank{rank}-{version.replace('.', '')}", version, True, _group_rank_plan(version, rank))
        for version in ("0.5.11", "0.5.23")
        for rank in (0, 1)
    ),
    Case(
        "fleet-handwritten-fixed-0511",
        "0.5.11",
        True,
        _fleet_plan(
            "qwen35-nvfp4-handwritten",
            "blackwell",
            (RTX_PRO_6000, 8),
            "0.5.11",
            (Fix(set_flags=(("--mamba-scheduler-strategy", "extra_buffer"),)), Fix(derive="speculative_num_steps")),
        ),
    ),
]


def _tp(argv: tuple[str, ...]) -> int:
    """The TP ranks on this node: a group's TP is over all of its nodes."""
    nodes = int(argv[argv.index("--nnodes") + 1]) if "--nnodes" in argv else 1
    for flag in ("--tp-size", "--tp"):
        if flag in argv:
            return int(argv[argv.index(flag) + 1]) // nodes
    return 1


def sim_verdict(case: Case) -> tuple[str, str]:
    version = parse_version(case.version)
    argv = [a.replace("/models/", f"{MODELS}/") for a in case.argv]
    if not case.resolve:
        try:
            build_parser(version).parse_args(argv)
        except SystemExit:
            return "rejected", "ArgumentError"
        return "accepted", ""
    cc = "12.0" if case.gpu == "sm120" else "8.6"
    mem = 97887 if case.gpu == "sm120" else 49140
    gpus = [{"compute_capability": cc, "memory_total_mib": mem, "memory_used_mib": 0}] * _tp(case.argv)
    try:
        resolve(argv, version, gpus, {})
    except SimError as err:
        return "rejected", err.exc_type
    except SystemExit:
        return "rejected", "ArgumentError"
    return "accepted", ""


@pytest.fixture(scope="module")
def real() -> dict[str, dict]:
    said = {}
    for version in sorted({c.version for c in CASES}):
        cases = [c for c in CASES if c.version == version]
        checks = [_oracle_args(c) for c in cases]
        said.update(zip([c.name for c in cases], sglang_oracle.answers(version, checks), strict=True))
    return said


def _oracle_args(case: Case) -> list[str]:
    return [*(["--resolve", "--gpu", case.gpu, "--tp", str(_tp(case.argv))] if case.resolve else []), "--", *case.argv]


def test_the_oracle_pool_answers_as_a_fresh_check_does(real: dict[str, dict]) -> None:
    """tests/oracle_pool.py forks one import for every check: its answer is the one `check` gives in a
    process of its own, a refusal and a resolution alike (only the timings differ)."""
    import subprocess

    resolved = [c for c in CASES if c.resolve and c.version == "0.5.11"]
    picked = [next(c for c in resolved if c.expect == e) for e in ("rejected", "accepted")]
    for case in picked:
        p = subprocess.run(
            [str(sglang_oracle.ORACLE / "check"), "--version", case.version, *_oracle_args(case)],
            capture_output=True, text=True, timeout=600, cwd=sglang_oracle.ORACLE,
        )  # fmt: skip
        fresh = json.loads(p.stdout.strip().splitlines()[-1])
        drop = ("timings", "stubs")
        assert {k: v for k, v in real[case.name].items() if k not in drop} == {
            k: v for k, v in fresh.items() if k not in drop
        }


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_simulator_agrees_with_the_real_parser(real: dict[str, dict], case: Case) -> None:
    verdict = real[case.name]
    assert verdict["verdict"] == case.expect, verdict.get("message")
    sim, sim_type = sim_verdict(case)
    assert sim == verdict["verdict"], f"real: {verdict.get('error_type')}: {verdict.get('message')}"
    if sim == "rejected":
        assert sim_type == verdict["error_type"]


def _choices(version: str, *flags: str) -> list[set[str]]:
    """The names the real parser of `version` accepts for each flag, read from its invalid-choice error."""
    import re

    said = sglang_oracle.answers(version, [["--", "--model-path", "/m", flag, "zz-no-such-parser"] for flag in flags])
    listed = [re.search(r"choose from (.*)\)", str(s["message"])) for s in said]
    assert all(listed), said
    return [set(re.findall(r"'([^']+)'", m.group(1))) for m in listed if m]


@pytest.mark.parametrize("version", ["0.5.11", "0.5.23"])
def test_every_parser_name_fleet_passes_is_one_the_real_sglang_accepts(version: str) -> None:
    from fleet.plan.parsers import FAMILIES, SGLANG_AUTO_FROM

    reasoning, tool_call = _choices(version, "--reasoning-parser", "--tool-call-parser")
    for row in FAMILIES:
        assert row.sglang[0] is None or row.sglang[0] in reasoning, (version, row.sglang)
        assert row.sglang[1] is None or row.sglang[1] in tool_call, (version, row.sglang)
    # `auto` is a choice exactly from the version fleet passes it to
    assert ("auto" in reasoning and "auto" in tool_call) == (parse_version(version) >= SGLANG_AUTO_FROM)


# Where each start-up line the simulator prints comes from, in the real sources of its version: the
# simulator's spellings are held to them, and fleet.startup reads both (tests/test_deploy_loop.py).
STARTUP_SOURCES = {
    "0.5.11": [
        ("srt/model_executor/model_runner.py", 'logger.info("Init torch distributed begin.")'),
        ("srt/model_executor/model_runner.py", 'f"Load weight begin. avail mem='),
        ("srt/utils/common.py", 'BAR_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} ['),
        ("srt/mem_cache/memory_pool.py", 'f"KV Cache is allocated. #tokens: {num_tokens}, K size: '),
        ("srt/model_executor/model_runner_kv_cache_mixin.py", 'f"Memory pool end. "'),
        ("srt/model_executor/model_runner.py", 'f"Capture {graph_backend[self.device]} begin. This can take up'),
        ("srt/model_executor/cuda_graph_runner.py", 'f"Capturing batches ({bs=} {avail_mem=:.2f} GB)"'),
    ],
    "0.5.23": [
        ("srt/distributed/bootstrap.py", 'logger.info("Init parallel begin.")'),
        ("srt/distributed/bootstrap.py", 'logger.info(f"Init parallel ends. elapsed='),
        ("srt/model_executor/model_runner.py", 'f"Load weight begin. avail mem='),
        ("srt/model_executor/model_runner.py", 'f"elapsed={self.weight_load_time:.2f} s, "'),
        ("srt/utils/common.py", 'BAR_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} ['),
        ("srt/mem_cache/kv_cache_configurator.py", 'f"Memory pool end. "'),
        (
            "srt/model_executor/model_runner_components/cuda_graph_setup.py",
            'f"Capture {capture_name} {graph_backend[model_runner.device]} begin. "',
        ),
        ("srt/model_executor/runner/decode_cuda_graph_runner.py", 'f"Capturing batches ({bs=} {avail_mem=:.2f} GB)"'),
    ],
}


def sglang_source(version: str) -> Path:
    sglang_oracle.require_oracle()
    venv = sglang_oracle.ORACLE / ".venv"
    layer = venv / "layers" / f"sglang-{version}" / "sglang"
    return layer if layer.is_dir() else next(venv.glob("lib/python3*/site-packages/sglang"))


@pytest.mark.parametrize("version", sorted(STARTUP_SOURCES))
def test_the_simulators_start_up_lines_are_the_real_versions_own(version: str) -> None:
    root = sglang_source(version)
    for path, said in STARTUP_SOURCES[version]:
        assert said in (root / path).read_text(), f"{version} {path}: {said}"
    if version == "0.5.23":  # what 0.5.11 printed is gone there: the simulator must not print it for 0.5.23
        everything = "".join(p.read_text() for p in (root / "srt").rglob("*.py"))
        assert "Init torch distributed begin" not in everything and 'f"KV Cache is allocated.' not in everything


@pytest.mark.parametrize("version", ["0.5.11", "0.5.23"])
def test_fleets_table_of_draft_models_is_the_real_sglangs(version: str) -> None:
    """fleet.plan.drafts against SGLang's own ModelConfig._config_draft_model, run on every architecture it
    names: the same draft class for each, and none for the rest (MiniMax-M2's among them)."""
    import subprocess

    from fleet.plan.drafts import sglang_draft
    from fleet.plan.types import Version

    sglang_oracle.require_oracle()
    oracle = sglang_oracle.ORACLE
    p = subprocess.run(
        [str(oracle / ".venv" / "bin" / "python"), str(ROOT / "tests" / "sglang_drafts.py"), str(oracle), version],
        capture_output=True, text=True, timeout=300, cwd=oracle,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    real = json.loads(p.stdout.strip().splitlines()[-1])["drafts"]
    v: Version = tuple(int(x) for x in version.split("."))  # type: ignore[assignment]
    for target, drafted in real.items():
        if drafted.startswith("error"):  # a branch the stand-in cannot run: fleet's row comes from the source
            assert sglang_draft(target, v) is not None, target
        else:
            assert sglang_draft(target, v) == drafted, target
    assert sglang_draft("MiniMaxM2ForCausalLM", v) is None and "MiniMaxM2ForCausalLM" not in real
    from fleet.plan.drafts import SGLANG_DRAFTS

    [table] = [rows for (lo, hi), rows in SGLANG_DRAFTS if lo <= v <= hi]
    assert set(table) == set(real)  # nothing in fleet's table that SGLang does not map
    # and the architectures SGLang pools sliding layers apart for (fit's KV count): exactly fleet's
    from fleet.plan.memory import SGLANG_SWA_0511, SGLANG_SWA_0523, sglang_pools_sliding

    swa = set(json.loads(p.stdout.strip().splitlines()[-1])["swa"])
    assert swa == (SGLANG_SWA_0511 if version == "0.5.11" else SGLANG_SWA_0523)
    assert "GptOssForCausalLM" in swa and all(sglang_pools_sliding(a, v) for a in swa)
