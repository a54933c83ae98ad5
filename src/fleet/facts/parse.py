"""Host facts: the probe script's text and the pure parser of its JSON answer into `HostFacts`.

Pure: builds strings and parses data; never touches the network (pyinfra's "fact = command + parser").
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleet.errors import HostStepError
from fleet.facts.recorded import Recorded, parse_recorded
from fleet.host.procs import ip_literal
from fleet.protocol import StateRecord, json_object
from fleet.secrets import shown_processes

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fleet.inventory import ExpectedGpus


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mib: int


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    compute_capability: str  # "12.0": SM120 (RTX PRO 6000 / 5090) is not SM100 (B200)
    memory_total_mib: int
    memory_used_mib: int
    temperature_c: int | None
    processes: tuple[GpuProcess, ...]
    ecc_uncorrected: int | None = None
    throttle_reasons: int | None = None
    retired_pages_pending: bool | None = None
    row_remap_pending: bool | None = None  # a GPU reset applies it (Ampere and later)
    row_remap_failure: bool | None = None  # no spare rows left: the GPU needs service
    nvlink: bool = False
    holders: tuple[int, ...] = ()  # pids holding its /dev/nvidiaN (also those NVML does not list)

    @property
    def sm(self) -> int:
        major, _, minor = self.compute_capability.partition(".")
        return int(major) * 10 + int(minor or 0)


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    uid: int | None
    user: str
    comm: str
    cmdline: str
    start_ticks: int = 0
    ports: tuple[int, ...] = ()
    container: str | None = None  # the id of the container it runs in

    @property
    def engine(self) -> str | None:
        low = self.cmdline.lower()
        if "sglang" in low:
            return "sglang"
        if "vllm" in low:
            return "vllm"
        return None


@dataclass(frozen=True)
class EngineInstall:
    engine: str
    python: str
    version: str | None
    packages: dict[str, str]
    error: str | None


@dataclass(frozen=True)
class ModelFiles:
    path: str
    exists: bool
    config: dict[str, Any] | None
    config_error: str | None
    quant_config: dict[str, Any] | None
    weights_bytes: int | None
    mtp_weight_layers: int = 0  # MTP layers the safetensors index names (mtp.layers.N.*)
    listing: str | None = None  # file count and a digest of the names and sizes (compared across a group)
    damage: tuple[str, ...] = ()  # what is not whole, file by file (missing, truncated, an unfinished download)
    gguf: tuple[str, ...] = ()  # GGUF files where config.json is missing (a GGUF checkpoint, or a file itself)
    sentence_transformers: bool = False  # modules.json: a sentence-transformers pipeline (an embedding model)


@dataclass(frozen=True)
class Disk:
    path: str
    free_bytes: int | None


@dataclass(frozen=True)
class DeploymentRecord:
    """What the host keeps for one deployment (state_dir/deployments/NAME)."""

    name: str
    state: StateRecord  # empty when there is none (or it is unreadable: state_error)
    lock: dict[str, Any] | None = None
    heals: tuple[float, ...] = ()  # when `fleet health --heal` restarted the server
    state_error: str | None = None  # the record itself is unreadable: what runs is unknown
    legacy: bool = False  # an older fleet's one-server record (state_dir/state.json): all GPUs
    lock_live: bool = False  # a run holds its lock now (a deploy, stop or restart under way)
    phase: dict[str, Any] | None = None  # while it starts: its current phase, as its watcher last said it
    # its model's last starts on this host (fleet.startup), oldest first, by engine version and GPUs
    # (fleet.startup.history_key; its own: state["startup_key"])
    starts: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)

    @functools.cached_property
    def recorded(self) -> Recorded:
        """The record's fields, typed (fleet.facts.recorded): how fleet reads them."""
        return parse_recorded(self.state)

    @property
    def gpus(self) -> tuple[int, ...] | None:
        """The GPUs the deployment was placed on; None: all of the host's (records before placement)."""
        return self.recorded.gpus


@dataclass(frozen=True)
class RemoteState:
    learned: dict[str, Any] | None
    errors: tuple[str, ...]  # fleet's files on the host that exist but cannot be read (path: why)
    deployments: dict[str, DeploymentRecord] = field(default_factory=dict)

    def deployment(self, name: str) -> DeploymentRecord:
        return self.deployments.get(name) or DeploymentRecord(name, {})


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    image: str
    state: str
    labels: dict[str, str]
    pid: int | None

    @property
    def deployment(self) -> str | None:
        """The fleet deployment it runs, by its label under the name fleet gives that deployment's container
        (None: not fleet's; a container run from a snapshot of fleet's carries its labels too)."""
        from fleet.plan.container import container_name  # the plan's own naming: one place

        label = self.labels.get("fleet.deployment")
        return label if label is not None and self.name == container_name(label) else None


@dataclass(frozen=True)
class ContainerFacts:
    """The container runtime a deployment asked for, as the host has it."""

    cli: str | None  # its path; None: not installed
    error: str | None = None
    gpu_access: str | None = None  # toolkit | cdi | devices | None (no way for GPUs into a container)
    image_present: bool = False
    image_id: str | None = None
    image_cuda: str | None = None
    image_error: str | None = None
    hf_cache: str | None = None


def _containers(raw: Any) -> tuple[ContainerInfo, ...]:
    return tuple(
        ContainerInfo(
            str(x.get("id", "")),
            str(x.get("name", "")),
            str(x.get("image", "")),
            str(x.get("state", "")),
            {str(k): str(v) for k, v in (x.get("labels") or {}).items() if isinstance(x.get("labels"), dict)},
            x.get("pid") if isinstance(x.get("pid"), int) else None,
        )
        for x in (raw if isinstance(raw, list) else [])
        if isinstance(x, dict) and x.get("id")
    )


def _container_facts(c: dict[str, Any]) -> ContainerFacts:
    image = c.get("image") or {}
    return ContainerFacts(
        cli=c.get("cli"),
        error=c.get("error"),
        gpu_access=c.get("gpu_access"),
        image_present=image.get("present") is True,
        image_id=image.get("id"),
        image_cuda=image.get("cuda"),
        image_error=image.get("error"),
        hf_cache=c.get("hf_cache"),
    )


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    pid: int | None


@dataclass(frozen=True)
class HostFacts:
    host: str
    hostname: str
    user: str
    uid: int
    time: float
    boot_time: int
    clock_ticks: int
    gpu_source: str  # "nvml", "nvidia-smi" or "none"
    gpu_error: str | None
    gpus: tuple[Gpu, ...]
    driver_version: str | None
    cuda_version: str | None
    device_files: tuple[str, ...]
    holders: tuple[Proc, ...]
    servers: tuple[Proc, ...]
    listeners: tuple[Listener, ...]
    engines: dict[str, EngineInstall]
    model: ModelFiles | None
    disks: tuple[Disk, ...]
    remote: RemoteState
    load: tuple[float, ...] = ()
    mem_available_kib: int | None = None
    gpu_tools_missing: bool = False  # source "none" because nothing reads GPUs here, not a failing driver
    # (i, j) with i < j -> the closest link the two GPUs share, as NVML ranks it (empty: unknown)
    gpu_topology: dict[tuple[int, int], int] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    container: ContainerFacts | None = None  # asked only for a deployment that runs in a container
    containers: tuple[ContainerInfo, ...] = ()  # those running engines, and fleet's
    paths: dict[str, str] = field(default_factory=dict)  # log_dir, state_dir as the host expands them
    reach: str | None = None  # a group's rank 0 dist port from here: open | refused | timeout ... | error: ...
    reach_interface: str | None = None  # the interface this host reaches rank 0 on (the kernel's route)

    def port_holders(self, port: int, bind_address: str = "0.0.0.0") -> list[Listener]:
        """The listeners that would stop a server binding bind_address:port (wildcards overlap everything)."""
        wild = ("0.0.0.0", "::")
        bind = ip_literal(bind_address)  # a host name may be any address: every listener is in its way
        return [
            lst
            for lst in self.listeners
            if lst.port == port and (bind is None or bind in wild or lst.address in wild or lst.address == bind)
        ]

    def port_holder(self, port: int, bind_address: str = "0.0.0.0") -> Listener | None:
        """The first of port_holders, or None."""
        return next(iter(self.port_holders(port, bind_address)), None)

    def uptime_s(self, proc: Proc) -> float:
        return self.time - (self.boot_time + proc.start_ticks / max(1, self.clock_ticks))


def one_line(cmdline: str) -> str:
    """A process's command line for a listing: a `python -c` program's newlines would break it."""
    return " ".join(cmdline.split())


@dataclass(frozen=True)
class GpuMismatch:
    """One way the host's GPUs differ from the inventory's `expected_gpus`."""

    message: str
    missing: bool = False  # fewer GPUs than expected: one may have fallen off the bus


def gpu_mismatches(expected: ExpectedGpus | None, gpus: Sequence[Gpu]) -> list[GpuMismatch]:
    if expected is None:
        return []
    out = []
    if len(gpus) != expected.count:
        fewer = len(gpus) < expected.count
        hint = " (a GPU that fell off the bus is gone from NVML: look for Xid 79 in the kernel log)" if fewer else ""
        out.append(GpuMismatch(f"inventory expects {expected.count} GPUs, the host reports {len(gpus)}{hint}", fewer))
    if expected.name_contains:
        wanted = expected.name_contains.lower()
        names = sorted({g.name for g in gpus if wanted not in g.name.lower()})
        if names:
            wanted_text = f'GPUs named "*{expected.name_contains}*"'
            out.append(GpuMismatch(f"inventory expects {wanted_text}, the host reports {', '.join(names)}"))
    if expected.compute_capability:
        ccs = sorted({g.compute_capability for g in gpus if g.compute_capability != expected.compute_capability})
        if ccs:
            wanted_cc = f"compute capability {expected.compute_capability}"
            out.append(GpuMismatch(f"inventory expects {wanted_cc}, the host reports {', '.join(ccs)}"))
    return out


def _proc(d: dict[str, Any]) -> Proc:
    return Proc(
        pid=int(d["pid"]),
        ppid=int(d.get("ppid", 0)),
        pgid=int(d.get("pgid", 0)),
        uid=d.get("uid"),
        user=str(d.get("user", "?")),
        comm=str(d.get("comm", "")),
        cmdline=str(d.get("cmdline", "")),
        start_ticks=int(d.get("start_ticks", 0)),
        ports=tuple(int(p["port"]) for p in d.get("ports", [])),
        container=str(d["container"]) if isinstance(d.get("container"), str) else None,
    )


def _gpus(gpu: dict[str, Any], by_file: Any) -> tuple[Gpu, ...]:
    """The probe's GPUs, each with the processes holding its device file (`by_file`: nvidiaN -> pids)."""

    def holders_of(g: Mapping[str, object]) -> tuple[int, ...]:
        minor = g.get("minor") if isinstance(g.get("minor"), int) else g["index"]
        held = by_file.get(f"nvidia{minor}") if isinstance(by_file, dict) else None
        return tuple(int(p) for p in held if isinstance(p, int)) if isinstance(held, list) else ()

    return tuple(
        Gpu(
            index=int(g["index"]),
            name=str(g["name"]),
            uuid=str(g["uuid"]),
            compute_capability=str(g["compute_capability"]),
            memory_total_mib=int(g["memory_total_mib"]),
            memory_used_mib=int(g["memory_used_mib"]),
            temperature_c=g.get("temperature_c"),
            processes=tuple(GpuProcess(int(p["pid"]), int(p["used_mib"])) for p in g.get("processes", [])),
            ecc_uncorrected=g.get("ecc_uncorrected"),
            throttle_reasons=g.get("throttle_reasons"),
            retired_pages_pending=g.get("retired_pages_pending"),
            row_remap_pending=g.get("row_remap_pending"),
            row_remap_failure=g.get("row_remap_failure"),
            nvlink=bool(g.get("nvlink", False)),
            holders=holders_of(g),
        )
        for g in gpu.get("gpus", [])
    )


def _model_files(m: dict[str, Any]) -> ModelFiles:
    return ModelFiles(
        path=m["path"],
        exists=bool(m.get("exists")),
        config=m.get("config"),
        config_error=m.get("config_error"),
        quant_config=m.get("quant_config"),
        weights_bytes=m.get("weights_bytes"),
        mtp_weight_layers=int(m.get("mtp_weight_layers") or 0),
        listing=str(m["listing"]) if m.get("listing") else None,
        damage=tuple(str(x) for x in m.get("damage") or [] if isinstance(m.get("damage"), list)),
        gguf=tuple(str(x) for x in m.get("gguf") or [] if isinstance(m.get("gguf"), list))[:8],
        sentence_transformers=m.get("sentence_transformers") is True,
    )


def parse_facts(host: str, text: str) -> HostFacts:
    raw = json_object(text)
    if raw is None:
        raise HostStepError(
            f"{host}: fleet's probe failed on the host and said no result (got {text[:200]!r}).",
            "Run with --debug for all it printed.",
            text[-2000:],
        )
    if "probe_error" in raw or "error" in raw:
        why = raw.get("probe_error") or raw.get("error")
        raise HostStepError(f"{host}: fleet's probe could not run on the host ({why}).", "")
    # other users' command lines (GPU holders, servers) may carry credentials: masked before fleet keeps,
    # prints or records any of them (`fleet facts --json` prints this raw document)
    for key, where in (("servers", raw), ("holders", raw.get("devices") or {})):
        if isinstance(where, dict) and isinstance(where.get(key), list):
            where[key] = shown_processes(p for p in where[key] if isinstance(p, dict))
    gpu = raw.get("gpu", {})
    gpus = _gpus(gpu, (raw.get("devices") or {}).get("by_file") or {})
    engines = {
        name: EngineInstall(
            engine=name,
            python=str(e.get("python", "")),
            version=e.get("version"),
            packages=dict(e.get("packages", {})),
            error=e.get("error"),
        )
        for name, e in raw.get("engines", {}).items()
    }
    model = _model_files(raw["model"]) if raw.get("model") else None
    remote = _remote_state(raw.get("state") or {})
    devices = raw.get("devices", {})
    return HostFacts(
        host=host,
        hostname=str(raw.get("hostname", "")),
        user=str(raw.get("user", "")),
        uid=int(raw.get("uid", -1)),
        time=float(raw.get("time", 0.0)),
        boot_time=int(raw.get("boot_time", 0)),
        clock_ticks=int(raw.get("clock_ticks", 100)),
        gpu_source=str(gpu.get("source", "none")),
        gpu_error=gpu.get("error"),
        gpus=gpus,
        driver_version=gpu.get("driver_version"),
        cuda_version=gpu.get("cuda_version"),
        device_files=tuple(devices.get("device_files", [])),
        holders=tuple(_proc(p) for p in devices.get("holders", [])),
        servers=tuple(_proc(p) for p in raw.get("servers", [])),
        listeners=tuple(Listener(str(x["address"]), int(x["port"]), x.get("pid")) for x in raw.get("listeners", [])),
        engines=engines,
        model=model,
        disks=tuple(Disk(d["path"], d.get("free_bytes")) for d in raw.get("disk", [])),
        remote=remote,
        load=tuple(raw.get("load", ())),
        mem_available_kib=raw.get("mem_available_kib"),
        gpu_tools_missing=gpu.get("tools_missing") is True,
        gpu_topology={
            (int(t[0]), int(t[1])): int(t[2])
            for t in gpu.get("topology") or []
            if isinstance(t, list) and len(t) == 3 and all(isinstance(x, int) for x in t)
        },
        raw=raw,
        container=_container_facts(raw["container"]) if isinstance(raw.get("container"), dict) else None,
        containers=_containers(raw.get("containers")),
        paths={str(k): str(v) for k, v in (raw.get("paths") or {}).items()},
        reach=str(raw["reach"]) if raw.get("reach") else None,
        reach_interface=str(raw["reach_interface"]) if raw.get("reach_interface") else None,
    )


def _starts(kept: Any) -> dict[str, tuple[dict[str, Any], ...]]:
    if not isinstance(kept, dict):
        return {}
    return {str(k): tuple(x for x in v if isinstance(x, dict)) for k, v in kept.items() if isinstance(v, list)}


def _heals(times: object) -> tuple[float, ...]:
    return tuple(float(t) for t in times if isinstance(t, int | float)) if isinstance(times, list) else ()


def _remote_state(st: dict[str, Any]) -> RemoteState:
    deployments: dict[str, DeploymentRecord] = {}
    errors = [v for k, v in st.items() if k.endswith("_error")]
    for name, d in (st.get("deployments") or {}).items():
        if not isinstance(d, dict):
            continue
        errors += [v for k, v in d.items() if k.endswith("_error")]
        deployments[str(name)] = DeploymentRecord(
            name=str(name),
            state=d["state"] if isinstance(d.get("state"), dict) else {},
            lock=d["lock"] if isinstance(d.get("lock"), dict) else None,
            heals=_heals(d.get("heals")),
            state_error=d.get("state_error"),
            legacy=d.get("legacy") is True,
            lock_live=d.get("lock_live") is True,
            phase=d["phase"] if isinstance(d.get("phase"), dict) else None,
            starts=_starts(d.get("starts")),
        )
    learned = st.get("learned")
    return RemoteState(learned if isinstance(learned, dict) else None, tuple(errors), deployments)
