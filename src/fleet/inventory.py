"""Load and validate `inventory/*.yaml` and `playbooks/*.yaml` before any connection is made.

Every error names `file:line`, the field, what is wrong and what to do. Unknown keys are errors.
Values that end up on a remote command line are restricted to characters that cannot be read as
shell syntax, even though fleet also quotes everything it sends.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import msgspec
from msgspec import Meta, field

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


def _check_remote_path(value: str) -> None:
    if not REMOTE_PATH_RE.match(value):
        raise ValueError("must be an absolute path (or start with ~/) made of letters, digits and ._/+@-")
    if ".." in value.split("/"):
        raise ValueError("must not contain '..' components")


def _check_no_shell_meta(value: str) -> None:
    bad = sorted({c for c in value if c in SHELL_META or (ord(c) < 32 and c != "\t")})
    if bad:
        raise ValueError(f"contains characters fleet refuses to send to a host: {''.join(map(repr, bad))}")


class _Strict(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Strictly typed (no "22" for 22), unknown keys refused. msgspec rather than pydantic: it imports in
    ~10 ms instead of ~0.1 s, and cron starts `fleet health` every minute.

    `checks`: what a field's value must satisfy beyond its type, run by `_validated` after conversion
    (a check raises ValueError with the message the user sees). Subclasses repeat `frozen` and `kw_only`
    for type checkers; msgspec would inherit them."""

    checks: ClassVar[Mapping[str, Callable[[Any], object]]] = {}


def _check_address(value: str) -> None:
    if not ADDRESS_RE.match(value):
        raise ValueError("must be a host name, IP address or ~/.ssh/config alias (no spaces or quotes)")


def _check_user(value: str) -> None:
    if not NAME_RE.match(value):
        raise ValueError("must be a plain user name")


def _check_kernel_log(value: str) -> None:
    if value != "dmesg":
        _check_remote_path(value)


def _check_engine_pythons(value: dict[str, str]) -> None:
    for python in value.values():
        _check_remote_path(python)


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

    checks = {
        "address": _check_address,
        "user": _check_user,
        "identity_file": _check_no_shell_meta,
        "proxy_jump": _check_address,
        "engines": _check_engine_pythons,
        "models_dir": _check_remote_path,
        "state_dir": _check_remote_path,
        "log_dir": _check_remote_path,
        "gpu_devices": _check_device_glob,
        "bind_address": _check_address,
        "kernel_log": _check_kernel_log,
    }


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


_HOST_KEYS = set(HostSettings.__struct_fields__)


StrictT = TypeVar("StrictT", bound=_Strict)


class _Invalid(Exception):
    """One problem in a mapping being validated: where (`loc`, as keys and list indexes), and what."""

    def __init__(self, loc: tuple[str | int, ...], kind: Literal["unknown", "missing", "value"], message: str) -> None:
        super().__init__(message)
        self.loc, self.kind, self.message = loc, kind, message


def _validated(cls: type[StrictT], data: dict[str, Any]) -> StrictT:
    """`data` as a `cls`, or `_Invalid` naming the first problem: types and ranges first, then `checks`."""
    try:
        value = msgspec.convert(data, cls, strict=True)
    except msgspec.ValidationError as exc:
        raise _explained(cls, data, str(exc)) from None
    _run_checks(value, ())
    together = getattr(value, "check_together", None)
    if together is not None:
        together()
    return value


def _run_checks(value: _Strict, loc: tuple[str | int, ...]) -> None:
    for name in value.__struct_fields__:
        item = getattr(value, name)
        if isinstance(item, _Strict):
            _run_checks(item, (*loc, name))
        elif item is not None and name in value.checks:
            try:
                value.checks[name](item)
            except ValueError as exc:
                raise _Invalid((*loc, name), "value", f"{exc}{_shown(item)}") from None


# msgspec's messages: "<what> - at `$.a.b[0]`", or "- at `key` in `$.a`" for a mapping's key.
_MSGSPEC_ERROR = re.compile(r"^(?P<what>.*?)(?: - at `(?P<at>[^`]*)`(?: in `(?P<within>[^`]*)`)?)?$", re.S)
_PATH_PART = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[\.\.\.\]")
_TYPE_WORDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
               "object": "a mapping", "array": "a list", "null": "empty"}  # fmt: skip
_BOUND_WORDS = {">=": "at least", "<=": "at most", ">": "greater than", "<": "less than"}


def _explained(cls: type[_Strict], data: Any, error: str) -> _Invalid:
    """msgspec's error as `_Invalid` in fleet's words (msgspec keeps no structured location)."""
    m = _MSGSPEC_ERROR.match(error)
    what, at, within = (m["what"], m["at"] or "$", m["within"]) if m else (error, "$", None)
    is_key = within is not None
    loc = tuple(int(index) if index else name for name, index in _PATH_PART.findall(within or at) if name or index)
    if found := re.match(r"Object contains unknown field `(.+)`$", what):
        known = ", ".join(sorted(_type_at(cls, loc).__struct_fields__))
        return _Invalid((*loc, found[1]), "unknown", f"Known keys: {known}.")
    if found := re.match(r"Object missing required field `(.+)`$", what):
        return _Invalid((*loc, found[1]), "missing", "")
    if found := re.match(r"Invalid enum value (.+)$", what):
        literal = _type_at(cls, loc)
        choices = ", ".join(repr(c) for c in typing.get_args(typing.get_args(literal)[0] if is_key else literal))
        subject = "has a key that must be" if is_key else "must be"
        return _Invalid(loc, "value", f"{subject} one of {choices} (got {found[1]})")
    value = _value_at(data, loc)
    if found := re.match(r"Expected `([^`]+)`, got `", what):
        wanted = " or ".join(_TYPE_WORDS.get(t, t) for t in found[1].split(" | ") if t != "null")
        return _Invalid(loc, "value", f"must be {wanted}{_shown(value)}")
    if what == "Expected `str` of length >= 1":
        return _Invalid(loc, "value", f"must not be empty{_shown(value)}")
    if found := re.match(r"Expected `str` of length (>=|<=) (\d+)$", what):
        return _Invalid(loc, "value", f"must be {_BOUND_WORDS[found[1]]} {found[2]} characters long{_shown(value)}")
    if found := re.match(r"Expected `\w+` (>=|<=|>|<) (\S+)$", what):
        bound = found[2].removesuffix(".0")
        return _Invalid(loc, "value", f"must be {_BOUND_WORDS[found[1]]} {bound}{_shown(value)}")
    return _Invalid(loc, "value", what)


def _value_at(data: Any, loc: tuple[str | int, ...]) -> Any:
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _type_at(cls: type[_Strict], loc: tuple[str | int, ...]) -> Any:
    """The type declared at `loc` (list indexes skipped, `X | None` read as X)."""
    kind: Any = cls
    for part in loc:
        if isinstance(part, str):
            kind = typing.get_type_hints(kind)[part]
        if typing.get_origin(kind) in (types.UnionType, typing.Union):
            kind = next(k for k in typing.get_args(kind) if k is not type(None))
    return kind


def _shown(value: Any) -> str:
    small = isinstance(value, str | int | float | bool) and len(repr(value)) < 80
    return f" (got {value!r})" if small else ""


def _config_error(doc: YamlDoc, key_base: KeyPath, problem: _Invalid, origins: Mapping[str, int]) -> ConfigError:
    """`problem` as `file:line: field "x" <what>`. `origins`: line each merged key came from."""
    loc = problem.loc
    name = ".".join(str(p) for p in loc) or "(top)"
    exact = doc.lines.get((*key_base, *loc)) if len(loc) > 1 else None
    line = exact or (origins.get(str(loc[0])) if loc else None)
    where = f"{doc.path}:{line}" if line else doc.where((*key_base, *loc))
    if problem.kind == "unknown":
        return ConfigError(f'{where}: unknown key "{name}".', problem.message)
    if problem.kind == "missing":
        return ConfigError(f'{where}: required field "{name}" is missing.', "Add it.")
    return ConfigError(f'{where}: field "{name}" {problem.message}.', "Correct the value.")


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
            settings = _validated(HostSettings, merged)
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


# --- playbooks -------------------------------------------------------------------------------------


def _check_regex(value: str) -> None:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"is not a valid regular expression ({exc})") from exc
    if _backtracks_exponentially(value):
        raise ValueError(
            "repeats a group that itself repeats or has alternatives (like (a+)+ or (.|.)*), which can take "
            "hours to match; write it without the nested repetition"
        )


def _backtracks_exponentially(pattern: str) -> bool:
    """A repeated piece that can itself match in several ways (an inner repeat or alternation) makes
    Python's backtracking matcher exponential on a near miss: `^(.|.|.)*\\d$` hung deploy and left a
    host process spinning. Refused when the playbook is read; the match itself runs on the host."""
    from re import _parser  # type: ignore[attr-defined]  # the stdlib regex parser (sre_parse), walked

    def walk(items: Any, inside_repeat: bool) -> bool:
        for op, arg in items:
            name = str(op)
            if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                low, high, sub = arg
                repeats = high is _parser.MAXREPEAT or high > 1
                if inside_repeat and repeats:
                    return True
                if walk(sub, inside_repeat or repeats):
                    return True
            elif name == "BRANCH":
                if inside_repeat or any(walk(branch, inside_repeat) for branch in arg[1]):
                    return True
            elif name in ("SUBPATTERN", "ASSERT", "ASSERT_NOT") and walk(arg[-1], inside_repeat):
                return True
        return False

    return walk(_parser.parse(pattern), False)


class Smoke(_Strict, frozen=True, kw_only=True):
    """A prompt whose answer proves the server really generates (not only that /health says 200)."""

    prompt: Annotated[str, Meta(min_length=1, max_length=2000)]
    expect: Annotated[str, Meta(min_length=1, max_length=200)]  # a regex the answer must match
    max_tokens: Annotated[int, Meta(ge=1, le=512)] = 16

    checks = {"expect": _check_regex}


class Speculative(_Strict, frozen=True, kw_only=True):
    """Speculative decoding with the model's own MTP heads (SGLang NEXTN, vLLM `mtp`)."""

    enabled: bool = True
    steps: Annotated[int, Meta(ge=1, le=16)] = 1
    topk: Annotated[int, Meta(ge=1, le=16)] = 1


def _check_model(value: str) -> None:
    _check_remote_path(value if value.startswith(("/", "~/")) else "/" + value)


def _check_served_name(value: str) -> None:
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$", value):
        raise ValueError("must be letters, digits and ._:/- (at most 128)")


def _check_host_name(value: str) -> None:
    if not NAME_RE.match(value):
        raise ValueError("must be a host name from the inventory")


def _check_args(value: list[str]) -> None:
    for arg in value:
        _check_no_shell_meta(arg)


# Flags fleet writes itself from the playbook and the inventory, and checks (port free, model files, the
# address it probes): an extra_args copy would win in the engine's parser and run something unchecked.
FLEET_OWNED_FLAGS = {
    "--model-path": "model:",
    "--model": "model:",
    "--served-model-name": "served_name:",
    "--host": "bind_address: in the inventory",
    "--port": "port:",
}


# The launch command travels as one argument of the remote step: past ~128 KiB the kernel refuses it
# ("Argument list too long"), after the old server was stopped. Real flags are far shorter.
MAX_EXTRA_ARG_BYTES = 4096
MAX_EXTRA_ARGS_BYTES = 32768


def _check_extra_args(value: list[str]) -> None:
    _check_args(value)
    for i, arg in enumerate(value):
        if len(arg.encode()) > MAX_EXTRA_ARG_BYTES:
            raise ValueError(
                f"item {i + 1} is {len(arg.encode())} bytes, more than the {MAX_EXTRA_ARG_BYTES} a flag may take; "
                "put long values (templates, JSON) in a file on the host and pass its path"
            )
    total = sum(len(a.encode()) + 1 for a in value)
    if total > MAX_EXTRA_ARGS_BYTES:
        raise ValueError(f"is {total} bytes in all, more than the {MAX_EXTRA_ARGS_BYTES} fleet accepts")
    for arg in value:
        flag = arg.partition("=")[0]
        # argparse also takes an unambiguous prefix (`--por` for --port), as SGLang's parser does
        prefixed = (f for f in FLEET_OWNED_FLAGS if len(flag) > 3 and f.startswith(flag))
        owned = flag if flag in FLEET_OWNED_FLAGS else next(prefixed, None)
        if owned and flag.startswith("--"):
            raise ValueError(f"sets {owned}, which fleet sets itself; use {FLEET_OWNED_FLAGS[owned]} instead")


def _check_env_names(names: Iterable[str]) -> None:
    for name in names:
        if not ENV_NAME_RE.match(name):
            raise ValueError(f"has an invalid variable name {name!r}")


# Variables that change which program, library or startup code runs (the loader's, the interpreter's,
# the shell's): a playbook sets one only when it also lists it in allow_runtime_env.
RUNTIME_ENV = frozenset(
    {
        "PATH",
        "HOME",  # moves Python's user site-packages (a .pth there runs code) and every dotfile read
        "PYTHONPATH",
        "PYTHONWARNINGS",  # imports the module a warning filter names
        "PYTHONBREAKPOINT",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONEXECUTABLE",
        "PYTHONPLATLIBDIR",
        "PYTHONINSPECT",
        "BASH_ENV",
        "ENV",
        "IFS",
        "SHELLOPTS",
        "BASHOPTS",
        "GCONV_PATH",
    }
)


def changes_what_runs(name: str) -> bool:
    return name in RUNTIME_ENV or name.startswith(("LD_", "DYLD_"))


def _check_env(value: dict[str, str]) -> None:
    _check_env_names(value)
    _check_args(list(value.values()))


class Playbook(_Strict, frozen=True, kw_only=True):
    engine: Engine
    model: str
    served_name: str
    default_host: str | None = None
    port: Annotated[int, Meta(ge=1024, le=65535)] = 30000
    speculative: Speculative | None = None
    context_length: Annotated[int, Meta(ge=256, le=10_000_000)] | None = None
    mem_fraction: Annotated[float, Meta(gt=0.05, lt=1.0)] | None = None
    tp: Annotated[int, Meta(ge=1, le=64)] | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    allow_runtime_env: list[str] = field(default_factory=list)  # the opt-in for PATH, LD_*, PYTHONPATH...
    secret_env: list[str] = field(default_factory=list)
    smoke: Smoke
    literal: bool = False  # run extra_args as written (the hand-written command); rules only warn
    ready_timeout_s: Annotated[float, Meta(gt=0, le=7200)] = 900.0
    max_attempts: Annotated[int, Meta(ge=1, le=10)] = 4

    checks = {
        "model": _check_model,
        "served_name": _check_served_name,
        "default_host": _check_host_name,
        "extra_args": _check_extra_args,
        "env": _check_env,
        "allow_runtime_env": _check_env_names,
        "secret_env": _check_env_names,
    }

    def check_together(self) -> None:
        allowed = set(self.allow_runtime_env)
        for key, names in (("env", list(self.env)), ("secret_env", self.secret_env)):
            for name in names:
                if changes_what_runs(name) and name not in allowed:
                    raise _Invalid(
                        (key, name) if key == "env" else (key,),
                        "value",
                        f"sets {name}, which changes what program, library or startup code runs; if that is "
                        f"intended, list it in allow_runtime_env: [{name}] too",
                    )


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
        spec = _validated(Playbook, data)
    except _Invalid as problem:
        raise _config_error(doc, (), problem, origins) from None
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
