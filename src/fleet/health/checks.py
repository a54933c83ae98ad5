"""Health verdicts: the raw answer of one host's health probe → checks with Nagios-style statuses. Pure.

Checks of the host (resources, GPUs once each) and of each deployment on it (its server, port, HTTP
answers, log). The probe itself (`fleet/host/health.py`) runs on the host; the caller does
I/O and healing; `fleet.health.prometheus` renders the results for node_exporter.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from fleet.crashes import Diagnosis
from fleet.facts import DeploymentRecord, HostFacts, gpu_mismatches
from fleet.facts.parse import Gpu
from fleet.protocol import FAILED, LIVE, STARTING, STOPPED, UNVERIFIED, HealthAnswer, ServerAnswer
from fleet.startup import typical_startup

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
    deployment: str | None = None  # a check of one deployment's server; None: of the host
    gpu: int | None = None  # a check of one GPU (its faults concern only the deployment placed there)

    @property
    def label(self) -> str:
        return f"{self.deployment}: {self.name}" if self.deployment else self.name


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
    healable: tuple[str, ...] = ()  # deployments a restart may heal
    up: dict[str, bool] = field(default_factory=dict)  # deployment -> its recorded server is alive
    start_s: dict[str, float] = field(default_factory=dict)  # healable -> its usual start-up here, when known

    @property
    def hardware_fault(self) -> bool:
        return any(c.hardware and c.status == CRITICAL for c in self.checks)

    def only(self, deployment: str) -> HostHealth:
        """The host's own checks and one deployment's (`fleet health --host H/NAME`)."""
        checks = tuple(c for c in self.checks if c.deployment in (None, deployment))
        if deployment not in self.up:
            checks += (Check("server", UNKNOWN, f"no deployment {deployment} on this host", deployment=deployment),)
        return replace(
            self,
            checks=checks,
            status=worst([c.status for c in checks]),
            server_up=self.up.get(deployment, False),
            playbook=deployment,
            healable=tuple(n for n in self.healable if n == deployment),
            up={n: u for n, u in self.up.items() if n == deployment},
        )

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
                {
                    "name": c.name,
                    "deployment": c.deployment,
                    "status": c.status,
                    "detail": c.detail,
                    "hardware": c.hardware,
                }
                for c in self.checks
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
    return max((_flag_int(argv, f) for f in ("--tp-size", "--tp", "--tensor-parallel-size", "-tp")), default=1)


def _flag_int(argv: Sequence[str], flag: str) -> int:
    if flag in argv and argv.index(flag) + 1 < len(argv):
        value = argv[argv.index(flag) + 1]
        if value.isdigit():
            return int(value)
    return 1


def evaluate(
    host: str,
    raw: HealthAnswer,
    facts: HostFacts,
    diagnoses: Mapping[str, Diagnosis | None] | None,
    duration_s: float = 0.0,
    expected_gpus: ExpectedGpus | None = None,
) -> HostHealth:
    """The host's checks, then each deployment's (`raw["deployments"][NAME]`, `diagnoses[NAME]`: its log)."""
    checks = _host_checks(raw, facts)
    answers = raw.get("deployments") or {}
    healable: list[str] = []
    alive_groups: dict[str, tuple[set[int], tuple[int, ...], int]] = {}  # name -> (pids, its GPUs, TP)
    for name, record in sorted(facts.remote.deployments.items()):
        answer = answers.get(name) or {}
        mine = _deployment_checks(record, answer, (diagnoses or {}).get(name))
        checks += mine
        r = record.recorded
        server = answer.get("server") or {}
        if server.get("alive") and r.status in LIVE:
            every = tuple(g.index for g in facts.gpus)
            argv = r.argv
            tp = _tp(argv) // max(1, _flag_int(argv, "--nnodes"))  # a group's rank holds its share of the TP ranks
            alive_groups[name] = (set(server.get("group_pids", [])), record.gpus or every, tp)
        # a rank of a group is healed with its group, as a whole (`group/NAME`), never alone
        broken = worst([c.status for c in mine]) == CRITICAL and r.status != STOPPED
        if broken and r.plan and not r.group:
            healable.append(name)
    if not facts.remote.deployments:
        checks.append(Check("server", OK, "no fleet deployment recorded"))
    checks += _gpu_checks(facts, alive_groups, expected_gpus, raw)
    overall = worst([c.status for c in checks])
    hh = HostHealth(
        host,
        overall,
        tuple(checks),
        server_up=bool(alive_groups) and len(alive_groups) == len(_expected_up(facts)),
        up={name: name in alive_groups for name in facts.remote.deployments},
        # the deployments meant to be serving: a stopped one is history (`fleet status` lists it), not health
        playbook=", ".join(sorted(_expected_up(facts))) or None,
        gpus=tuple(
            {
                "index": g.index,
                "name": g.name,
                "memory_used_mib": g.memory_used_mib,
                "memory_total_mib": g.memory_total_mib,
                "temperature_c": g.temperature_c,
            }
            for g in facts.gpus
        ),
        duration_s=duration_s,
        start_s=_usual_starts(facts, healable),
    )
    faulty = [c for c in checks if c.hardware and c.status == CRITICAL]

    def sound(name: str) -> bool:
        """No hardware fault a restart cannot fix: on the host as a whole, or on one of its GPUs."""
        placed = facts.remote.deployments[name].gpus
        return not any(c.gpu is None or placed is None or c.gpu in placed for c in faulty)

    return replace(hh, healable=tuple(n for n in healable if sound(n)))


def _expected_up(facts: HostFacts) -> list[str]:
    return [n for n, d in facts.remote.deployments.items() if d.recorded.status in LIVE]


def _host_checks(raw: HealthAnswer, facts: HostFacts) -> list[Check]:
    checks: list[Check] = [Check("ssh", OK, "reachable")]
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
    if raw.get("bookkeeping_error"):  # the log offsets were not kept: the same lines come back next time
        checks.append(Check("fleet_state", WARNING, f"health's bookkeeping not kept: {raw['bookkeeping_error']}"))
    return checks


def _container_check(box: Mapping[str, object]) -> tuple[str, str, str]:
    """What the container runtime says of a deployment's container (the server check says what runs)."""
    name = box.get("name")
    if box.get("missing"):
        return "container", CRITICAL, f"container {name} is gone (removed, or the runtime cannot be asked)"
    if box.get("oom_killed"):
        return (
            "container",
            CRITICAL,
            f"container {name} was OOM-killed (exit {box.get('exit_code')}): raise its memory limit",
        )
    if not box.get("running"):
        return "container", CRITICAL, f"container {name} is {box.get('status')} (exit {box.get('exit_code')})"
    count = box.get("restart_count")
    restarts = count if isinstance(count, int) else 0  # the runtime's inspect: a number, or nothing said
    if restarts:
        return "container", WARNING, f"container {name} running, restarted {restarts} time(s) by the runtime"
    return "container", OK, f"container {name} running"


def _alive(pid: object, status: str | None, reason: str | None, answer: ServerAnswer) -> tuple[str, str]:
    """A live recorded server's level and line: one fleet's run launched and never proved (unverified)
    is a warning until a check proves it (the host then records it ready)."""
    if status == UNVERIFIED and answer.get("proven"):
        return OK, f"pid {pid} alive, proven now: it answered the prompt (recorded ready)"
    if status == UNVERIFIED:  # launched, then fleet's run ended before it proved the server
        return WARNING, f"pid {pid} alive, unverified: {reason or '?'}"
    return OK, f"pid {pid} alive"


def _deployment_checks(record: DeploymentRecord, answer: ServerAnswer, diagnosis: Diagnosis | None) -> list[Check]:
    st, r = record.state, record.recorded
    server = answer.get("server")
    http = answer.get("http") or {}
    status = r.status
    checks: list[Check] = []

    def add(name: str, level: str, detail: str) -> None:
        checks.append(Check(name, level, detail, deployment=record.name))

    if answer.get("error"):  # the host could not check it (a record edited or cut short): this one alone
        add("server", WARNING, f"could not be checked on the host ({answer['error']}): what runs is unknown")
        return checks
    if not st and record.state_error:
        add("server", WARNING, "the deployment record is unreadable: what should run is unknown")
    elif not st:
        add("server", OK, "nothing recorded (a deploy under way, or a stop with nothing to stop)")
    elif status == STOPPED:
        add("server", OK, f"stopped: {r.reason}" if r.reason else "stopped by an operator")
    elif status == FAILED:
        add("server", CRITICAL, f"last deploy failed: {r.reason or '?'}")
    elif server is None or not server.get("alive"):
        add("server", CRITICAL, f"server process {r.pid} is gone")
    else:
        add("server", *_alive(server["pid"], status, r.reason, answer))
        if server.get("drift"):
            add("drift", WARNING, "the running command line differs from the recorded plan")
        port = server.get("port")
        owned = port in server.get("ports", [])
        add("port", OK if owned else CRITICAL, f"port {port} {'owned' if owned else 'NOT held'} by the server")
        h = http.get("health") or {}
        add(
            "http_health",
            OK if h.get("status") == 200 else CRITICAL,
            f"/health {h.get('status')} in {h.get('seconds', 0):.2f}s",
        )
        m = http.get("models") or {}
        served = r.served_name
        group = r.group or {}
        if group.get("rank"):  # SGLang's other ranks answer /health only; rank 0 serves the API
            hosts = group.get("hosts")
            first = hosts[0] if isinstance(hosts, list) and hosts else "?"  # a record's, as the host keeps it
            add("models", OK, f"rank {group['rank']} of a group: rank 0 ({first}) serves")
        else:
            add("models", OK if served in m.get("ids", []) else WARNING, f"/v1/models lists {m.get('ids')}")
        g = http.get("generation") or {}
        if "skipped" in g:
            add("generation", OK, f"skipped ({g['skipped']})")
        elif g:
            ok = g.get("ok")
            detail = (
                f"answer {g.get('text', '')[:80]!r} in {g.get('seconds', 0):.2f}s"
                if g.get("status") == 200
                else f"HTTP {g.get('status')}: {str(g.get('text', ''))[:120]}"
            )
            add("generation", OK if ok else CRITICAL, detail if ok else f"wrong or no answer: {detail}")
    if answer.get("container"):
        add(*_container_check(answer["container"]))
    if diagnosis is not None and diagnosis.found_failure:
        # Log text alone never makes a server that answered a real prompt just now broken (and healed):
        # what a log says can be forged or stale; the answer cannot. A server proved a little while ago and
        # serving traffic since (its prompt skipped for that) has answered too.
        # Nor does it condemn a server no prompt was asked of (--skip-generation, a key fleet lacks) while
        # its /health answers: only a failed answer, or a server that does not answer at all, does.
        generation = http.get("generation") or {}
        answered = bool(generation.get("ok") or generation.get("serving"))
        unasked = "ok" not in generation and (http.get("health") or {}).get("status") == 200
        yet = ", yet it answered a prompt" if generation.get("ok") else ", yet it serves traffic" if answered else ""
        yet = yet or (", and no prompt was asked of it (its /health answers)" if unasked else "")
        add(
            "crash_log",
            WARNING if answered or unasked else CRITICAL,
            f"{diagnosis.category} ({diagnosis.signature}) in the server log{yet}: "
            f"{(diagnosis.evidence or ('',))[0][:160]}",
        )
    return checks


def _gpu_checks(
    facts: HostFacts,
    alive_groups: Mapping[str, tuple[set[int], tuple[int, ...], int]],
    expected_gpus: ExpectedGpus | None,
    raw: HealthAnswer,
) -> list[Check]:
    """Once per GPU: faults, heat, throttling; memory against the deployment placed there (a server
    holding none of its GPU's memory, memory used on a GPU no deployment runs on, someone else's
    process on a deployment's GPU). Then GPUs unread or missing, and the kernel's Xid lines."""
    checks: list[Check] = []
    starting = any(d.recorded.status == STARTING for d in facts.remote.deployments.values())
    owner = {i: name for name, (_, gpus, _) in alive_groups.items() for i in gpus}
    for g in facts.gpus:
        checks += _gpu_faults(g)
        name = owner.get(g.index)
        if name is None:
            if not starting and g.memory_used_mib > 1024:
                checks.append(Check(f"gpu{g.index} memory", WARNING, f"{g.memory_used_mib} MiB used with no server"))
            continue
        pids, gpus, tp = alive_groups[name]
        if g.index in gpus[:tp] and g.memory_used_mib < 1024:
            checks.append(
                Check(f"gpu{g.index} memory", WARNING, "the server holds no memory on this GPU", deployment=name)
            )
        foreign = [p.pid for p in g.processes if p.pid not in pids]
        if foreign and pids:
            checks.append(
                Check(f"gpu{g.index} foreign", WARNING, f"processes not of the server: {foreign}", deployment=name)
            )
    return checks + _gpus_unread_or_missing(facts, expected_gpus) + _xid_checks(raw)


def _gpu_faults(g: Gpu) -> list[Check]:
    """Faults that need the GPU reset or serviced (hardware: a restart of the server cannot help), heat and
    throttling."""
    hardware = (
        (g.ecc_uncorrected, "ecc", f"{g.ecc_uncorrected} uncorrected ECC errors"),
        (g.retired_pages_pending, "retired_pages", "page retirement pending (reset the GPU)"),
        (g.row_remap_pending, "row_remap", "row remapping pending (reset the GPU)"),
        (g.row_remap_failure, "row_remap", "row remapping failed: no spare rows left (the GPU needs service)"),
    )
    checks = [Check(f"gpu{g.index} {n}", CRITICAL, said, hardware=True, gpu=g.index) for on, n, said in hardware if on]
    if g.temperature_c is not None and g.temperature_c >= 83:
        level = CRITICAL if g.temperature_c >= 90 else WARNING
        checks.append(Check(f"gpu{g.index} temperature", level, f"{g.temperature_c}°C"))
    bad = [name for bit, name in THROTTLE_BAD.items() if (g.throttle_reasons or 0) & bit]
    if bad:
        checks.append(Check(f"gpu{g.index} throttle", WARNING, ", ".join(bad)))
    return checks


def _gpus_unread_or_missing(facts: HostFacts, expected_gpus: ExpectedGpus | None) -> list[Check]:
    if facts.gpu_error and not facts.gpus:  # no GPU checks ran at all: not "OK"
        # NVML and nvidia-smi both failing is the driver (not loaded, a GPU fallen off the bus); a host with
        # neither tool installed is only unobservable.
        no_tools = facts.gpu_source == "none" and facts.gpu_tools_missing
        level = WARNING if no_tools else CRITICAL
        return [Check("gpus", level, f"cannot read the GPUs: {facts.gpu_error}", hardware=not no_tools)]
    # Fewer GPUs than the box has is hardware (a restart cannot bring one back); the rest is a warning.
    return [
        Check("gpus", CRITICAL if m.missing else WARNING, m.message, hardware=m.missing)
        for m in gpu_mismatches(expected_gpus, facts.gpus)
    ]


def _xid_checks(raw: HealthAnswer) -> list[Check]:
    checks = []
    for line in raw.get("kernel", []):
        m = XID_RE.search(line)
        if m:
            xid = int(m.group(2))
            hw = xid in HARDWARE_XIDS
            meaning = XID_MEANING.get(xid, "see NVIDIA Xid catalogue")
            checks.append(
                Check(f"xid {xid}", CRITICAL if hw else WARNING, f"Xid {xid} ({meaning}) on {m.group(1)}", hardware=hw)
            )
    return checks


def _usual_starts(facts: HostFacts, names: Sequence[str]) -> dict[str, float]:
    """How long each deployment's start-up usually takes on this host (its kept starts under its own
    engine version and GPUs): what a heal of it needs before fleet's run ends."""
    usual: dict[str, float] = {}
    for name in names:
        record = facts.remote.deployment(name)
        key = record.recorded.startup_key
        typical = typical_startup(list(record.starts.get(key, ()))) if key else None
        if typical is not None:
            usual[name] = float(typical["ready_s"])
    return usual


def after_heal(health: HostHealth, deployment: str, healed: bool, what: str) -> HostHealth:
    """A successful heal leaves the deployment serving but worth a look (warning); a failed one stays
    critical. The host's status is then the worst of the heal and what the heal did not touch."""
    checks = (*health.checks, Check("heal", WARNING if healed else CRITICAL, what, deployment=deployment))
    untouched = [c.status for c in checks if c.deployment != deployment or c.name == "heal"]
    said = f"{deployment}: {what}"
    return replace(
        health,
        checks=checks,
        heal=f"{health.heal}; {said}" if health.heal else said,
        status=worst(untouched),
        up={**health.up, deployment: healed} if healed else health.up,
    )
