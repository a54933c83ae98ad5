"""What every inventory and playbook value goes through: strict types (msgspec), checks beyond the type,
and errors that name file:line, the field, what is wrong and what to do."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, TypeVar

import msgspec

from fleet.errors import ConfigError
from fleet.yamlfile import KeyPath, YamlDoc

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")  # \Z: "$" also matches before a newline
# a leading ':' is an IPv6 address (::1); never a leading '-', which ssh would read as an option
ADDRESS_RE = re.compile(r"^[A-Za-z0-9:][A-Za-z0-9_.:%-]{0,252}\Z")
REMOTE_PATH_RE = re.compile(r"^(~/|/)[A-Za-z0-9._/+@-]*\Z")
DEVICE_GLOB_RE = re.compile(r"^/[A-Za-z0-9._/+@*?\[\]-]*\Z")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
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


StrictT = TypeVar("StrictT", bound=_Strict)


class _Invalid(Exception):
    """One problem in a mapping being validated: where (`loc`, as keys and list indexes), and what."""

    def __init__(self, loc: tuple[str | int, ...], kind: Literal["unknown", "missing", "value"], message: str) -> None:
        super().__init__(message)
        self.loc, self.kind, self.message = loc, kind, message


def _validated(cls: type[StrictT], data: Mapping[str, object]) -> StrictT:
    """`data` as a `cls`, or `_Invalid` naming the first problem: types and ranges first, then `checks`."""
    try:
        value = msgspec.convert(data, cls, strict=True)
    except msgspec.ValidationError as exc:
        raise _explained(cls, data, str(exc)) from None
    _run_checks(value, ())
    return value


def _run_checks(value: _Strict, loc: tuple[str | int, ...]) -> None:
    """Each field's `checks`, then the struct's `check_together`, in nested structs (and lists of them)
    too, their problems located from the top."""
    for name in value.__struct_fields__:
        item = getattr(value, name)
        if isinstance(item, _Strict):
            _run_checks(item, (*loc, name))
            continue
        if isinstance(item, list):
            for i, element in enumerate(item):
                if isinstance(element, _Strict):
                    _run_checks(element, (*loc, name, i))
        if item is not None and name in value.checks:
            try:
                value.checks[name](item)
            except ValueError as exc:
                raise _Invalid((*loc, name), "value", f"{exc}{_shown(item)}") from None
    together = getattr(value, "check_together", None)
    if together is not None:
        try:
            together()
        except _Invalid as problem:
            raise _Invalid((*loc, *problem.loc), problem.kind, problem.message) from None


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
        known = ", ".join(sorted(_type_at(cls, loc, mapping=True).__struct_fields__))
        return _Invalid((*loc, found[1]), "unknown", f"Known keys: {known}.")
    if found := re.match(r"Object missing required field `(.+)`$", what):
        return _Invalid((*loc, found[1]), "missing", "")
    if found := re.match(r"Invalid enum value (.+)$", what):
        literal = _type_at(cls, loc)
        choices = ", ".join(repr(c) for c in typing.get_args(typing.get_args(literal)[0] if is_key else literal))
        subject = "has a key that must be" if is_key else "must be"
        if not is_key and _type_at(cls, loc, mapping=True) is not literal:  # "process" or a mapping (runtime:)
            return _Invalid(loc, "value", f"must be {choices} or a mapping (got {found[1]})")
        others = _other_kinds(cls, loc) if not is_key else ""
        if others:  # "fit" or a count or a list (gpus:)
            return _Invalid(loc, "value", f"must be {choices}, {others} (got {found[1]})")
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


def _type_at(cls: type[_Strict], loc: tuple[str | int, ...], *, mapping: bool = False) -> Any:
    """The type declared at `loc` (list indexes skipped, `X | None` read as X; of `"word" | Struct`, the
    struct when keys follow or `mapping` asks for it, else the word)."""
    kind: Any = cls
    for i, part in enumerate(loc):
        if isinstance(part, str):
            kind = typing.get_type_hints(kind)[part]
        elif typing.get_origin(kind) is list:  # an index into a list of structs (replicas: [{host: a}])
            kind = typing.get_args(kind)[0]
        if typing.get_origin(kind) in (types.UnionType, typing.Union):
            options = [k for k in typing.get_args(kind) if k is not type(None)]
            structs = [k for k in options if isinstance(k, type) and issubclass(k, _Strict)]
            lists = [k for k in options if typing.get_origin(k) is list]
            keys_follow = any(isinstance(p, str) for p in loc[i + 1 :])
            if lists and i + 1 < len(loc) and isinstance(loc[i + 1], int):  # `3 | [{host: a}]`, indexed
                kind = lists[0]
            else:
                kind = structs[0] if structs and (keys_follow or mapping) else options[0]
    return kind


def _other_kinds(cls: type[_Strict], loc: tuple[str | int, ...]) -> str:
    """Besides its words, what else a field's union takes, in words ("an integer or a list"), or ""."""
    if not loc or not isinstance(loc[-1], str):
        return ""
    declared = typing.get_type_hints(_type_at(cls, loc[:-1], mapping=True) if loc[:-1] else cls).get(loc[-1])
    kinds = [typing.get_origin(k) or k for k in typing.get_args(declared) if k is not type(None)]
    words = [w for k in kinds if (w := {int: "an integer", list: "a list", float: "a number"}.get(k))]
    return " or ".join(words)


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


def parse_document(doc: YamlDoc, cls: type[StrictT], what: str, example: str) -> tuple[StrictT, dict[str, int]]:
    """A whole file (a playbook, a service) as a `cls`, and the line of each top-level key; a problem is a
    ConfigError naming file:line."""
    data = _mapping(doc, (), doc.data, f"a {what}")
    if not data:
        raise ConfigError(f"{doc.path}:1: the {what} is empty.", f"See {example} for an example.")
    origins = {key: doc.line_of((key,)) for key in data}
    try:
        return _validated(cls, data), origins
    except _Invalid as problem:
        raise _config_error(doc, (), problem, origins) from None


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
