"""Host facts + inventory host + playbook → ModelSpec, LaunchPlan and pre-flight verdicts. Pure.

Pre-flight refuses, before anything on the host is stopped: a quantization the GPU cannot run in this
engine version, weights that do not fit, an impossible TP, a missing engine or model, a port held by
something fleet may not stop, and a log disk that is full.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from fleet import __version__
from fleet.crashes import Signature, builtin_signatures, known_fixes
from fleet.facts import HostFacts, ModelFiles, gpu_mismatches
from fleet.facts.parse import EngineInstall
from fleet.host_common import container_owner
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
    choose_tp,
    parse_version,
    plan_launch,
    show_version,
)
from fleet.plan.capabilities import capability
from fleet.plan.container import CONTAINER_PYTHON, ContainerPlan, container_plan, model_mount_path
from fleet.plan.fit import GIB, budget, kv_bytes_per_token
from fleet.plan.memory import MemoryWishes
from fleet.plan.picks import told_picks

# Headroom rule: weights may take at most this share of each GPU's memory (or of mem_fraction when set,
# less 2 GiB); the rest is KV cache, activations and CUDA graphs. A tighter fit starts, then OOMs.
MIN_LOG_DISK_BYTES = 200 << 20
MIN_STATE_DISK_BYTES = 16 << 20  # state, lock and learned fixes: kilobytes, with room to spare


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


def _err(rule: str, message: str) -> Verdict:
    return Verdict("error", rule, message)


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
                f"{where}: the model in {model_path} is not whole: {'; '.join(m.damage)}. Download or copy "
                "those files again; nothing on the host was changed.",
            )
        )
    try:
        return spec_of(model_path, m), verdicts
    except ModelConfigError as exc:
        verdicts.append(
            _err(
                "model-gguf",
                f"{where}: {model_path} is a GGUF checkpoint ({', '.join(m.gguf)}), with no config.json: fleet "
                "plans from a Hugging Face checkpoint (config.json and safetensors) and does not plan GGUF yet "
                "(SGLang loads one with --load-format gguf, on CUDA only). Point model: at the original "
                "checkpoint; nothing on the host was changed.",
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


def _count_of(plan: LaunchPlan, sglang: str, vllm: str) -> int:
    """The number a plan's flag gives (either engine's spelling), else 1."""
    f = plan.flag(sglang) or plan.flag(vllm)
    return int(f.value) if f and f.value and f.value.isdigit() else 1


def _dp_of(plan: LaunchPlan) -> int:
    return _count_of(plan, "--dp-size", "--data-parallel-size") or 1


def _tp_of(plan: LaunchPlan) -> int:
    return _count_of(plan, "--tp-size", "--tensor-parallel-size")


def memory_wishes(plan: LaunchPlan, tp: int) -> MemoryWishes:
    """What the command line sets that SGLang's memory heuristic reads (fleet.plan.memory)."""

    def number(*flags: str) -> int | None:
        found = next((f for f in (plan.flag(name) for name in flags) if f is not None and f.value), None)
        return int(str(found.value)) if found is not None and re.fullmatch(r"-?\d+", str(found.value)) else None

    dp = number("--dp-size", "--data-parallel-size") or 1
    return MemoryWishes(
        tp=tp,
        speculative=plan.flag("--speculative-algorithm") is not None,
        chunked_prefill_size=number("--chunked-prefill-size"),
        cuda_graph_max_bs=number("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"),
        max_running_requests=number("--max-running-requests"),
        max_prefill_tokens=number("--max-prefill-tokens") or 16384,
        dp_attention_size=dp if plan.flag("--enable-dp-attention") is not None else 0,
    )


def preflight(
    where: str, plan: LaunchPlan, model: ModelSpec, gpus: GpuSummary, facts: HostFacts, host: Host
) -> list[Verdict]:
    out: list[Verdict] = []
    v = plan.engine_version
    cc = f"{gpus.sm // 10}.{gpus.sm % 10}"
    # quantised checkpoints the GPU cannot run, or runs only through a fallback (fleet.plan.capabilities)
    row = capability(plan.engine, model.checkpoint_format, model.moe, gpus.sm, v, tuple(plan.argv()))
    if row is not None:
        said = f"{where}: {row.why}; {gpus.name} is {cc}, {plan.engine} {show_version(v)} [{row.source}]."
        out.append(
            _err("quant-capability", said) if row.verdict == "refused" else Verdict("warning", "quant-capability", said)
        )
    tp, dp = _tp_of(plan), _dp_of(plan)
    if tp * dp > gpus.count:
        replicas = f" x {dp} data-parallel replicas" if dp > 1 else ""
        out.append(
            _err(
                "tp",
                f"{where}: TP {tp}{replicas} exceeds the deployment's {gpus.count} GPUs. Lower tp: or give it "
                "more GPUs.",
            )
        )
    if model.num_attention_heads and model.num_attention_heads % tp:
        out.append(
            _err(
                "tp",
                f"{where}: TP {tp} does not divide the {model.num_attention_heads} attention heads. Use a divisor.",
            )
        )
    out += _fit_refusal(where, plan, model, gpus, tp)
    out += _port_refusals(where, plan, facts, host)
    out += _disk_refusals(where, facts, host)
    out += facts_warnings(host, facts)
    out += _foreign_gpu_memory(where, gpus, facts, host)
    return out


def _fit_refusal(where: str, plan: LaunchPlan, model: ModelSpec, gpus: GpuSummary, tp: int) -> list[Verdict]:
    """Weights and one prefill step's KV cache within what the engine gives itself of each GPU."""
    out: list[Verdict] = []
    if model.weights_bytes and tp <= gpus.count:
        per_gpu_mib = model.weights_bytes / tp / (1 << 20)
        frac_flag = plan.flag("--mem-fraction-static") or plan.flag("--gpu-memory-utilization")
        fraction = float(frac_flag.value) if frac_flag and frac_flag.value else None
        wished = memory_wishes(plan, tp)
        room = budget(model, gpus.memory_mib, fraction, plan.engine, plan.engine_version, wished)
        per_token = kv_bytes_per_token(model, tp, None, model.mtp_layers if wished.speculative else 0) or 0
        step = room.prefill_tokens  # SGLang's own budget stops the engine without room for one prefill step
        needed = per_gpu_mib * (1 << 20) + step * per_token
        if needed > room.bytes:
            cache = f" and the KV cache of one {step}-token prefill step" if step else ""
            out.append(
                _err(
                    "fit",
                    f"{where}: weights need {per_gpu_mib / 1024:.1f} GiB per GPU at TP {tp}{cache}, more than "
                    f"{room.bytes / GIB:.1f} GiB ({room.rule}; {gpus.memory_mib / 1024:.1f} GiB per GPU): the "
                    "engine would stop at load. Use more GPUs or a smaller/quantized checkpoint.",
                )
            )
    return out


def _port_refusals(where: str, plan: LaunchPlan, facts: HostFacts, host: Host) -> list[Verdict]:
    """The plan's ports held by something fleet does not stop: fleet stops engine servers, never anything else."""
    out: list[Verdict] = []
    nccl = plan.flag("--nccl-port")
    planned = [(plan.port, host.settings.bind_address, "port")]
    # checked like the HTTP port, on the server's address (torch listens on every address: a listener on
    # another address of the host is found at launch, as the port-in-use crash)
    planned += [(int(str(nccl.value)), host.settings.bind_address, "NCCL port")] if nccl is not None else []
    server_pids = {p.pid for p in facts.servers}
    for port, address, what in planned:
        holder = facts.port_holder(port, address)
        if holder is not None and holder.pid not in server_pids:
            who = f"pid {holder.pid}" if holder.pid else "a process fleet cannot see (another user?)"
            out.append(
                _err(
                    "port-held",
                    f"{where}: {what} {port} is held by {who}, which is not an inference "
                    "server fleet may stop. Stop it or choose another port: in the playbook.",
                )
            )
    return out


def _disk_refusals(where: str, facts: HostFacts, host: Host) -> list[Verdict]:
    out: list[Verdict] = []
    for setting, what, need in (
        (host.settings.log_dir, "logs", MIN_LOG_DISK_BYTES),
        (host.settings.state_dir, "fleet's state", MIN_STATE_DISK_BYTES),
    ):
        suffix = setting.removeprefix("~")  # the probe reports ~/ paths expanded
        disk = next((d for d in facts.disks if d.path.endswith(suffix)), None)
        if disk and disk.free_bytes is not None and disk.free_bytes < need:
            out.append(
                _err(
                    "disk-full",
                    f"{where}: only {disk.free_bytes >> 20} MiB free for {what} in {disk.path} (fleet needs "
                    f"{need >> 20} MiB before it stops anything). Free disk space there first.",
                )
            )
    return out


def _foreign_gpu_memory(where: str, gpus: GpuSummary, facts: HostFacts, host: Host) -> list[Verdict]:
    out: list[Verdict] = []
    # memory on the deployment's GPUs that no engine of fleet's user holds: the fit above assumed it free
    engines = {p.pid for p in facts.servers if p.uid == facts.uid}
    for g in facts.gpus:
        if gpus.indices and g.index not in gpus.indices:
            continue
        others = [p for p in g.processes if p.pid not in engines and p.used_mib > 1024]
        if others:
            used = sum(p.used_mib for p in others) / 1024
            pids = ", ".join(str(p.pid) for p in others)
            out.append(
                Verdict(
                    "warning",
                    "gpu-memory-used",
                    f"{where}: GPU {g.index} has {used:.1f} GiB in use by pid {pids}, not an engine fleet stops; "
                    + (
                        "fleet kills it (kill_policy: force)."
                        if host.settings.kill_policy == "force"
                        else "the launch is refused while it runs (or pass --force)."
                    ),
                )
            )
    return out


def facts_warnings(host: Host, facts: HostFacts) -> list[Verdict]:
    """The inventory's expected_gpus against what the host reports, as pre-flight warnings."""
    return [
        Verdict("warning", "expected-gpus", f"{host.name}: {m.message}.")
        for m in gpu_mismatches(host.settings.expected_gpus, facts.gpus)
    ]


__all__ = ["PlanResult", "build_plan", "choose_tp", "gpu_summary", "learned_fixes", "wishes_for"]
