"""What fleet and the scripts it runs on a host say to each other, typed: one definition for both sides,
checked by mypy on both. Host files import these shapes for type checking only (`from __future__ import
annotations`): this module never leaves this machine; the words used at run time are fleet.host.words."""

import json
from typing import Any, Dict, List, Optional, TypedDict

from fleet.host.words import (  # the words both sides use at run time, re-exported for fleet's own modules
    CRASHED as CRASHED,
    CUT_NOTE as CUT_NOTE,
    DEAD as DEAD,
    DEPLOYMENT_NAME_RE as DEPLOYMENT_NAME_RE,
    FAILED as FAILED,
    LIVE as LIVE,
    READY as READY,
    SECRET_WORD as SECRET_WORD,
    STARTING as STARTING,
    STATE_SCHEMA as STATE_SCHEMA,
    STOPPED as STOPPED,
    UNVERIFIED as UNVERIFIED,
    log_lines as log_lines,
)


def json_object(text: str | bytes) -> Optional[Dict[str, Any]]:
    """What a host said, as the one JSON object a step answers with; None for anything else: no JSON, JSON
    nested past Python's recursion limit, or a value that is not an object (a number, a list)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


class ProcessInfo(TypedDict, total=False):
    """A process as fleet's host code reads it from /proc: who runs it, what (its argv, cut for display
    as `cmdline`), and exactly which (its start time: a pid alone is reused); what fleet found of it."""

    pid: int
    ppid: int
    pgid: int
    uid: Optional[int]
    user: str
    comm: str
    state: str
    start_ticks: int
    cmdline: str
    argv: List[str]
    container: Optional[str]  # the container it runs in, as its runtime names it
    container_id: str
    container_cli: str
    why: str  # why fleet stops, refuses or leaves it
    other_user: bool  # refused: another user's process (fleet never hints at --force for it)
    ports: List[Dict[str, Any]]  # the sockets it listens on


class SmokeSpec(TypedDict, total=False):
    """What proves a server serves: a chat prompt and the regex its answer must hold (`expect`); for an embedding
    model or a reranker (`kind`), fleet's texts on its endpoint (`any_answer`: random weights, any answer)."""

    prompt: str
    expect: str
    max_tokens: int
    kind: str
    any_answer: bool
    timeout_s: float


class LaunchedProcess(TypedDict, total=False):
    """A process fleet started, exactly (a pid alone is reused: see kill_verdict), and its log."""

    pid: int
    start_ticks: Optional[int]
    boot_id: Optional[str]
    started: float
    log: str


class StateRecord(LaunchedProcess, total=False):
    """state.json: written whole when an attempt launches, then only merged into (status changes)."""

    schema: int
    deployment: str  # its name on the host (the playbook's, unless --name): state_dir/deployments/NAME
    service: str  # the service it is a replica of ("": none); absent in a record an older fleet wrote
    gpus: Optional[List[int]]  # nvidia-smi's indices it was placed on; absent: all of the host's
    playbook: str
    host: str
    engine: str
    engine_version: Optional[str]
    plan: Dict[str, Any]
    smoke: SmokeSpec
    port: int
    ports: List[int]  # every port fleet planned for it: HTTP, and a placed server's internal base
    served_name: str
    check_address: str
    status: str  # STARTING, READY, UNVERIFIED, FAILED or STOPPED
    reason: str
    stopped_by: str  # an operator's `fleet stop` (who): no heal restarts it until a deploy or restart
    attempt: int
    attempts: int
    applied_fixes: List[str]
    diagnosis: Optional[Dict[str, Any]]
    run_id: str
    deployed_by: str
    learned_key: str
    startup_key: str  # its start-up history on the host (fleet.startup.history_key)
    ready_timeout_s: float  # the playbook's start-up bounds, kept for restart and heal
    on_stall: str  # fail | wait
    updated: float
    ready_at: float
    pgid: int
    exit_file: str
    group: Dict[str, Any]  # one rank of a group (a model over several hosts): {"hosts", "rank", "dist_port"}
    container: Optional[Dict[str, Any]]  # {cli, name, id} of a server in a container: id is what fleet's run made


class LockResult(TypedDict, total=False):
    status: str  # taken | held | overlap | unwritable
    owner: Optional[str]
    since: Optional[float]
    age_s: Optional[float]
    command: Optional[str]
    holder_pid: Optional[int]
    taken_over: Optional[Dict[str, Any]]
    overlap: List[Dict[str, Any]]  # other deployments on this one's GPUs: deployment, gpus, pid
    path: str
    error: str


class CheckResult(TypedDict, total=False):
    verdict: str  # accepted | rejected | could_not_check (always there)
    output: str  # (always there)
    resolved: Dict[str, str]  # accepted: what the engine decided for the settings the plan left to it
    picks: Dict[str, str]  # asked for: setting -> what it picks without fleet's flags for it, or "refused: why"


class Launched(TypedDict):
    pid: int
    pgid: int
    log: str
    exit_file: str
    started: float
    start_ticks: Optional[int]
    container: Optional[Dict[str, Any]]  # {cli, name, id} of a server in a container; None for a process


class ForgetResult(TypedDict, total=False):
    """`fleet forget`: the deployment's records removed, or why not (nothing removed then)."""

    forgotten: bool
    running: int  # its server's process group still runs
    left: List[str]  # files in its directory fleet did not write
    newer: List[str]  # records a newer fleet wrote: its to keep
    container: str  # why its recorded container could not be removed (running, its runtime not answering)


class ActResult(TypedDict, total=False):
    """The act step's answer: lock, engine check, what it stopped, refused and left, what it launched."""

    host: str
    lock: LockResult
    check: CheckResult
    picks_differ: Dict[str, str]  # the engine's own picks the plan did not stand on: nothing was stopped
    budget_short: Dict[str, Any]  # the engine's own memory fraction leaves too little: nothing was stopped
    refused: List[Dict[str, Any]]
    left: List[Dict[str, Any]]
    ended: List[Dict[str, Any]]  # the processes it stopped
    forced: List[int]
    memory: Dict[str, Any]
    # fleet stop (added by the control side): GPU memory still in use when the wait for it ran out
    memory_held: List[Dict[str, Any]]
    launched: Launched
    withdrawn: str  # the log of a launch the engine's check, run beside it, refused: taken back
    withdraw_failed: str  # ... and why its container could not be removed (it runs, recorded)
    log_dir_unwritable: Dict[str, Any]
    record_unwritable: Dict[str, Any]  # the deployment's record path holds what no record replaces
    record_too_new: str  # a record this run needed was written by a newer fleet: why, and what to do
    short_of_space: Dict[str, Any]
    write_failed: Dict[str, Any]
    rolled_back: Launched
    rollback_failed: str
    rollback_unrecorded: bool
    client_gone: bool  # fleet went away mid-step (never read by fleet: recorded for the host's own logs)
    stopped_since: bool  # a heal found the deployment stopped by an operator under the lock: nothing done
    forget: ForgetResult
    weight_cache: Dict[str, Any]  # what became of the deployment's weight cache daemon (kept, why, pid)
    weight_cache_dir: Dict[str, Any]  # its sockets' directory is not fleet's user's alone: nothing was stopped
    error: str
    traceback: str


class WatchEvent(TypedDict, total=False):
    """One line of the watcher's output; `e` says which: line (o: offset after it, t: text), log_reset (why),
    ready_line, ready_http, health (code), smoke (ok, status, text), exit (code), timeout (what, after_s; a
    stall: phase, bound_s, usual_s), phase (phase, at, done, of, eta_s), lost_lock (why), error, done."""

    e: str
    o: int
    t: str
    why: str
    code: Optional[int]
    ok: bool
    status: Optional[int]
    text: str
    what: str
    after_s: float
    error: str
    phase: Optional[str]  # phase (a start-up phase, fleet.startup), and a stall's timeout
    bound_s: float
    usual_s: Optional[float]
    at: float  # phase: seconds since launch, on the host
    done: Optional[int]
    of: Optional[int]
    eta_s: Optional[float]


class LogsEvent(TypedDict, total=False):
    """One line of the logs step's output; `e` says which: log (d, log: the file shown first), line (d, text),
    switch (d, log: a restart's new attempt, read from its start), reset (d, why: truncated, replaced...),
    missing (d; None: no log on the host), skipped (lines: dropped while fleet read too slowly)."""

    e: str
    d: Optional[str]
    log: str
    text: str
    lines: int
    why: str


class HealDecision(TypedDict):
    allowed: bool
    recent: int


class RouterAction(TypedDict, total=False):
    """One thing a service's router step is asked, in order (`do`): ensure (started with `argv`; `replace`
    one running with other options), workers, add and remove (`url`; `keep_one_healthy`), ask (the smoke
    request through it), health, stop, remember and recall (a roll's last good replicas), lease."""

    do: str
    argv: List[str]
    replace: bool
    wait_s: float
    url: str
    keep_one_healthy: bool
    circuit_wait_s: float
    served_name: str
    smoke: SmokeSpec
    timeout_s: float
    replicas: Dict[str, Any]
    run_id: str  # lease: the run that holds it, who, for what, how long untouched it stands
    owner: Optional[str]
    command: Optional[str]
    ttl_s: float
    peek: bool
    release: bool


class RouterRequest(RouterAction, total=False):
    """The router step's request: which service's router (its record, log, address and ports) and the
    actions; each action runs with these keys merged in."""

    service: str
    source: str  # the service file: another file of the same name is another service
    state_dir: str
    log_dir: str
    port: int
    metrics_port: int
    bind: str
    actions: List[RouterAction]


class WatchRequest(TypedDict, total=False):
    """The watch step's request: follow one attempt's log from `offset`, prove its server (the ready line or
    /health, then the smoke request; a group's other rank by /health only), and record `success_state` and
    the `learned` fixes once proven. The API key comes on stdin (`key_on_stdin`), kept as `_api_key`."""

    log: str
    exit_file: str
    pgid: int
    start_ticks: Optional[int]
    container: Optional[Dict[str, Any]]
    offset: int
    ready_seen: bool
    client_on_stdin: bool
    ready_regex: str
    address: str
    port: int
    served_name: str
    smoke: SmokeSpec
    ready_timeout_s: float
    progress_timeout_s: float
    startup_key: str
    startup_fixes: List[str]
    stall_floor_s: float
    on_stall: str  # fail | wait
    health_timeout_s: float
    settle_s: float
    state_dir: str
    deployment: str
    run_id: str
    owner: str
    hold: bool  # a group's rank: proven, it holds its lock until the whole group is
    stalled_s: float
    key_on_stdin: bool
    _api_key: Optional[str]
    success_state: Dict[str, Any]
    learned_key: str
    learned: List[Dict[str, Any]]


class LockRequest(TypedDict, total=False):
    """Which deployment's lock a step takes, for which run and command, and what it may place: `gpus` and
    `ports` are checked against the host's other deployments when `places` (a launch) is set."""

    state_dir: str
    deployment: str
    places: bool
    gpus: Optional[List[int]]
    ports: List[int]
    replace: List[str]  # the deployments this one replaces (--replace)
    run_id: str
    owner: str
    grace_s: float
    hold_s: float  # a group's prepared host: how long the lock stands with no process holding it
    command: str


class FreeRequest(TypedDict, total=False):
    """What the act step frees for a deployment: its port and GPUs, under the host's kill policy; the host
    adds what it found (fleet's recorded group, the deployments beside it and those replaced)."""

    port: Optional[int]
    bind_address: str
    gpu_devices: str
    kill_policy: str
    gpus: Optional[List[int]]
    drain_s: float
    memory_wait_s: float
    idle_mib: int
    recorded_pgid: Optional[int]
    launching: bool
    siblings: Dict[int, str]
    replaced: List[int]
    replaced_names: Dict[int, str]
    own_containers: List[str]
    cache_pgid: Optional[int]  # its weight cache daemon to stop, or the one kept (neither stopped nor waited for)
    kept_cache_pgid: Optional[int]


class Premises(TypedDict, total=False):
    """What the engine is asked of the settings fleet's keyed rules decided (fleet.plan.keyed_premises):
    the flags to drop to see its own pick, and the picks under which the plan stands as it is."""

    drop: Dict[str, List[str]]
    expect: Dict[str, List[str]]


class CheckRequest(TypedDict, total=False):
    """The engine's own check of a command line, run under `python` (or in the image, `container`);
    `picks`: also what the engine picks itself where the plan's rules were keyed on it."""

    engine: str
    python: str
    args: List[str]
    env: Dict[str, str]
    picks: Premises
    container: Dict[str, Any]
    prelude: str  # code run first (a stand-in GPU for a check off a GPU host: fleet engine audit)
    timeout_s: float
    # what each GPU must hold beside the cache's growth (weights and one prefill step's KV cache), and each
    # GPU's memory: held to the memory fraction the engine resolved, before anything is stopped
    budget: Dict[str, int]


class _WeightCacheRequired(TypedDict):
    argv: List[str]
    key: str
    ranks: int


class WeightCacheRequest(_WeightCacheRequired, total=False):
    """SGLang's weight cache daemon for the engine (fleet.plan.weight_cache): the running one if its `key`
    is the same, else one started with `argv`; `ranks`: its processes, one per GPU. `restart`: why the
    running one is started again whatever its key (it refused the last engine's configuration)."""

    restart: str


class WeightCacheEntry(LaunchedProcess, total=False):
    """A deployment's weight cache daemon in its record, exactly as its server is (`relay_from` 0: started
    by this step, its log copied into the attempt's)."""

    pgid: int
    exit_file: str
    key: str
    ranks: int
    relay_from: int


class LaunchRequest(TypedDict, total=False):
    name: str
    attempt: int
    argv: List[str]
    env: Dict[str, str]
    log_dir: str
    container: Dict[str, Any]
    weight_cache: WeightCacheRequest


class ActRequest(TypedDict, total=False):
    """The act step's request; `op` says which operation (fleet.host.act OPS): `check` (the engine's
    verdict, nothing locked), `forget` (a stopped deployment's records), `release` (its lock; with
    `abandon`: a run interrupted between steps), `prepare` (a group's host, locked, checked and its GPU
    holders sorted, nothing stopped), `launch` (`launch`: stop what is in the way, start, record) or `stop`
    (what is fleet's is stopped; `state_update`, and the lock goes with `release_lock`)."""

    op: str
    lock: LockRequest
    free: FreeRequest
    check: CheckRequest
    launch: LaunchRequest
    space: List[Any]  # (setting, path, bytes needed) before anything is stopped
    state_update: Optional[StateRecord]
    release_lock: bool
    abandon: Dict[str, float]


class ProbeRequest(TypedDict, total=False):
    """The probe's request: the facts of one host in one round trip. `container`: the image a deployment
    runs in (its engine version read from it); `reach`: an address and port to try (a group's rank 0)."""

    gpu_devices: str
    engines: Dict[str, str]
    model_path: Optional[str]
    state_dir: str
    log_dir: str
    disk_paths: List[str]
    reach: Dict[str, Any]
    container: Dict[str, Any]


class HealthRequest(ProbeRequest, total=False):
    """The health step's request: the probe's, and how each server is asked; API keys come on stdin (`_keys`)."""

    http_timeout_s: float
    generation_timeout_s: float
    skip_generation: bool
    generation_only: List[str]
    kernel_log: str  # dmesg, or a file
    keys_on_stdin: bool
    _keys: Dict[str, str]


class LogsRequest(TypedDict, total=False):
    log_dir: str
    names: List[Optional[str]]  # deployments whose logs to read; None: the host's newest
    lines: int
    follow: bool


class FixesRequest(TypedDict, total=False):
    """Forget learned fixes: those of `signature` (all when empty), for `model` (all when empty)."""

    state_dir: str
    signature: Optional[str]
    model: Optional[str]


class RouterRecord(LaunchedProcess, total=False):
    """router.json: the router fleet started for a service, exactly (a pid alone is reused), and from
    which service file; `replicas`: each replica's last good record, for a roll's rollback."""

    argv: List[str]
    source: str
    replicas: Dict[str, Any]


class ServerAnswer(TypedDict, total=False):
    """One deployment's server as health found it: process, HTTP answers, new log lines, container; or why not."""

    server: Optional[Dict[str, Any]]
    http: Dict[str, Any]
    log_lines: List[str]
    container: Dict[str, Any]
    error: str  # its record could not be checked (edited or cut short): this deployment alone
    proven: bool  # recorded unverified, it answered the prompt right: its record now says ready


class HealthAnswer(TypedDict, total=False):
    """The health step's answer: the probe's facts, each deployment's server, the kernel's new lines."""

    facts: Dict[str, Any]
    deployments: Dict[str, ServerAnswer]
    kernel: List[str]
    cpu_count: int
    mem_total_kib: int
    probe_error: str
    error: str
    bookkeeping_error: str  # health.json not kept: the same log lines are new again next time
