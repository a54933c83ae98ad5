"""Pre-flight: what refuses a plan before anything on the host is stopped. Pure.

A quantization the GPU cannot run in this engine version, weights that do not fit, an impossible TP, a
port held by something fleet may not stop, a full log or state disk; and warnings: GPU memory others
hold, a host short of memory or GPUs.
"""

from __future__ import annotations

import re

from fleet.facts import HostFacts, gpu_mismatches
from fleet.inventory import Host
from fleet.model import ModelSpec
from fleet.plan import GpuSummary, LaunchPlan, Verdict, show_version
from fleet.plan.capabilities import capability
from fleet.plan.fit import GIB, Budget, budget, kv_bytes_per_token
from fleet.plan.memory import MemoryWishes
from fleet.plan.placement import daemon_pids

MIN_LOG_DISK_BYTES = 200 << 20
MIN_STATE_DISK_BYTES = 16 << 20  # state, lock and learned fixes: kilobytes, with room to spare


def _err(rule: str, message: str) -> Verdict:
    return Verdict("error", rule, message)


def _count_of(plan: LaunchPlan, sglang: str, vllm: str) -> int:
    """The number a plan's flag gives (either engine's spelling), else 1."""
    f = plan.flag(sglang) or plan.flag(vllm)
    return int(f.value) if f and f.value and f.value.isdigit() else 1


def _dp_of(plan: LaunchPlan) -> int:
    return _count_of(plan, "--dp-size", "--data-parallel-size") or 1


def tp_of(plan: LaunchPlan) -> int:
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
    tp, dp = tp_of(plan), _dp_of(plan)
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


def _room_and_need(plan: LaunchPlan, model: ModelSpec, gpus: GpuSummary, tp: int) -> tuple[Budget, float, int]:
    """What the engine gives itself of each GPU, what the weights and one prefill step's KV cache need of
    it (bytes), and that step's tokens."""
    frac_flag = plan.flag("--mem-fraction-static") or plan.flag("--gpu-memory-utilization")
    fraction = float(frac_flag.value) if frac_flag and frac_flag.value else None
    wished = memory_wishes(plan, tp)
    room = budget(model, gpus.memory_mib, fraction, plan.engine, plan.engine_version, wished)
    draft = model.mtp_layers if wished.speculative else 0
    per_token = kv_bytes_per_token(model, tp, None, draft, plan.engine, plan.engine_version, gpus.sm) or 0
    step = room.prefill_tokens  # fleet's margin under SGLang's budget: room for one prefill step (fit.Budget)
    return room, (model.weights_bytes or 0) / tp + step * per_token, step


def memory_need_mib(plan: LaunchPlan, model: ModelSpec, gpus: GpuSummary) -> int | None:
    """What each GPU must hold for the plan beside the cache's growth, in MiB, for the act step to hold to
    the memory fraction the engine itself resolves there (SGLang; None: not known, or another engine)."""
    tp = tp_of(plan)
    if plan.engine != "sglang" or not model.weights_bytes or tp > gpus.count:
        return None
    return int(_room_and_need(plan, model, gpus, tp)[1]) >> 20


def _fit_refusal(where: str, plan: LaunchPlan, model: ModelSpec, gpus: GpuSummary, tp: int) -> list[Verdict]:
    """Weights and one prefill step's KV cache within what the engine gives itself of each GPU."""
    out: list[Verdict] = []
    if model.weights_bytes and tp <= gpus.count:
        per_gpu_mib = model.weights_bytes / tp / (1 << 20)
        room, needed, step = _room_and_need(plan, model, gpus, tp)
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
    for r in facts.remote.deployments.values():  # fleet's weight cache daemons too
        engines |= daemon_pids(facts, r.recorded)
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
