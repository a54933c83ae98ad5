"""Read a YAML file into plain data while remembering the line of every key.

Every config error fleet reports names `file:line`, so the loader keeps a map from key path
(`("hosts", "ct129", "port")`) to the 1-based line it came from. It refuses what PyYAML would
silently accept: duplicate keys (the later one wins in PyYAML), anchors/aliases (a "billion laughs"
bomb expands in memory), tags, nesting deeper than any real file, non-string keys, and oversized files.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleet.errors import ConfigError

MAX_FILE_BYTES = 1 << 20  # a hand-written inventory is a few KiB; anything bigger is a mistake

KeyPath = tuple[str | int, ...]

# One loader instance turns scalar nodes into Python values; it holds no per-document state.
_SCALARS = yaml.SafeLoader("")
# libyaml when PyYAML was built with it: the pure-Python scanner was half of a 50-host `fleet health`'s
# client CPU. Its error messages are terser, so a file it rejects is read again by the Python loader.
_FAST_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_data(text: str) -> Any:
    """Plain YAML to data (fleet's own packaged files: no line tracking needed)."""
    return yaml.load(text, Loader=_FAST_LOADER)  # noqa: S506 - a safe loader, C or Python


@dataclass(frozen=True)
class YamlDoc:
    path: Path
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line_of(self, key_path: KeyPath) -> int:
        """Line of the deepest known prefix of `key_path` (1 when nothing matches)."""
        for end in range(len(key_path), -1, -1):
            line = self.lines.get(tuple(key_path[:end]))
            if line is not None:
                return line
        return 1

    def where(self, key_path: KeyPath) -> str:
        return f"{self.path}:{self.line_of(key_path)}"


def load_yaml(path: Path, display: str | None = None) -> YamlDoc:
    shown = Path(display) if display else path
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot read ({exc.strerror}).", "Check the path.") from exc
    if size > MAX_FILE_BYTES:
        raise ConfigError(
            f"{shown}:1: file is {size} bytes, larger than the {MAX_FILE_BYTES} bytes fleet accepts.",
            "Split it or remove what is not configuration.",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{shown}:1: not UTF-8 text ({exc.reason}).", "Save the file as UTF-8.") from exc
    except OSError as exc:  # a directory, no permission
        raise ConfigError(f"{shown}: cannot read ({exc.strerror or exc}).", "Give the path of a YAML file.") from exc
    return parse_yaml(text, shown)


MAX_DEPTH = 32  # fleet's deepest file nests 5 levels; 40k levels took a minute, then a RecursionError


def _compose(text: str, shown: Path, loader: Any) -> yaml.Node | None:
    depth = 0
    for event in yaml.parse(text, Loader=loader):
        line = event.start_mark.line + 1 if event.start_mark else 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise ConfigError(
                f"{shown}:{line}: YAML anchors and aliases are not supported.",
                "Write the values out in full.",
            )
        if getattr(event, "tag", None) is not None:  # !custom, !!python/name:…: code or types, never data
            raise ConfigError(
                f"{shown}:{line}: YAML tags ({event.tag}) are not supported.",  # type: ignore[attr-defined]
                "Remove the tag; fleet's files hold plain strings, numbers, lists and mappings.",
            )
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(
                    f"{shown}:{line}: nested more than {MAX_DEPTH} levels deep.",
                    "fleet's files are shallow; remove the extra nesting.",
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    node: yaml.Node | None = yaml.compose(text, Loader=loader)
    return node


def parse_yaml(text: str, shown: Path) -> YamlDoc:
    try:
        node = _compose(text, shown, _FAST_LOADER)
    except yaml.YAMLError:
        node = None  # reported below, with the pure-Python loader's clearer message
    else:
        return _document(node, shown)
    try:
        node = _compose(text, shown, yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise ConfigError(f"{shown}:{line}: invalid YAML ({exc.problem}).", "Fix the syntax.") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{shown}:1: invalid YAML ({exc}).", "Fix the syntax.") from exc
    return _document(node, shown)


def _document(node: yaml.Node | None, shown: Path) -> YamlDoc:
    lines: dict[KeyPath, int] = {}
    if node is None:
        return YamlDoc(shown, None, lines)
    data = _to_data(node, (), lines, shown)
    return YamlDoc(shown, data, lines)


def _to_data(node: yaml.Node, key_path: KeyPath, lines: dict[KeyPath, int], shown: Path) -> Any:
    lines.setdefault(key_path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
                raise ConfigError(f"{shown}:{line}: keys must be plain strings.", "Quote the key.")
            key = key_node.value
            _refuse_hidden(key, shown, line)
            if key in seen:
                raise ConfigError(
                    f'{shown}:{line}: key "{key}" is listed twice (also line {seen[key]}).',
                    "Remove one entry.",
                )
            seen[key] = line
            lines[(*key_path, key)] = line
            out[key] = _to_data(value_node, (*key_path, key), lines, shown)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_data(item, (*key_path, i), lines, shown) for i, item in enumerate(node.value)]
    value = _SCALARS.construct_object(node)  # ints, floats, bools, null, strings
    if isinstance(value, str):
        _refuse_hidden(value, shown, node.start_mark.line + 1)
    return value


def _refuse_hidden(text: str, shown: Path, line: int) -> None:
    """A value that would not show as what it is: a control character (C0 but tab and newline, DEL, C1:
    U+009B starts a terminal sequence) or an invisible format character (bidi overrides and isolates,
    zero-width spaces and joiners, a BOM), written as is or as a YAML escape. `fleet plan` would print
    it, and a reviewer would read something else than what runs."""
    for ch in text:
        if ch in "\t\n" or unicodedata.category(ch) not in ("Cc", "Cf"):
            continue
        name = unicodedata.name(ch, "a control character")
        raise ConfigError(
            f"{shown}:{line}: a value contains U+{ord(ch):04X} ({name}), which does not show as what it is.",
            "Remove it (retype the value); fleet accepts only visible characters, tabs and newlines.",
        )
