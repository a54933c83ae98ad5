"""Host facts + inventory host + playbook → ModelSpec, LaunchPlan and pre-flight verdicts. Pure.

Refused here before anything on the host is stopped: a missing engine or model, a damaged or GGUF
checkpoint, a container runtime that cannot run the image; the rest of pre-flight: fleet.plan.preflight.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from fleet import __version__
from fleet.crashes import Signature, builtin_signatures, known_fixes
from fleet.facts import HostFacts, ModelFiles
from fleet.facts.parse import EngineInstall
from fleet.host.common import container_owner
from fleet.inventory import Host, NamedPlaybook
from fleet.inventory.runtime import Container, chosen_runtime
from fleet.model import ModelConfigError, ModelSpec, parse_model_spec
from fleet.plan import (
    GpuSummary,
    LaunchPlan,
    LearnedFix,
    Verdict,
    Version,
    Wishes,
    parse_version,
    plan_launch,
    show_version,
    weight_cache,
)
from fleet.plan.container import CONTAINER_PYTHON, ContainerPlan, container_plan, model_mount_path
from fleet.plan.picks import told_picks
from fleet.plan.preflight import _err, memory_need_mib, preflight
from fleet.terminal import safe_line


def gpu_summary(facts: HostFacts, indices: Sequence[int] | None = None) -> GpuSummary | None:
    """The deployment's GPUs (`indices`; all of the host's when None) as the planner sees them. Only a
    placement asked for is written into the launch (CUDA_VISIBLE_DEVICES): a server placed on all GPUs
    runs exactly the command line fleet ran before placements existed, so it is still adopted."""
    gpus = [g for g in facts.gpus if indices is None or g.index in indices]
    if not gpus:
        return None
    g = gpus[0]
    return GpuSummary(
        g.name,
        len(gpus),
        g.sm,
        min(x.memory_total_mib for x in gpus),
        all(x.nvlink for x in gpus),
        tuple(x.index for x in gpus) if indices is not None else (),
    )


def learned_key(host: str, model_path: str, engine: str, version: Version | None, gpu: str) -> str:
    """What a learned fix is kept for: host x model x engine version x GPU model (a fix for one board's
    GPUs says nothing about another's: a host's cards can be swapped, a deployment's set differs)."""
    return f"{host}|{model_path}|{engine}|{show_version(version)}|{gpu}"


def learned_fixes(facts: HostFacts, key: str, signatures: Sequence[Signature] | None = None) -> tuple[LearnedFix, ...]:
    """The host's learned fixes for `key`, re-validated against today's knowledge base (`signatures`; the
    built-in one when None). The host's record names a signature; what is applied is the fix the
    knowledge base prescribes for it now. An entry whose signature is unknown, or no longer carries a
    fix, is dropped: state.json is a file on the host, and anything can be written into it."""
    known = known_fixes(builtin_signatures() if signatures is None else signatures)
    table = facts.remote.learned or {}
    # fleet before deployments kept them without the GPU model: read as this GPU model's
    older = key.rsplit("|", 1)[0] if key.count("|") == 4 else None
    entries = (table.get(key) or (table.get(older) if older else None) or []) if isinstance(table, dict) else []
    out: list[LearnedFix] = []
    for e in entries:
        try:
            signature = str(e["signature"])
            learned_at = str(e.get("learned_at", "?"))
        except (KeyError, TypeError):
            continue  # a damaged entry is ignored, never fatal
        if signature in known and signature not in {x.signature for x in out}:
            out.append(LearnedFix(signature, known[signature], learned_at))
    return tuple(out)


ENGINE_PICKS = "engine-picks"  # the learned entry that holds what the engine's check said it picks itself


def learned_picks(facts: HostFacts, key: str) -> dict[str, str]:
    """What the engine's check on this host said it picks itself (fleet.plan.picks), learned under `key`
    (the same model, engine version and GPU model) when it differed from fleet's table. Only the settings
    fleet's keyed rules decide on, as short words: the host's file may hold anything."""
    table = facts.remote.learned or {}
    entries = table.get(key) if isinstance(table, dict) else None
    for e in entries if isinstance(entries, list) else []:
        said = e.get("picks") if isinstance(e, dict) and e.get("signature") == ENGINE_PICKS else None
        if isinstance(said, dict):
            return told_picks(said)
    return {}


def wishes_for(host: Host, playbook: NamedPlaybook) -> Wishes:
    pb = playbook.spec
    spec = pb.speculative
    return Wishes(
        engine=pb.engine,
        served_name=pb.served_name,
        port=pb.port,
        bind_address=host.settings.bind_address,
        speculative=bool(spec and spec.enabled),
        speculative_steps=spec.steps if spec else 1,
        speculative_topk=spec.topk if spec else 1,
        context_length=pb.context_length,
        mem_fraction=pb.mem_fraction,
        tp=pb.tp,
        extra_args=tuple(pb.extra_args),
        env=tuple(sorted(pb.env.items())),
        secret_env=tuple(dict.fromkeys([*pb.secret_env, *([pb.api_key_env] if pb.api_key_env else [])])),
        api_key_env=pb.api_key_env,
        literal=pb.literal,
        trust_remote_code=pb.trust_remote_code,
        parsers=pb.parsers if isinstance(pb.parsers, str | None) else (pb.parsers.reasoning, pb.parsers.tool_call),
        weight_cache=pb.weight_cache,
    )


@dataclass(frozen=True)
class PlanResult:
    plan: LaunchPlan | None
    model: ModelSpec | None
    gpus: GpuSummary | None
    wishes: Wishes
    learned_key: str
    verdicts: tuple[Verdict, ...]  # pre-flight + plan verdicts

    @property
    def errors(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.level == "error"]


def spec_of(model_path: str, m: ModelFiles) -> ModelSpec:
    """The model as the probe read its directory; ModelConfigError when its config cannot describe one."""
    return parse_model_spec(
        model_path, m.config, m.quant_config, m.weights_bytes, m.mtp_weight_layers, m.sentence_transformers
    )


def model_spec(facts: HostFacts, model_path: str) -> ModelSpec | None:
    """The model at the path as the probe read it, or None (missing, or a config pre-flight refuses)."""
    m = facts.model
    if m is None or not m.exists:
        return None
    try:
        return spec_of(model_path, m)
    except ModelConfigError:
        return None


def _install_refusals(where: str, engine: str, install: EngineInstall | None, version: Version | None) -> list[Verdict]:
    if install is None:
        return [
            _err(
                "engine-missing",
                f"{where}: no {engine} environment in the inventory (engines: {engine}: /path/to/python).",
            )
        ]
    if install.error or version is None:
        return [
            _err(
                "engine-missing",
                f"{where}: {engine} is not installed in {install.python} "
                f"({install.error or 'version unknown'}). Install it or fix engines: in the inventory.",
            )
        ]
    return []


def _read_model(where: str, model_path: str, m: ModelFiles | None) -> tuple[ModelSpec | None, list[Verdict]]:
    """The model as the host's files describe it, or why there is none to plan (missing, damaged, GGUF, a
    config fleet cannot read); a damaged one is refused and still read, so the plan shows what it is."""
    if m is None or not m.exists:
        return None, [
            _err(
                "model-missing",
                f"{where}: model directory {model_path} does not exist on the host. "
                "Copy the model there, fix model: in the playbook, or give hf_repo: and run fleet pull.",
            )
        ]
    verdicts: list[Verdict] = []
    if m.damage:  # found out at load time, the running server would already be stopped
        verdicts.append(
            _err(
                "model-damaged",
                f"{where}: the model in {model_path} is not whole: {'; '.join(map(safe_line, m.damage))}. "
                "Download or copy those files again; nothing on the host was changed.",
            )
        )
    try:
        return spec_of(model_path, m), verdicts
    except ModelConfigError as exc:
        verdicts.append(
            _err(
                "model-gguf",
                f"{where}: {model_path} is a GGUF checkpoint ({', '.join(map(safe_line, m.gguf))}), with no "
                "config.json: fleet plans from a Hugging Face checkpoint (config.json and safetensors) and does "
                "not plan GGUF yet (SGLang loads one with --load-format gguf, on CUDA only). Point model: at the "
                "original checkpoint; nothing on the host was changed.",
            )
            if m.gguf
            else _err("model-config", f"{where}: {exc}{' (' + m.config_error + ')' if m.config_error else ''}.")
        )
        return None, verdicts


def build_plan(
    host: Host,
    playbook: NamedPlaybook,
    facts: HostFacts,
    model_path: str,
    signatures: Sequence[Signature] | None = None,
    gpu_indices: Sequence[int] | None = None,
    port: int | None = None,
    deployment: str | None = None,
    nodes: int = 1,
    told: Mapping[str, str] | None = None,
    dp: int = 1,
) -> PlanResult:
    """`dp`: data-parallel replicas over the placement's GPUs, each a TP group (fleet.plan.whole_box).
    `told`: the engine's own picks its check on the host said (fleet.plan.picks); None: those the host
    has learned for this model, engine version and GPU model, except for a group, whose ranks all plan on
    fleet's table alone (they must run one command line).
    `gpu_indices`: the deployment's placement (fleet.plan.placement); all of the host's GPUs when None.
    `nodes`: the hosts of a group this host is one of, each with as many GPUs (fleet.plan.group); the plan
    is the group's, over all of their GPUs.
    `port`: the port placement chose when the playbook's belongs to another deployment there.
    `deployment`: its name on the host (the playbook's by default); a container is named after it."""
    pb = playbook.spec
    runtime = chosen_runtime(pb.runtime, host.settings.runtime)
    where = f"{playbook.name} on {host.name}"
    wishes = replace(wishes_for(host, playbook), dp=dp)
    if port is not None:
        wishes = replace(wishes, port=port)
    install = facts.engines.get(pb.engine)
    version = parse_version(install.version) if install else None
    verdicts = _install_refusals(where, pb.engine, install, version)
    gpus = gpu_summary(facts, gpu_indices)
    if gpus is not None and nodes > 1:  # between hosts there is a network, never NVLink
        gpus = replace(gpus, count=gpus.count * nodes, nvlink=False)
    if gpus is None:
        verdicts.append(
            _err("no-gpus", f"{where}: no GPUs found ({facts.gpu_error or 'NVML and nvidia-smi report none'}).")
        )
    model, refused = _read_model(where, model_path, facts.model)
    verdicts += refused
    key = learned_key(host.name, model_path, pb.engine, version, gpus.name if gpus else "")
    container: ContainerPlan | None = None
    if runtime is not None:
        verdicts += container_preflight(where, runtime, facts)
        container = _container_plan(runtime, playbook, facts, host, model_path, gpu_indices, deployment)
    if model is None or gpus is None or install is None or (runtime is not None and container is None):
        return PlanResult(None, model, gpus, wishes, key, tuple(verdicts))
    plan = plan_launch(
        model=replace(model, path=model_mount_path(model_path)) if container else model,
        gpus=gpus,
        engine_version=version,
        python=CONTAINER_PYTHON if container else install.python,
        wishes=wishes,
        learned=learned_fixes(facts, key, signatures),
        told=told if told is not None else ({} if nodes > 1 else learned_picks(facts, key)),
    )
    plan = replace(plan, container=container)
    verdicts += preflight(where, plan, model, gpus, facts, host)
    if wishes.weight_cache:
        verdicts += weight_cache.refusals(where, model, plan)
    plan = replace(plan, memory_mib=gpus.memory_mib, need_mib=memory_need_mib(plan, model, gpus))
    plan = replace(plan, verdicts=(*plan.verdicts, *verdicts))
    return PlanResult(plan, model, gpus, wishes, key, plan.verdicts)


def _container_plan(
    runtime: Container,
    playbook: NamedPlaybook,
    facts: HostFacts,
    host: Host,
    model_path: str,
    gpu_indices: Sequence[int] | None,
    deployment: str | None,
) -> ContainerPlan | None:
    """The container's `run`, or None when the host cannot run it (container_preflight says why)."""
    c = facts.container
    if c is None or c.cli is None or c.gpu_access is None or "log_dir" not in facts.paths:
        return None
    name = deployment or playbook.name
    state_dir = facts.paths.get("state_dir", host.settings.state_dir)
    return container_plan(
        runtime,
        deployment=name,
        playbook=playbook.name,
        model_host_path=facts.model.path if facts.model else model_path,  # ~/ expanded by the probe
        gpu_access=c.gpu_access,
        gpu_indices=gpu_indices,
        device_files=facts.device_files,
        log_dir=facts.paths["log_dir"],
        secrets_dir=posixpath.join(state_dir, "deployments", name, "secrets"),
        hf_cache=c.hf_cache,
        fleet_version=__version__,
        owner=container_owner(facts.uid, state_dir),
        image_id=c.image_id or "",
    )


def container_preflight(where: str, runtime: Container, facts: HostFacts) -> list[Verdict]:
    """What refuses a container deployment before anything on the host is stopped (scale-out.md section 2:
    the runtime, the GPU runtime, the image and its CUDA against the host's driver)."""
    c = facts.container
    cli = runtime.container
    if c is None or c.cli is None:
        why = c.error if c is not None and c.error else f"{cli} is not installed"
        return [_err("container-runtime", f"{where}: {why}. Install {cli} on the host, or use runtime: process.")]
    out: list[Verdict] = []
    if c.gpu_access is None:
        out.append(
            _err(
                "container-gpus",
                f"{where}: a container on this host would see no GPU: neither a CDI spec for nvidia.com/gpu "
                f"(/etc/cdi) nor docker's nvidia runtime is there (docker says: could not select device driver "
                '"" with capabilities: [[gpu]]). Install the NVIDIA Container Toolkit and run '
                "`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`.",
            )
        )
    if not c.image_present:
        how = (
            f"pull: never. Run `{cli} pull {runtime.image}` there (or load it), or set pull: missing"
            if runtime.pull == "never"
            else f"`fleet deploy` pulls it first (pull: {runtime.pull}); if that failed, its output says why"
        )
        out.append(_err("image-missing", f"{where}: image {runtime.image} is not on the host; {how}."))
    needs, has = parse_version(c.image_cuda), parse_version(facts.cuda_version)
    if needs is not None and has is not None and needs[:2] > has[:2]:
        out.append(
            _err(
                "image-cuda",
                f"{where}: image {runtime.image} is built for CUDA {show_version(needs)[:-2]}, newer than the "
                f"{show_version(has)[:-2]} the host's driver {facts.driver_version or ''} supports "
                f"(nvidia-container-cli: requirement error: unsatisfied condition: cuda>={show_version(needs)[:-2]}). "
                "Pick an image built for an older CUDA (e.g. a -cu12x tag) or upgrade the driver.",
            )
        )
    return out


__all__ = ["PlanResult", "build_plan", "gpu_summary", "learned_fixes", "wishes_for"]
