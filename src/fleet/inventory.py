"""Load and validate `inventory/*.yaml` and `playbooks/*.yaml` before any connection is made.

Every error names `file:line`, the field, what is wrong and what to do. Unknown keys are errors.
Values that end up on a remote command line are restricted to characters that cannot be read as
shell syntax, even though fleet also quotes everything it sends.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fleet.errors import ConfigError
from fleet.yamlfile import KeyPath, YamlDoc, load_yaml

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
ADDRESS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:%-]{0,252}$")
REMOTE_PATH_RE = re.compile(r"^(~/|/)[A-Za-z0-9._/+@-]*$")
DEVICE_GLOB_RE = re.compile(r"^/[A-Za-z0-9._/+@*?\[\]-]*$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Characters a shell would interpret; refused in values that reach the host even though they are quoted.
SHELL_META = set(";&|`$<>\\'\n\r\x00")

Engine = Literal["sglang", "vllm"]


def _check_remote_path(value: str) -> str:
    if not REMOTE_PATH_RE.match(value):
        raise ValueError("must be an absolute path (or start with ~/) made of letters, digits and ._/+@-")
    if ".." in value.split("/"):
        raise ValueError("must not contain '..' components")
    return value


def _check_no_shell_meta(value: str) -> str:
    bad = sorted({c for c in value if c in SHELL_META or (ord(c) < 32 and c != "\t")})
    if bad:
        raise ValueError(f"contains characters fleet refuses to send to a host: {''.join(map(repr, bad))}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ExpectedGpus(_Strict):
    """What the operator says the box has; `fleet facts`/`health` warn when the host disagrees."""

    count: Annotated[int, Field(ge=1, le=64)]
    name_contains: str | None = None
    compute_capability: str | None = None


class HostSettings(_Strict):
    address: str | None = None
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    user: str | None = None
    identity_file: str | None = None
    proxy_jump: str | None = None
    connection: Literal["ssh", "local"] = "ssh"
    engines: dict[Engine, str] = Field(default_factory=dict)
    models_dir: str = "/models"
    state_dir: str = "~/.fleet/state"
    log_dir: str = "~/.fleet/logs"
    gpu_devices: str = "/dev/nvidia*"
    kill_policy: Literal["safe", "force"] = "safe"
    bind_address: str = "0.0.0.0"
    connect_timeout_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    kernel_log: str = "dmesg"  # where health finds NVRM Xid / OOM-killer lines: "dmesg" or a file
    expected_gpus: ExpectedGpus | None = None

    @field_validator("address", "proxy_jump", "bind_address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None and not ADDRESS_RE.match(value):
            raise ValueError("must be a host name, IP address or ~/.ssh/config alias (no spaces or quotes)")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None and not NAME_RE.match(value):
            raise ValueError("must be a plain user name")
        return value

    @field_validator("identity_file")
    @classmethod
    def _identity(cls, value: str | None) -> str | None:
        return None if value is None else _check_no_shell_meta(value)

    @field_validator("models_dir", "state_dir", "log_dir")
    @classmethod
    def _paths(cls, value: str) -> str:
        return _check_remote_path(value)

    @field_validator("kernel_log")
    @classmethod
    def _kernel_log(cls, value: str) -> str:
        return value if value == "dmesg" else _check_remote_path(value)

    @field_validator("engines")
    @classmethod
    def _engine_pythons(cls, value: dict[str, str]) -> dict[str, str]:
        for python in value.values():
            _check_remote_path(python)
        return value

    @field_validator("gpu_devices")
    @classmethod
    def _glob(cls, value: str) -> str:
        if not DEVICE_GLOB_RE.match(value) or ".." in value.split("/"):
            raise ValueError("must be an absolute glob such as /dev/nvidia*")
        return value


@dataclass(frozen=True)
class Host:
    """One GPU box as the inventory describes it, with group and default variables merged."""

    name: str
    settings: HostSettings
    groups: tuple[str, ...]
    source: str  # "inventory/hosts.yaml:12", for messages


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


_HOST_KEYS = set(HostSettings.model_fields)


def _pydantic_error(
    doc: YamlDoc, key_base: KeyPath, err: ValidationError, origins: Mapping[str, int], known: str
) -> ConfigError:
    """The first pydantic error as `file:line: field "x" <what>`. `origins`: line each merged key came from."""
    first = err.errors()[0]
    loc = tuple(first["loc"])
    field = ".".join(str(p) for p in loc) or "(top)"
    exact = doc.lines.get((*key_base, *loc)) if len(loc) > 1 else None
    line = exact or (origins.get(str(loc[0])) if loc else None)
    where = f"{doc.path}:{line}" if line else doc.where((*key_base, *loc))
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        return ConfigError(f'{where}: unknown key "{field}".', f"Known keys: {known}." if known else "Remove it.")
    if first["type"] == "missing":
        return ConfigError(f'{where}: required field "{field}" is missing.', "Add it.")
    value = first.get("input")
    shown = f" (got {value!r})" if isinstance(value, str | int | float | bool) and len(repr(value)) < 80 else ""
    return ConfigError(f'{where}: field "{field}" {message}{shown}.', "Correct the value.")


def _mapping(doc: YamlDoc, key_path: KeyPath, value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{doc.where(key_path)}: {what} must be a mapping.", "Indent its keys under it.")
    return value


def _check_name(doc: YamlDoc, key_path: KeyPath, name: str, what: str) -> None:
    if not NAME_RE.match(name):
        raise ConfigError(
            f'{doc.where(key_path)}: {what} name "{name}" is not allowed.',
            "Use letters, digits, '.', '_' and '-' (at most 63, starting with a letter or digit).",
        )


def _check_host_keys(doc: YamlDoc, key_path: KeyPath, values: dict[str, Any]) -> None:
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
            settings = HostSettings.model_validate(merged)
        except ValidationError as exc:
            raise _pydantic_error(doc, ("hosts", hname), exc, origins, ", ".join(sorted(_HOST_KEYS))) from None
        if settings.connection == "ssh" and not settings.address:
            raise ConfigError(
                f'{doc.where(("hosts", hname))}: host "{hname}" has no address.',
                "Set address: (a host name, IP or ~/.ssh/config alias) or connection: local.",
            )
        hosts[hname] = Host(hname, settings, member_of, doc.where(("hosts", hname)))
    return Inventory(doc.path, hosts, groups)


def load_inventory(path: Path) -> Inventory:
    return parse_inventory(load_yaml(path))


# --- playbooks -------------------------------------------------------------------------------------


class Smoke(_Strict):
    """A prompt whose answer proves the server really generates (not only that /health says 200)."""

    prompt: Annotated[str, Field(min_length=1, max_length=2000)]
    expect: Annotated[str, Field(min_length=1, max_length=200)]  # a regex the answer must match
    max_tokens: Annotated[int, Field(ge=1, le=512)] = 16

    @field_validator("expect")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"is not a valid regular expression ({exc})") from exc
        return value


class Speculative(_Strict):
    """Speculative decoding with the model's own MTP heads (SGLang NEXTN, vLLM `mtp`)."""

    enabled: bool = True
    steps: Annotated[int, Field(ge=1, le=16)] = 1
    topk: Annotated[int, Field(ge=1, le=16)] = 1


class Playbook(_Strict):
    engine: Engine
    model: str
    served_name: str
    default_host: str | None = None
    port: Annotated[int, Field(ge=1024, le=65535)] = 30000
    speculative: Speculative | None = None
    context_length: Annotated[int, Field(ge=256, le=10_000_000)] | None = None
    mem_fraction: Annotated[float, Field(gt=0.05, lt=1.0)] | None = None
    tp: Annotated[int, Field(ge=1, le=64)] | None = None
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    secret_env: list[str] = Field(default_factory=list)
    smoke: Smoke
    literal: bool = False  # run extra_args as written (the hand-written command); rules only warn
    ready_timeout_s: Annotated[float, Field(gt=0, le=7200)] = 900.0
    max_attempts: Annotated[int, Field(ge=1, le=10)] = 4

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if value.startswith(("/", "~/")):
            return _check_remote_path(value)
        return _check_remote_path("/" + value)[1:]

    @field_validator("served_name")
    @classmethod
    def _served(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$", value):
            raise ValueError("must be letters, digits and ._:/- (at most 128)")
        return value

    @field_validator("default_host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        if value is not None and not NAME_RE.match(value):
            raise ValueError("must be a host name from the inventory")
        return value

    @field_validator("extra_args")
    @classmethod
    def _args(cls, value: list[str]) -> list[str]:
        for arg in value:
            _check_no_shell_meta(arg)
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name, val in value.items():
            if not ENV_NAME_RE.match(name):
                raise ValueError(f"has an invalid variable name {name!r}")
            _check_no_shell_meta(val)
        return value

    @field_validator("secret_env")
    @classmethod
    def _secret_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not ENV_NAME_RE.match(name):
                raise ValueError(f"has an invalid variable name {name!r}")
        return value


@dataclass(frozen=True)
class NamedPlaybook:
    name: str
    path: Path
    spec: Playbook


def parse_playbook(doc: YamlDoc, name: str) -> NamedPlaybook:
    data = _mapping(doc, (), doc.data, "a playbook")
    if not data:
        raise ConfigError(f"{doc.path}:1: the playbook is empty.", "See playbooks/qwen36-27b.yaml for an example.")
    origins = {key: doc.line_of((key,)) for key in data}
    try:
        spec = Playbook.model_validate(data)
    except ValidationError as exc:
        raise _pydantic_error(doc, (), exc, origins, ", ".join(sorted(Playbook.model_fields))) from None
    return NamedPlaybook(name, doc.path, spec)


def load_playbook(ref: str, playbook_dir: Path) -> NamedPlaybook:
    """`ref` is a playbook name (`qwen35-nvfp4` → playbooks/qwen35-nvfp4.yaml) or a path to a YAML file."""
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        path = Path(ref)
        name = path.stem
    else:
        if not NAME_RE.match(ref):
            raise ConfigError(f'playbook "{ref}": not a valid playbook name.', "Use a name from playbooks/.")
        path = playbook_dir / f"{ref}.yaml"
        name = ref
        if not path.exists():
            known = sorted(p.stem for p in playbook_dir.glob("*.yaml")) if playbook_dir.is_dir() else []
            raise ConfigError(
                f'playbook "{ref}": no file {path}.',
                f"Known playbooks: {', '.join(known) or '(none)'}.",
            )
    return parse_playbook(load_yaml(path), name)


def check_playbook_host(playbook: NamedPlaybook, inventory: Inventory) -> None:
    host = playbook.spec.default_host
    if host is not None and host not in inventory.hosts:
        raise ConfigError(
            f'{playbook.path}: default_host "{host}" is not in {inventory.path}.',
            f"Known hosts: {', '.join(sorted(inventory.hosts))}.",
        )
