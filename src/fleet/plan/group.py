"""One model over several hosts (SGLang's own multi-node): the plan of each rank, and the group's pre-flight.
Pure: facts of every node in, per-rank plans and verdicts out.

Every node runs the same command with `--nnodes N --node-rank i --dist-init-addr <rank 0>:<dist_port>`;
the ranks meet at rank 0's port (torch.distributed's TCPStore), rank 0 serves HTTP, the others answer only
`/health` (SGLang's dummy health server for non-zero ranks). The GPU count the planner sees is the group's.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from fleet.crashes import Diagnosis, GiveUp, Relaunch, decide
from fleet.facts import HostFacts
from fleet.plan.types import EnvVar, Fix, Flag, LaunchPlan, Verdict, show_version

RULE = "multi-node"
GROUP_RELAUNCH = "group-member-lost"
# What a rank lost to the group looks like from the survivors (or from the rank itself): worth relaunching
LOST = {"nccl-collective-watchdog", "multinode-peer-never-joined"}
LOOPBACK = ("127.", "::1", "localhost")


@dataclass(frozen=True)
class Node:
    """One host of the group as the plan needs it."""

    rank: int
    host: str
    address: str  # where the other nodes reach it
    interface: str | None  # the interface they reach it on (GLOO_/NCCL_SOCKET_IFNAME); None: the engine picks
    interface_from: str = "inventory"  # "inventory" (network_interface:) or "route" (found on the node)

    def with_found_interface(self, found: str | None) -> Node:
        """The inventory's network_interface: wins; else the interface the node's route to rank 0 takes,
        which the facts step found (so a box with several networks does not leave Gloo to guess)."""
        if self.interface or not found or found == "lo":
            return self
        return replace(self, interface=found, interface_from="route")


def dist_init_addr(rank0: Node, port: int) -> str:
    return f"[{rank0.address}]:{port}" if ":" in rank0.address else f"{rank0.address}:{port}"


def rank_plan(plan: LaunchPlan, nodes: Sequence[Node], rank: int, dist_port: int) -> LaunchPlan:
    """Rank `rank`'s command: the group's plan with the flags and environment that make it one rank of it."""
    node, n = nodes[rank], len(nodes)
    addr = dist_init_addr(nodes[0], dist_port)
    flags = (
        Flag("--nnodes", str(n), RULE, f"the model is spread over {n} hosts ({', '.join(x.host for x in nodes)})"),
        Flag("--node-rank", str(rank), RULE, f"{node.host} is rank {rank}" + (" (serves HTTP)" if rank == 0 else "")),
        Flag(
            "--dist-init-addr",
            addr,
            RULE,
            f"every rank meets at rank 0 ({nodes[0].host}) on dist_port {dist_port}; the same for all ranks",
        ),
    )
    env = [EnvVar("SGLANG_HOST_IP", node.address, RULE, f"{node.host}'s own address, as the other ranks reach it")]
    if node.interface:
        why = (
            f"the interface {node.host} reaches the other nodes on (network_interface: in the inventory)"
            if node.interface_from == "inventory"
            else f"the interface {node.host}'s route to rank 0 takes, found on the host (network_interface: "
            "in the inventory overrides it)"
        )
        env += [
            EnvVar("GLOO_SOCKET_IFNAME", node.interface, RULE, why),
            EnvVar("NCCL_SOCKET_IFNAME", node.interface, RULE, why),
        ]
    names = {e.name for e in env}
    return replace(
        plan,
        flags=plan.flags + flags,
        env=tuple(e for e in plan.env if e.name not in names) + tuple(env),
    )


def group_preflight(
    nodes: Sequence[Node],
    facts: Sequence[HostFacts],
    plans: Sequence[LaunchPlan],
    gpus_per_node: Sequence[int],
    dist_port: int,
    engine: str,
    own_pids: Collection[int] = (),
) -> list[Verdict]:
    """What must hold across the group before anything is stopped on any node: `plans` are the group's
    plan as each node's own facts give it (before rank flags), `gpus_per_node` the GPUs each node gives
    it. Each node's facts say whether it reached rank 0's dist port: `refused` is an answer (the host is
    there, nothing listens yet); a timeout is a filter or a wrong address. `own_pids`: the processes of
    the group's own rank 0 (a redeploy stops them first)."""
    out: list[Verdict] = []
    if engine != "sglang":
        out.append(
            Verdict(
                "error",
                RULE,
                "hosts: (one model over several hosts) is supported for SGLang only: vLLM's workers run "
                "`vllm serve --headless`, another entry point than the API server fleet launches. Run vLLM on "
                "one host, or as replicas of a service.",
            )
        )
    out += _address_refusals(nodes, facts)
    out += _sameness_refusals(nodes, facts, plans, gpus_per_node, engine)
    out += _rendezvous_refusals(nodes, facts, dist_port, own_pids)
    return out


def _address_refusals(nodes: Sequence[Node], facts: Sequence[HostFacts]) -> list[Verdict]:
    """Each rank on a host of its own, reachable by the others at an address that is not loopback."""
    out: list[Verdict] = []
    missing = [n.host for n in nodes if not n.address]
    if missing:
        out.append(
            Verdict(
                "error",
                RULE,
                f"no address for {', '.join(missing)}: the other ranks must reach each node; set address: "
                "or node_address: for it in the inventory",
            )
        )
    addresses = [n.address for n in nodes if n.address]
    if len(set(addresses)) < len(addresses):
        out.append(
            Verdict(
                "error", RULE, f"two nodes have the same address ({', '.join(addresses)}); each rank needs its own host"
            )
        )
    boxes = [f.hostname for f in facts if f.hostname]
    if len(set(boxes)) < len(boxes):
        shown = ", ".join(f"{n.host}: {f.hostname}" for n, f in zip(nodes, facts, strict=True))
        out.append(
            Verdict("error", RULE, f"two inventory hosts are the same machine ({shown}); each rank needs its own")
        )
    if nodes[0].address.startswith(LOOPBACK):
        out.append(
            Verdict(
                "error",
                RULE,
                f"rank 0's address {nodes[0].address} is a loopback address: the other nodes would reach "
                "themselves; set node_address: for it in the inventory",
            )
        )
    return out


def _sameness_refusals(
    nodes: Sequence[Node],
    facts: Sequence[HostFacts],
    plans: Sequence[LaunchPlan],
    gpus_per_node: Sequence[int],
    engine: str,
) -> list[Verdict]:
    """Every rank runs one command: the same engine version, flags, model files and GPU count."""
    out: list[Verdict] = []
    versions = {n.host: show_version(p.engine_version) for n, p in zip(nodes, plans, strict=True)}
    if len(set(versions.values())) > 1:
        shown = ", ".join(f"{h} {v}" for h, v in versions.items())
        out.append(
            Verdict("error", RULE, f"the nodes run different {engine} versions ({shown}); every rank needs the same")
        )
    else:
        first = _shared_words(plans[0])
        for node, plan in zip(nodes, plans, strict=True):
            if _shared_words(plan) != first:
                out.append(
                    Verdict(
                        "error",
                        RULE,
                        f"{node.host}'s facts give another command than rank 0's ({nodes[0].host}): "
                        f"{' '.join(_shared_words(plan))} against {' '.join(first)}; every rank must run the "
                        "same one (same GPUs, same engine, same learned fixes)",
                    )
                )
                break
    shapes = {n.host: _model_shape(f) for n, f in zip(nodes, facts, strict=True)}
    if len(set(shapes.values())) > 1:
        shown = "; ".join(f"{h}: {s}" for h, s in shapes.items())
        out.append(
            Verdict(
                "error",
                RULE,
                f"the model's files differ between the nodes ({shown}); every rank loads its part of the same "
                "checkpoint: copy the same files to every node",
            )
        )
    counts = {n.host: c for n, c in zip(nodes, gpus_per_node, strict=True)}
    if len(set(counts.values())) > 1:
        shown = ", ".join(f"{h} {c}" for h, c in counts.items())
        out.append(
            Verdict("error", RULE, f"the nodes give the group different GPU counts ({shown}); each rank takes as many")
        )
    return out


def _rendezvous_refusals(
    nodes: Sequence[Node], facts: Sequence[HostFacts], dist_port: int, own_pids: Collection[int]
) -> list[Verdict]:
    """Rank 0's dist port free (but for the group's own rank 0), and reachable from every node."""
    out: list[Verdict] = []
    rank0 = facts[0]
    holder = rank0.port_holder(dist_port)
    if holder is not None and holder.pid not in own_pids:  # the group's own rank 0 is stopped, then relaunched
        out.append(
            Verdict(
                "error",
                RULE,
                f"dist_port {dist_port} on {nodes[0].host} (rank 0) is held (pid {holder.pid or 'unknown'}, "
                f"{holder.address}); the ranks meet there: stop it or choose another dist_port:",
            )
        )
    for node, f in zip(nodes, facts, strict=True):
        if f.reach not in ("open", "refused"):
            out.append(
                Verdict(
                    "error",
                    RULE,
                    f"{node.host} cannot reach rank 0 ({nodes[0].host}, {dist_init_addr(nodes[0], dist_port)}): "
                    f"{f.reach or 'not checked'}; open the port between the nodes (a firewall?) or fix node_address:",
                )
            )
    return out


# What may differ between the ranks' commands: each node's own bind address and its own models_dir
PER_NODE_FLAGS = {"--host", "--model-path", "--model"}


def _shared_words(plan: LaunchPlan) -> list[str]:
    """The command and environment every rank must share (an environment fix learned on one node too)."""
    flags = [w for f in plan.flags if f.name not in PER_NODE_FLAGS for w in f.words()]
    return flags + sorted(f"{e.name}={e.value}" for e in plan.env)


def _model_shape(facts: HostFacts) -> str:
    m = facts.model
    if m is None or not m.exists:
        return "missing"
    return f"{m.weights_bytes} bytes of weights, files {m.listing or 'unlisted'}"


def group_decision(
    diagnosis: Diagnosis,
    applied: Sequence[str],
    attempt: int,
    max_attempts: int,
    lines: Sequence[str] = (),
    host_lost: str = "",
) -> Relaunch | GiveUp:
    """The relaunch policy of a group (`lines`: the failed rank's log): a known fix as for one host; else a
    rank that was lost (a rendezvous or collective that timed out, a rank killed from outside) relaunches
    the whole group as it was, once: the group lives and dies together, and a second loss is given up.
    A rank whose host fleet lost (`host_lost`: why) is given up at once: its log says nothing of it, and
    a host that stopped answering cannot be relaunched on."""
    if host_lost:
        return GiveUp(f"fleet lost its host while watching it ({host_lost}); its engine's fate is unknown")
    decision = decide(diagnosis, applied, attempt, max_attempts)
    if isinstance(decision, Relaunch):
        return decision
    # a wrong address, a firewall or a missing interface fails the same way again: only a loss is retried
    lost = diagnosis.signature in LOST or any(x.startswith("[fleet] engine killed by signal") for x in lines)
    if not lost or GROUP_RELAUNCH in applied or attempt >= max_attempts:
        return decision
    return Relaunch(
        Fix(),
        GROUP_RELAUNCH,
        f"a rank of the group was lost ({diagnosis.explanation}); the group is restarted as a whole",
    )
