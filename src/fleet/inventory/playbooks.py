"""Playbooks (`playbooks/*.yaml`): what to serve and how, validated with file:line errors."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path
from typing import Annotated, Any, Literal

from msgspec import Meta, field

from fleet.errors import ConfigError
from fleet.inventory.hosts import Inventory
from fleet.inventory.runtime import Runtime
from fleet.inventory.strict import (
    ENV_NAME_RE,
    NAME_RE,
    Engine,
    _check_no_shell_meta,
    _check_remote_path,
    _Invalid,
    _Strict,
    parse_document,
)
from fleet.yamlfile import YamlDoc, load_yaml


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


# Answers that say nothing: an expect that matches one of them proves nothing about the server (`Paris|`
# matches the empty string, `.` any garbage), so a broken server answering noise would be called up.
_NOTHING_ANSWERS = ("", " ", "\n", "0", "zqxjv", "!!!!", "\ufffd\ufffd", "<unk><unk>", "null")


# An answer shorter than this proves nothing either: one or two letters turn up in any text a broken model
# writes (`e`, `(?i)hi`, `4`).
MIN_EXPECT_CHARS = 3


def _matched_nothing_answer(expect: str) -> str | None:
    """How an answer that says nothing still satisfies `expect`, if one can."""
    from re import _parser  # type: ignore[attr-defined]

    said = next((repr(a) for a in _NOTHING_ANSWERS if re.search(expect, a)), None)
    shortest = _parser.parse(expect).getwidth()[0]
    return said or (f"any answer holding {shortest} chosen characters" if shortest < MIN_EXPECT_CHARS else None)


class Smoke(_Strict, frozen=True, kw_only=True):
    """A prompt whose answer proves the server really generates (not only that /health says 200)."""

    prompt: Annotated[str, Meta(min_length=1, max_length=2000)]
    expect: Annotated[str, Meta(min_length=1, max_length=200)]  # a regex the answer must match
    max_tokens: Annotated[int, Meta(ge=1, le=512)] = 16
    # A model with random (dummy) weights answers noise: only then may `expect` match any answer, and the
    # playbook says so here. Otherwise an expect that an empty or garbage answer satisfies is refused.
    any_answer: bool = False

    checks = {"expect": _check_regex}

    def __post_init__(self) -> None:
        try:
            _check_regex(self.expect)
        except ValueError:
            return  # said by the field's own check, with its line: nothing is matched with it here
        said = None if self.any_answer else _matched_nothing_answer(self.expect)
        if said is not None:
            raise ValueError(
                f"expect {self.expect!r} matches an answer that says nothing ({said}), so it cannot prove the "
                f"server generates; write words of {MIN_EXPECT_CHARS} or more letters a right answer contains "
                "(expect: Paris), or set any_answer: true "
                "for a model with random weights"
            )


class Speculative(_Strict, frozen=True, kw_only=True):
    """Speculative decoding with the model's own MTP heads (SGLang NEXTN, vLLM `mtp`)."""

    enabled: bool = True
    steps: Annotated[int, Meta(ge=1, le=16)] = 1
    topk: Annotated[int, Meta(ge=1, le=16)] = 1


def _check_parser_name(value: str) -> None:
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z", value):
        raise ValueError("must be an engine's parser name: letters, digits and ._- (at most 64), e.g. qwen3")


class Parsers(_Strict, frozen=True, kw_only=True):
    """The engine's reasoning and tool-call output parsers, by the engine's own names (the engine's check on
    the host tells whether its version has them)."""

    reasoning: str | None = None
    tool_call: str | None = None

    checks = {"reasoning": _check_parser_name, "tool_call": _check_parser_name}


def _check_model(value: str) -> None:
    _check_remote_path(value if value.startswith(("/", "~/")) else "/" + value)


def _check_hf_repo(value: str) -> None:
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}\Z", value) or ".." in value:
        raise ValueError("must be a Hugging Face repository id, owner/name (Qwen/Qwen3.6-27B)")


def _check_revision(value: str) -> None:
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}\Z", value) or ".." in value:
        raise ValueError("must be a branch, tag or commit of the repository (main, v1.0, a 40-hex commit)")


def _check_served_name(value: str) -> None:
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}\Z", value):
        raise ValueError("must be letters, digits and ._:/- (at most 128)")


def _check_host_name(value: str) -> None:
    if not NAME_RE.match(value):
        raise ValueError("must be a host name from the inventory")


def _check_group_hosts(value: list[str]) -> None:
    for name in value:
        _check_host_name(name)
    if len(value) < 2:
        raise ValueError("names the hosts one model is spread over: at least two (one host needs no hosts:)")
    if len(set(value)) != len(value):
        raise ValueError("names a host twice; each host runs one rank of the group")


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
    # one model over several hosts: written per node from hosts: and dist_port: (and the same for all)
    "--nnodes": "hosts:",
    "--node-rank": "hosts:",
    "--dist-init-addr": "hosts: and dist_port:",
    "--master-addr": "hosts:",
    "--master-port": "dist_port:",
    "--headless": "hosts:",
    # a key here is in every plan, record and output: api_key_env keeps it to the engine and fleet's requests
    "--api-key": "api_key_env: (the variable that holds the key)",
    # fleet starts, keeps and stops the daemon these name (fleet.plan.weight_cache)
    "--weight-cache-mode": "weight_cache: true",
    "--weight-cache-socket": "weight_cache: true",
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


def _check_gpus(value: str | int | list[int]) -> None:
    if isinstance(value, list):
        if not value:
            raise ValueError(
                "lists no GPU; list indices as nvidia-smi numbers them (gpus: [0, 1]), give a count "
                "(gpus: 2), gpus: all for every GPU of the host, gpus: fit for as many as the model needs, or leave it "
                "out for the host's free GPUs"
            )
        repeated = sorted({i for i in value if value.count(i) > 1})
        if repeated:
            raise ValueError(f"lists GPU {', '.join(map(str, repeated))} more than once")


# Set from gpus: (the deployment's placement): a second spelling in env: would launch on other GPUs than
# the ones fleet checked, freed and recorded.
PLACEMENT_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def _check_env(value: dict[str, str]) -> None:
    for name in PLACEMENT_ENV:
        if name in value:
            raise ValueError(f"sets {name}, which fleet sets from gpus:; place the deployment with gpus: instead")
    for name in value:  # fleet's own words to its launcher, and where the weight cache daemon's sockets go
        if name.startswith("FLEET_") or name.startswith("SGLANG_WEIGHT_CACHE_"):
            raise ValueError(
                f"sets {name}, a variable fleet sets itself; leave it out (weight_cache: true for the daemon)"
            )
    _check_env_names(value)
    _check_args(list(value.values()))


READY_TIMEOUT_MAX_S = 7200  # two hours: longer than any real start-up, short of forever


class Playbook(_Strict, frozen=True, kw_only=True):
    engine: Engine
    model: str
    served_name: str
    hf_repo: str | None = None  # where `fleet pull` gets the model from (the Hugging Face Hub)
    revision: str = "main"  # of hf_repo: a branch, tag or commit
    default_host: str | None = None
    port: Annotated[int, Meta(ge=1024, le=65535)] = 30000
    speculative: Speculative | None = None
    context_length: Annotated[int, Meta(ge=256, le=10_000_000)] | None = None
    mem_fraction: Annotated[float, Meta(gt=0.05, lt=1.0)] | None = None
    tp: Annotated[int, Meta(ge=1, le=64)] | None = None
    # where on the host: GPU indices as nvidia-smi numbers them, a count fleet places, every GPU (all), or
    # fit: as many as the model needs (fleet.plan.fit); left out: the host's free GPUs (fleet.plan.whole_box),
    # unless tp: gives the count
    gpus: Literal["fit", "all"] | Annotated[int, Meta(ge=1, le=64)] | list[Annotated[int, Meta(ge=0, le=63)]] | None = (
        None
    )
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    allow_runtime_env: list[str] = field(default_factory=list)  # the opt-in for PATH, LD_*, PYTHONPATH...
    secret_env: list[str] = field(default_factory=list)
    # the variable in fleet's environment that holds the engine's API key: passed to the engine by fleet's
    # launcher on the host and sent with fleet's own requests, shown nowhere (never in extra_args)
    api_key_env: str | None = None
    smoke: Smoke
    literal: bool = False  # run extra_args as written (the hand-written command); rules only warn
    # the model's own code (config.json auto_map) may run: the operator's decision, never fleet's
    trust_remote_code: bool = False
    # reasoning/tool-call parsers: "auto" (the engine's detection, else the family's from fleet's table)
    parsers: Literal["auto"] | Parsers | None = None
    ready_timeout_s: Annotated[float, Meta(gt=0, le=READY_TIMEOUT_MAX_S)] = 900.0
    # a start-up phase gone quiet past its bound (fleet.startup.stall_bound): end the attempt and diagnose
    # it (fail), or say so and keep waiting up to ready_timeout_s (wait: a box known to stall and recover)
    on_stall: Literal["fail", "wait"] = "fail"
    max_attempts: Annotated[int, Meta(ge=1, le=10)] = 4
    runtime: Runtime | None = None  # process or a container (image); else the inventory's for the host
    # One model over several hosts (the engine's own multi-node): rank 0 first, HTTP on rank 0; the ranks
    # meet at rank 0's dist_port
    hosts: list[str] | None = None
    dist_port: Annotated[int, Meta(ge=1024, le=65535)] = 50000
    # SGLang's weight cache daemon holds the weights between the engine's starts (fleet.plan.weight_cache):
    # a relaunch with a fix, a restart or a heal gets them over CUDA IPC instead of reloading them from disk
    weight_cache: bool = False

    @property
    def secret_names(self) -> list[str]:
        """Every variable whose value fleet reads from its environment for this playbook: secret_env and
        the API key's (sent to the host on stdin, redacted from everything fleet shows)."""
        return list(dict.fromkeys([*self.secret_env, *([self.api_key_env] if self.api_key_env else [])]))

    checks = {
        "hosts": _check_group_hosts,
        "model": _check_model,
        "served_name": _check_served_name,
        "hf_repo": _check_hf_repo,
        "revision": _check_revision,
        "default_host": _check_host_name,
        "extra_args": _check_extra_args,
        "env": _check_env,
        "gpus": _check_gpus,
        "allow_runtime_env": _check_env_names,
        "secret_env": _check_env_names,
        "api_key_env": lambda name: _check_env_names([name]),
    }

    def check_together(self) -> None:
        if self.hosts and self.default_host:
            raise _Invalid(("default_host",), "value", "is set with hosts:; a group runs on its hosts: only")
        if self.hosts and self.tp and self.tp % len(self.hosts):
            raise _Invalid(
                ("tp",), "value", f"{self.tp} does not split evenly over the {len(self.hosts)} hosts of hosts:"
            )
        if self.gpus == "fit" and (self.hosts or self.tp):
            raise _Invalid(
                ("gpus",),
                "value",
                "is fit with "
                + (
                    "hosts:; a group runs on all of each host's GPUs"
                    if self.hosts
                    else "tp:; fit picks the TP, so leave tp: out or give a count: gpus: N"
                ),
            )
        if self.weight_cache and self.speculative and self.speculative.enabled:
            raise _Invalid(
                ("weight_cache",),
                "value",
                "is set with speculative:; SGLang refuses the two together (the weight cache daemon does not "
                "export the draft model's weights): drop one of them",
            )
        if self.weight_cache and self.engine != "sglang":
            raise _Invalid(("weight_cache",), "value", f"is SGLang's daemon; {self.engine} has none: leave it out")
        if self.hosts and self.dist_port == self.port:
            raise _Invalid(("dist_port",), "value", "is the HTTP port too; the ranks meet on a port of its own")
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
    lines: dict[str, int] = dataclass_field(default_factory=dict)  # top-level key -> its line in the file

    def where(self, key: str) -> str:
        """`file:line` of a setting, for errors found only once the host is known (GPUs it lacks)."""
        return f"{self.path}:{self.lines[key]}" if key in self.lines else str(self.path)


def parse_playbook(doc: YamlDoc, name: str) -> NamedPlaybook:
    spec, origins = parse_document(doc, Playbook, "playbook", "playbooks/qwen36-27b.yaml")
    return NamedPlaybook(name, doc.path, spec, origins)


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
    for name in playbook.spec.hosts or ():
        if name not in inventory.hosts:
            raise ConfigError(
                f'{playbook.where("hosts")}: hosts: names "{name}", which is not in {inventory.path}.',
                f"Known hosts: {', '.join(sorted(inventory.hosts))}.",
            )
    host = playbook.spec.default_host
    if host is not None and host not in inventory.hosts:
        raise ConfigError(
            f'{playbook.path}: default_host "{host}" is not in {inventory.path}.',
            f"Known hosts: {', '.join(sorted(inventory.hosts))}.",
        )
