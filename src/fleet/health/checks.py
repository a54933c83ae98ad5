"""Health verdicts: the raw answer of one host's health probe → checks with Nagios-style statuses. Pure.

Also renders the Prometheus text format for node_exporter's textfile collector. The probe itself
(`fleet/control/remote_health.py`) runs on the host; the caller does I/O and healing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleet.crashes import Diagnosis
from fleet.facts import HostFacts, gpu_mismatches

if TYPE_CHECKING:
    from fleet.inventory import ExpectedGpus

OK, WARNING, CRITICAL, UNKNOWN = "ok", "warning", "critical", "unknown"
SEVERITY = {OK: 0, WARNING: 1, CRITICAL: 2, UNKNOWN: 3}
EXIT_CODE = {OK: 0, WARNING: 1, CRITICAL: 2, UNKNOWN: 3}

# NVIDIA Xid catalogue (docs.nvidia.com/deploy/xid-errors): the ones worth a name.
XID_MEANING = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    32: "invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement / row remapping recorded",
    64: "ECC page retirement / row remapping failure",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
# Hardware-class: relaunching the engine cannot fix these; they are reported, never healed.
HARDWARE_XIDS = {48, 64, 74, 79, 92, 95, 119, 120}
XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([^)]*)\): (\d+)")
THROTTLE_BAD = {
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "power brake",
}


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    hardware: bool = False


@dataclass(frozen=True)
class HostHealth:
    host: str
    status: str
    checks: tuple[Check, ...]
    server_up: bool = False
    playbook: str | None = None
    gpus: tuple[dict[str, Any], ...] = ()
    duration_s: float = 0.0
    heal: str | None = None  # what healing did, when asked
    healable: bool = False

    @property
    def hardware_fault(self) -> bool:
        return any(c.hardware and c.status == CRITICAL for c in self.checks)

    def problems(self) -> list[Check]:
        return sorted((c for c in self.checks if c.status != OK), key=lambda c: -SEVERITY[c.status])

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "status": self.status,
            "server_up": self.server_up,
            "playbook": self.playbook,
            "healable": self.healable,
            "heal": self.heal,
            "duration_s": round(self.duration_s, 3),
            "checks": [
                {"name": c.name, "status": c.status, "detail": c.detail, "hardware": c.hardware} for c in self.checks
            ],
            "gpus": list(self.gpus),
        }


def worst(statuses: Sequence[str]) -> str:
    return max(statuses, key=lambda s: SEVERITY[s], default=OK)


def unreachable(host: str, reason: str, status: str = UNKNOWN, duration_s: float = 0.0) -> HostHealth:
    return HostHealth(host, status, (Check("ssh", status, reason),), duration_s=duration_s)


def step_failed(host: str, reason: str, duration_s: float = 0.0) -> HostHealth:
    """The host answered and fleet's probe failed there (no Python, a crash): unknown, under its own check."""
    return HostHealth(host, UNKNOWN, (Check("host_step", UNKNOWN, reason),), duration_s=duration_s)


def check_failed(host: str, reason: str, duration_s: float = 0.0) -> HostHealth:
    """fleet itself failed while checking this host (a bug, not the host's state): unknown, never healed."""
    return HostHealth(host, UNKNOWN, (Check("fleet", UNKNOWN, reason),), duration_s=duration_s)


def _tp(argv: Sequence[str]) -> int:
    for flag in ("--tp-size", "--tp", "--tensor-parallel-size", "-tp"):
        if flag in argv and argv.index(flag) + 1 < len(argv):
            value = argv[argv.index(flag) + 1]
            if value.isdigit():
                return int(value)
    return 1


def evaluate(
    host: str,
    raw: dict[str, Any],
    facts: HostFacts,
    diagnosis: Diagnosis | None,
    duration_s: float = 0.0,
    expected_gpus: ExpectedGpus | None = None,
) -> HostHealth:
    checks: list[Check] = [Check("ssh", OK, "reachable")]
    st = facts.remote.state if isinstance(facts.remote.state, dict) else {}
    server = raw.get("server")
    http = raw.get("http") or {}
    status = st.get("status")
    # host resources
    cpus = facts.raw.get("cpu_count") or 1
    if facts.load:
        per_cpu = facts.load[0] / cpus
        checks.append(Check("load", WARNING if per_cpu > 2 else OK, f"load {facts.load[0]:.2f} on {cpus} CPUs"))
    if facts.mem_available_kib is not None and facts.raw.get("mem_total_kib"):
        share = facts.mem_available_kib / facts.raw["mem_total_kib"]
        checks.append(Check("memory", WARNING if share < 0.05 else OK, f"{share:.0%} of RAM available"))
    for d in facts.disks:
        if d.free_bytes is not None:
            s = CRITICAL if d.free_bytes < (1 << 30) else OK
            checks.append(Check(f"disk {d.path}", s, f"{d.free_bytes / (1 << 30):.1f} GiB free"))
    ooms = [line for line in raw.get("kernel", []) if "Out of memory: Killed" in line or "oom-kill" in line]
    if ooms:
        checks.append(
            Check("oom_killer", WARNING, f"{len(ooms)} OOM-killer event(s) since the last check: {ooms[-1][-160:]}")
        )
    if facts.remote.errors:  # e.g. edited by hand, or a disk that failed mid-write
        checks.append(Check("fleet_state", WARNING, "unreadable on the host: " + "; ".join(facts.remote.errors)))
    # the server
    if not st and facts.remote.state_error:
        checks.append(Check("server", WARNING, "the deployment record is unreadable: what should run is unknown"))
    elif not st:
        checks.append(Check("server", OK, "no fleet deployment recorded"))
    elif status == "stopped":
        checks.append(Check("server", OK, "stopped by an operator"))
    elif status == "failed":
        checks.append(Check("server", CRITICAL, f"last deploy failed: {st.get('reason', '?')}"))
    elif server is None or not server.get("alive"):
        checks.append(Check("server", CRITICAL, f"server process {st.get('pid')} is gone"))
    else:
        if status == "unverified":  # launched, then fleet's run ended before it proved the server
            checks.append(Check("server", WARNING, f"pid {server['pid']} alive, unverified: {st.get('reason', '?')}"))
        else:
            checks.append(Check("server", OK, f"pid {server['pid']} alive"))
        if server.get("drift"):
            checks.append(Check("drift", WARNING, "the running command line differs from the recorded plan"))
        port = server.get("port")
        owned = port in server.get("ports", [])
        checks.append(
            Check("port", OK if owned else CRITICAL, f"port {port} {'owned' if owned else 'NOT held'} by the server")
        )
        h = http.get("health") or {}
        checks.append(
            Check(
                "http_health",
                OK if h.get("status") == 200 else CRITICAL,
                f"/health {h.get('status')} in {h.get('seconds', 0):.2f}s",
            )
        )
        m = http.get("models") or {}
        served = st.get("served_name")
        checks.append(
            Check("models", OK if served in m.get("ids", []) else WARNING, f"/v1/models lists {m.get('ids')}")
        )
        g = http.get("generation") or {}
        if "skipped" in g:
            checks.append(Check("generation", OK, f"skipped ({g['skipped']})"))
        elif g:
            ok = g.get("ok")
            detail = (
                f"answer {g.get('text', '')[:80]!r} in {g.get('seconds', 0):.2f}s"
                if g.get("status") == 200
                else f"HTTP {g.get('status')}: {str(g.get('text', ''))[:120]}"
            )
            checks.append(
                Check("generation", OK if ok else CRITICAL, detail if ok else f"wrong or no answer: {detail}")
            )
    if diagnosis is not None and diagnosis.category not in ("healthy", "starting"):
        checks.append(
            Check(
                "crash_log",
                CRITICAL,
                f"{diagnosis.category} ({diagnosis.signature}) in the server log: "
                f"{(diagnosis.evidence or ('',))[0][:160]}",
            )
        )
    # GPUs
    alive = bool(server and server.get("alive"))
    tp = _tp((st.get("plan") or {}).get("argv") or []) if status in ("ready", "starting", "unverified") and alive else 0
    server_pids = set(server.get("group_pids", [])) if server else set()
    gpus = []
    for g in facts.gpus:
        gpus.append(
            {
                "index": g.index,
                "name": g.name,
                "memory_used_mib": g.memory_used_mib,
                "memory_total_mib": g.memory_total_mib,
                "temperature_c": g.temperature_c,
            }
        )
        if g.ecc_uncorrected:
            checks.append(
                Check(f"gpu{g.index} ecc", CRITICAL, f"{g.ecc_uncorrected} uncorrected ECC errors", hardware=True)
            )
        if g.retired_pages_pending:
            checks.append(
                Check(f"gpu{g.index} retired_pages", CRITICAL, "page retirement pending (reset the GPU)", hardware=True)
            )
        if g.row_remap_pending:
            checks.append(
                Check(f"gpu{g.index} row_remap", CRITICAL, "row remapping pending (reset the GPU)", hardware=True)
            )
        if g.row_remap_failure:
            checks.append(
                Check(
                    f"gpu{g.index} row_remap",
                    CRITICAL,
                    "row remapping failed: no spare rows left (the GPU needs service)",
                    hardware=True,
                )
            )
        if g.temperature_c is not None and g.temperature_c >= 83:
            checks.append(
                Check(
                    f"gpu{g.index} temperature", CRITICAL if g.temperature_c >= 90 else WARNING, f"{g.temperature_c}°C"
                )
            )
        bad = [name for bit, name in THROTTLE_BAD.items() if (g.throttle_reasons or 0) & bit]
        if bad:
            checks.append(Check(f"gpu{g.index} throttle", WARNING, ", ".join(bad)))
        if g.index < tp and g.memory_used_mib < 1024:
            checks.append(Check(f"gpu{g.index} memory", WARNING, "the server holds no memory on this GPU"))
        if not alive and status != "starting" and g.memory_used_mib > 1024:
            checks.append(Check(f"gpu{g.index} memory", WARNING, f"{g.memory_used_mib} MiB used with no server"))
        foreign = [p.pid for p in g.processes if p.pid not in server_pids]
        if foreign and server_pids:
            checks.append(Check(f"gpu{g.index} foreign", WARNING, f"processes not of the server: {foreign}"))
    unread = bool(facts.gpu_error) and not facts.gpus
    if unread:  # no GPU checks ran at all: not "OK"
        # NVML and nvidia-smi both failing is the driver (not loaded, a GPU fallen off the bus); a host with
        # neither tool installed is only unobservable.
        no_tools = facts.gpu_source == "none" and facts.gpu_tools_missing
        checks.append(
            Check(
                "gpus",
                WARNING if no_tools else CRITICAL,
                f"cannot read the GPUs: {facts.gpu_error}",
                hardware=not no_tools,
            )
        )
    for mismatch in [] if unread else gpu_mismatches(expected_gpus, facts.gpus):
        # Fewer GPUs than the box has is hardware (a restart cannot bring one back); the rest is a warning.
        checks.append(
            Check("gpus", CRITICAL if mismatch.missing else WARNING, mismatch.message, hardware=mismatch.missing)
        )
    for line in raw.get("kernel", []):
        m = XID_RE.search(line)
        if m:
            xid = int(m.group(2))
            hw = xid in HARDWARE_XIDS
            checks.append(
                Check(
                    f"xid {xid}",
                    CRITICAL if hw else WARNING,
                    f"Xid {xid} ({XID_MEANING.get(xid, 'see NVIDIA Xid catalogue')}) on {m.group(1)}",
                    hardware=hw,
                )
            )
    overall = worst([c.status for c in checks])
    hh = HostHealth(
        host,
        overall,
        tuple(checks),
        server_up=bool(server and server.get("alive")),
        playbook=st.get("playbook"),
        gpus=tuple(gpus),
        duration_s=duration_s,
    )
    healable = overall == CRITICAL and not hh.hardware_fault and bool(st.get("plan")) and status != "stopped"
    return HostHealth(**{**hh.__dict__, "healable": healable})


def after_heal(health: HostHealth, healed: bool, what: str) -> HostHealth:
    """A successful heal leaves the host serving but worth a look: warning; a failed one stays critical."""
    checks = (*health.checks, Check("heal", WARNING if healed else CRITICAL, what))
    return HostHealth(
        **{
            **health.__dict__,
            "checks": checks,
            "heal": what,
            "status": WARNING if healed else worst([c.status for c in checks]),
        }
    )


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class _Metric:
    name: str
    help: str
    type: str = "gauge"
    samples: list[str] = field(default_factory=list)


def prometheus_text(results: Sequence[HostHealth], now: float) -> str:
    """node_exporter textfile-collector format."""
    m = {
        "status": _Metric("fleet_host_status", "Worst check status: 0 ok, 1 warning, 2 critical, 3 unknown."),
        "check": _Metric("fleet_check_status", "Per check status: 0 ok, 1 warning, 2 critical, 3 unknown."),
        "up": _Metric("fleet_server_up", "1 if the recorded inference server process is alive."),
        "mem": _Metric("fleet_gpu_memory_used_bytes", "GPU memory used."),
        "temp": _Metric("fleet_gpu_temperature_celsius", "GPU temperature."),
        "dur": _Metric("fleet_health_check_duration_seconds", "Time to check the host."),
    }
    for r in results:
        h = _label(r.host)
        m["status"].samples.append(f'fleet_host_status{{host="{h}"}} {SEVERITY[r.status]}')
        m["up"].samples.append(f'fleet_server_up{{host="{h}"}} {int(r.server_up)}')
        m["dur"].samples.append(f'fleet_health_check_duration_seconds{{host="{h}"}} {r.duration_s:.3f}')
        for c in r.checks:
            m["check"].samples.append(f'fleet_check_status{{host="{h}",check="{_label(c.name)}"}} {SEVERITY[c.status]}')
        for g in r.gpus:
            m["mem"].samples.append(
                f'fleet_gpu_memory_used_bytes{{host="{h}",gpu="{g["index"]}"}} {int(g["memory_used_mib"]) << 20}'
            )
            if g.get("temperature_c") is not None:
                m["temp"].samples.append(
                    f'fleet_gpu_temperature_celsius{{host="{h}",gpu="{g["index"]}"}} {g["temperature_c"]}'
                )
    lines: list[str] = []
    for metric in m.values():
        lines += [f"# HELP {metric.name} {metric.help}", f"# TYPE {metric.name} {metric.type}", *metric.samples]
    lines += [
        "# HELP fleet_health_last_run_timestamp_seconds When fleet health last ran.",
        "# TYPE fleet_health_last_run_timestamp_seconds gauge",
        f"fleet_health_last_run_timestamp_seconds {now:.3f}",
    ]
    return "\n".join(lines) + "\n"
