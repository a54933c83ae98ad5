"""The inventory: hosts and groups (`inventory/*.yaml`), validated before any connection is made."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, field

from fleet.errors import ConfigError
from fleet.host.procs import ip_literal
from fleet.inventory.runtime import Runtime
from fleet.inventory.strict import (
    ADDRESS_RE,
    DEVICE_GLOB_RE,
    NAME_RE,
    Engine,
    _check_name,
    _check_no_shell_meta,
    _check_remote_path,
    _config_error,
    _Invalid,
    _mapping,
    _Strict,
    _validated,
)
from fleet.yamlfile import KeyPath, YamlDoc, load_yaml

ADDRESS_WANTED = "must be a host name, IP address or ~/.ssh/config alias (no spaces or quotes)"


def _check_address(value: str) -> None:
    if not ADDRESS_RE.match(value):
        raise ValueError(ADDRESS_WANTED)
    if ":" in value:  # no host name has one: an IPv6 address, in the one spelling fleet compares
        address, percent, zone = value.partition("%")
        short = ip_literal(address) if ":" in address else None  # as the host's own tables write it
        if short is None or (percent and not zone):
            raise ValueError(ADDRESS_WANTED)
        if short != address:
            raise ValueError(f"is an IPv6 address: write it as {short}{percent}{zone}")


def _check_jump(value: str) -> None:
    """ssh's -J: a host, or host:port (an IPv6 address alone, or in brackets with a port)."""
    host, port = value, ""
    if value.startswith("[") and "]:" in value:
        host, port = value[1:].split("]:", 1)
    elif value.count(":") == 1:
        host, port = value.split(":")
    if port and not port.isdigit():
        raise ValueError(ADDRESS_WANTED)
    _check_address(host)


def _check_interface(value: str) -> None:
    # Linux limits interface names to 15 bytes; the value goes into GLOO_/NCCL_SOCKET_IFNAME as is
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,15}", value):
        raise ValueError("must be a network interface name such as eth0 or ens1f0 (at most 15 characters)")


def _check_user(value: str) -> None:
    if not NAME_RE.match(value):
        raise ValueError("must be a plain user name")


def _check_kernel_log(value: str) -> None:
    if value != "dmesg":
        _check_remote_path(value)


# A released version as pip names it (no epoch, no local +build): 0.5.23, 0.5.23rc1, 0.11.0.post1
VERSION_RE = r"(?P<release>[0-9]{1,6}(?:\.[0-9]{1,6}){0,5})(?P<suffix>(?:a|b|rc)[0-9]{1,4})?(?P<post>\.post[0-9]{1,4})?"
# `engines: {sglang: fleet}`: the environment `fleet engine use` chose; `fleet==0.5.23`: that version's
MANAGED_ENGINE_RE = re.compile(rf"^fleet(?:=={VERSION_RE})?\Z")


def canonical_version(m: re.Match[str]) -> str:
    """One spelling per version, as PEP 440 compares them (0.5.23.0 and 0.5.023 are 0.5.23; 1 and 1.0 are
    1.0.0): the name of its environment's directory."""
    release = [int(x) for x in m["release"].split(".")]
    while len(release) > 3 and release[-1] == 0:
        release.pop()
    release += [0] * (3 - len(release))
    return ".".join(map(str, release)) + (m["suffix"] or "") + (m["post"] or "")


def _check_engine_pythons(value: dict[str, str]) -> None:
    for python in value.values():
        if not MANAGED_ENGINE_RE.match(python):
            _check_remote_path(python)


def managed_python(state_dir: str, engine: str, version: str | None) -> str:
    """The Python of fleet's own environment of `engine` on a host (`fleet engine install`): the version's,
    or (no version) the one `fleet engine use` made current, through a symlink switched in one rename."""
    return f"{state_dir.rstrip('/')}/engines/{engine}-{version or 'current'}/bin/python"


def _with_managed_engines(settings: HostSettings) -> HostSettings:
    engines = {}
    for engine, python in settings.engines.items():
        m = MANAGED_ENGINE_RE.match(python)
        version = canonical_version(m) if m and m["release"] else None
        engines[engine] = managed_python(settings.state_dir, engine, version) if m else python
    return msgspec.structs.replace(settings, engines=engines)


def _check_device_glob(value: str) -> None:
    if not DEVICE_GLOB_RE.match(value) or ".." in value.split("/"):
        raise ValueError("must be an absolute glob such as /dev/nvidia*")
    # Whatever holds a matching file may be stopped as a GPU holder: /dev/nul[l] would name every process.
    if not value.rsplit("/", 1)[-1].startswith("nvidia"):
        raise ValueError("must name NVIDIA device files (their names start with nvidia), such as /dev/nvidia*")


class ExpectedGpus(_Strict, frozen=True, kw_only=True):
    """What the operator says the box has; `fleet facts`/`health` warn when the host disagrees."""

    count: Annotated[int, Meta(ge=1, le=64)]
    name_contains: str | None = None
    compute_capability: str | None = None


class HostSettings(_Strict, frozen=True, kw_only=True):
    address: str | None = None
    port: Annotated[int, Meta(ge=1, le=65535)] | None = None
    user: str | None = None
    identity_file: str | None = None
    proxy_jump: str | None = None
    connection: Literal["ssh", "local"] = "ssh"
    engines: dict[Engine, str] = field(default_factory=dict)
    models_dir: str = "/models"
    state_dir: str = "~/.fleet/state"
    log_dir: str = "~/.fleet/logs"
    gpu_devices: str = "/dev/nvidia*"
    kill_policy: Literal["safe", "force"] = "safe"
    bind_address: str = "0.0.0.0"
    connect_timeout_s: Annotated[float, Meta(gt=0, le=300)] = 10.0
    kernel_log: str = "dmesg"  # where health finds NVRM Xid / OOM-killer lines: "dmesg" or a file
    expected_gpus: ExpectedGpus | None = None
    runtime: Runtime | None = None  # process (default) or a container; a playbook's runtime: wins
    # One model over several hosts: the address the other nodes reach this one at (default: address, or
    # bind_address when it names one), and the interface they reach it on (GLOO_/NCCL_SOCKET_IFNAME)
    node_address: str | None = None
    network_interface: str | None = None

    checks = {
        "address": _check_address,
        "user": _check_user,
        "identity_file": _check_no_shell_meta,
        "proxy_jump": _check_jump,
        "engines": _check_engine_pythons,
        "models_dir": _check_remote_path,
        "state_dir": _check_remote_path,
        "log_dir": _check_remote_path,
        "gpu_devices": _check_device_glob,
        "bind_address": _check_address,
        "kernel_log": _check_kernel_log,
        "node_address": _check_address,
        "network_interface": _check_interface,
    }


@dataclass(frozen=True)
class Host:
    """One GPU box as the inventory describes it, with group and default variables merged."""

    name: str
    settings: HostSettings
    groups: tuple[str, ...]
    source: str  # "inventory/hosts.yaml:12", for messages

    @property
    def node_address(self) -> str | None:
        """Where the other nodes of a group reach this host; None when the inventory does not say."""
        s = self.settings
        if s.node_address:
            return s.node_address
        if s.address and s.connection == "ssh":
            return s.address
        return s.bind_address if s.bind_address not in ("0.0.0.0", "::") else None


@dataclass(frozen=True)
class Inventory:
    path: Path
    hosts: dict[str, Host]
    groups: dict[str, tuple[str, ...]]

    def select(self, names: list[str] | None) -> list[Host]:
        """Hosts named (host or group names); all hosts when `names` is empty."""
        if not names:
            return list(self.hosts.values())
        chosen: dict[str, Host] = {}
        for name in names:
            if name in self.hosts:
                chosen[name] = self.hosts[name]
            elif name in self.groups:
                for member in self.groups[name]:
                    chosen[member] = self.hosts[member]
            else:
                known = ", ".join(sorted([*self.hosts, *self.groups]))
                raise ConfigError(f'{self.path}: no host or group named "{name}".', f"Known names: {known}.")
        return list(chosen.values())


_HOST_KEYS = set(HostSettings.__struct_fields__)


def _check_host_keys(doc: YamlDoc, key_path: KeyPath, values: Mapping[str, object]) -> None:
    for key in values:
        if key not in _HOST_KEYS:
            raise ConfigError(
                f'{doc.where((*key_path, key))}: unknown key "{key}".',
                f"Known keys: {', '.join(sorted(_HOST_KEYS))}.",
            )


def parse_inventory(doc: YamlDoc) -> Inventory:
    top = _mapping(doc, (), doc.data, "the inventory")
    for key in top:
        if key not in ("defaults", "groups", "hosts"):
            raise ConfigError(f'{doc.where((key,))}: unknown key "{key}".', "Known keys: defaults, groups, hosts.")
    defaults = _mapping(doc, ("defaults",), top.get("defaults"), "defaults")
    _check_host_keys(doc, ("defaults",), defaults)
    raw_hosts = _mapping(doc, ("hosts",), top.get("hosts"), "hosts")
    if not raw_hosts:
        raise ConfigError(f"{doc.path}:1: no hosts defined.", "Add a hosts: mapping with at least one host.")
    raw_groups = _mapping(doc, ("groups",), top.get("groups"), "groups")

    groups: dict[str, tuple[str, ...]] = {}
    group_vars: dict[str, dict[str, Any]] = {}
    for gname, graw in raw_groups.items():
        _check_name(doc, ("groups", gname), gname, "group")
        if gname in raw_hosts:
            raise ConfigError(
                f'{doc.where(("groups", gname))}: group "{gname}" has the same name as a host '
                f"(line {doc.line_of(('hosts', gname))}).",
                "Rename one of them.",
            )
        g = _mapping(doc, ("groups", gname), graw, f'group "{gname}"')
        for key in g:
            if key not in ("hosts", "vars"):
                raise ConfigError(
                    f'{doc.where(("groups", gname, key))}: unknown key "{key}".', "Known keys: hosts, vars."
                )
        members = g.get("hosts", [])
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise ConfigError(f"{doc.where(('groups', gname, 'hosts'))}: group hosts must be a list of host names.", "")
        for i, member in enumerate(members):
            if member not in raw_hosts:
                raise ConfigError(
                    f'{doc.where(("groups", gname, "hosts", i))}: group "{gname}" lists unknown host "{member}".',
                    "Define the host under hosts: or remove it from the group.",
                )
        groups[gname] = tuple(members)
        gvars = _mapping(doc, ("groups", gname, "vars"), g.get("vars"), "vars")
        _check_host_keys(doc, ("groups", gname, "vars"), gvars)
        group_vars[gname] = gvars

    hosts: dict[str, Host] = {}
    for hname, hraw in raw_hosts.items():
        _check_name(doc, ("hosts", hname), hname, "host")
        hvars = _mapping(doc, ("hosts", hname), hraw, f'host "{hname}"')
        _check_host_keys(doc, ("hosts", hname), hvars)
        member_of = tuple(g for g, members in groups.items() if hname in members)
        merged: dict[str, Any] = {}
        origins: dict[str, int] = {}
        layers: list[tuple[KeyPath, dict[str, Any]]] = [(("defaults",), defaults)]
        layers += [(("groups", g, "vars"), group_vars[g]) for g in member_of]
        layers.append((("hosts", hname), hvars))
        for key_path, layer in layers:
            for key, value in layer.items():
                merged[key] = value
                origins[key] = doc.line_of((*key_path, key))
        try:
            settings = _with_managed_engines(_validated(HostSettings, merged))
        except _Invalid as problem:
            raise _config_error(doc, ("hosts", hname), problem, origins) from None
        if settings.connection == "ssh" and not settings.address:
            raise ConfigError(
                f'{doc.where(("hosts", hname))}: host "{hname}" has no address.',
                "Set address: (a host name, IP or ~/.ssh/config alias) or connection: local.",
            )
        hosts[hname] = Host(hname, settings, member_of, doc.where(("hosts", hname)))
    return Inventory(doc.path, hosts, groups)


def load_inventory(path: Path) -> Inventory:
    return parse_inventory(load_yaml(path))


def settings_from(data: dict[str, Any], sender: str) -> HostSettings:
    """Host settings sent as plain data (a `fleet` run asking the pool for a connection), checked as the
    inventory's are: the pool connects where they say and runs what they name."""
    try:
        return _validated(HostSettings, data)
    except _Invalid as problem:
        name = ".".join(str(p) for p in problem.loc)
        what = problem.message if problem.kind == "value" else f"is {problem.kind}"
        raise ConfigError(f'{sender}: host setting "{name}" {what}.', "") from None
