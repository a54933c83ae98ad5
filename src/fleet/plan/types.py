"""The planner's values: versions, the GPU summary, the playbook's wishes, flags, fixes and the LaunchPlan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleet.model import GENERATE

if TYPE_CHECKING:
    from fleet.plan.container import ContainerPlan
    from fleet.plan.picks import Pick

Version = tuple[int, int, int]


def parse_version(text: str | None) -> Version | None:
    if not text:
        return None
    parts: list[int] = []
    for piece in text.split("+")[0].removeprefix("v").split(".")[:3]:
        digits = len(piece) - len(piece.lstrip("0123456789"))  # "3rc0" is 3: a pre-release of 0.5.3
        if not digits:
            break
        parts.append(int(piece[:digits]))
        if digits < len(piece):  # what follows a pre-release tag is not a version number
            break
    if not parts:
        return None
    while len(parts) < 3:
        parts.append(0)
    return (parts[0], parts[1], parts[2])


def show_version(v: Version | None) -> str:
    return "unknown" if v is None else ".".join(map(str, v))


@dataclass(frozen=True)
class GpuSummary:
    name: str
    count: int
    sm: int  # compute capability as 120 (SM120), 100 (SM100), 86 (SM86)
    memory_mib: int  # per GPU
    nvlink: bool
    indices: tuple[int, ...] = ()  # a placement's GPUs as nvidia-smi numbers them; () all of the host's

    @property
    def blackwell(self) -> bool:
        return self.sm >= 100

    @property
    def consumer_blackwell(self) -> bool:
        """SM120/SM121 (RTX PRO 6000, RTX 5090, GB10): no tcgen05, no trtllm-gen kernels."""
        return 120 <= self.sm < 130


@dataclass(frozen=True)
class Wishes:
    """The playbook's part of the plan."""

    engine: str
    served_name: str
    port: int
    bind_address: str = "0.0.0.0"
    speculative: bool = False
    speculative_steps: int = 1
    speculative_topk: int = 1
    context_length: int | None = None
    mem_fraction: float | None = None
    tp: int | None = None
    dp: int = 1  # data-parallel replicas (fleet.plan.whole_box chooses them; the playbook never does)
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    secret_env: tuple[str, ...] = ()
    api_key_env: str | None = None  # the variable holding the engine's API key (one of secret_env)
    literal: bool = False
    trust_remote_code: bool = False
    parsers: str | tuple[str | None, str | None] | None = None  # "auto", or (reasoning, tool_call) names
    weight_cache: bool = False  # run against SGLang's weight cache daemon (fleet.plan.weight_cache)


@dataclass(frozen=True)
class Flag:
    name: str
    value: str | None  # None for a store_true flag
    rule: str
    reason: str
    source: str = ""
    replaces: str = ""  # the engine's own default this flag overrides, and why that default is not kept

    def words(self) -> list[str]:
        return [self.name] if self.value is None else [self.name, self.value]


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    rule: str
    reason: str


@dataclass(frozen=True)
class Verdict:
    level: str  # "error" (refuse to deploy), "crash" (a flag the rules know will fail), "warning", "info"
    rule: str
    message: str


# What a derived fix does, in words (fleet.plan.fixes computes it).
DERIVED_FIX_TEXT = {
    "speculative_num_steps": "--speculative-num-steps (draft tokens - 1)",
    "respell_renamed_flags": "renamed flags spelled for this engine version",
    "raise_mem_fraction": "memory fraction +0.04",
    "lower_mem_fraction": "memory fraction -0.05",
    "fit_free_memory": "--gpu-memory-utilization fitted to the free memory the engine reported",  # fleet.crashes.fitted
    "smaller_graphs": "--cuda-graph-max-bs halved (16 where unset, never more), memory fraction -0.05",
    "sweep_port": "stop stale engine servers on the port, then relaunch",
    "restart_weight_cache": "the weight cache daemon started again with this engine's settings",
}
RESTART_WEIGHT_CACHE = "restart_weight_cache"


@dataclass(frozen=True)
class Fix:
    """A change to a plan that a crash signature (or a learned fix) prescribes."""

    set_flags: tuple[tuple[str, str | None], ...] = ()
    remove_flags: tuple[str, ...] = ()
    set_env: tuple[tuple[str, str], ...] = ()
    derive: str | None = None  # a named computed fix, see DERIVED_FIXES

    def describe(self) -> str:
        parts = [f"{n} {v}" if v is not None else n for n, v in self.set_flags]
        parts += [f"drop {n}" for n in self.remove_flags]
        parts += [f"{n}={v}" for n, v in self.set_env]
        if self.derive:
            parts.append(DERIVED_FIX_TEXT.get(self.derive, self.derive))
        return ", ".join(parts) or "(no change)"

    def to_json(self) -> dict[str, object]:
        return {
            "set_flags": [list(x) for x in self.set_flags],
            "remove_flags": list(self.remove_flags),
            "set_env": [list(x) for x in self.set_env],
            "derive": self.derive,
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Fix:
        def pairs(key: str) -> tuple[tuple[str, str | None], ...]:
            raw = d.get(key) or []
            assert isinstance(raw, list)
            return tuple((str(p[0]), None if p[1] is None else str(p[1])) for p in raw)

        env = tuple((n, v or "") for n, v in pairs("set_env"))
        removes = d.get("remove_flags") or []
        assert isinstance(removes, list)
        derive = d.get("derive")
        return cls(pairs("set_flags"), tuple(str(x) for x in removes), env, str(derive) if derive else None)


@dataclass(frozen=True)
class LearnedFix:
    signature: str
    fix: Fix
    learned_at: str


@dataclass(frozen=True)
class LaunchPlan:
    engine: str
    engine_version: Version | None
    python: str
    model_path: str
    served_name: str
    port: int
    check_address: str  # where a check on the host reaches the server
    flags: tuple[Flag, ...]
    env: tuple[EnvVar, ...]
    secret_env: tuple[str, ...]
    verdicts: tuple[Verdict, ...]
    applied_fixes: tuple[str, ...] = ()  # signature ids of fixes applied (learned or this deploy)
    container: ContainerPlan | None = None  # run in this container (python: the image's); None: a process
    left_to_engine: tuple[Pick, ...] = ()  # the engine's own picks for the keyed settings no flag sets
    told: tuple[tuple[str, str], ...] = ()  # the engine's own picks its check on the host said, planned on
    task: str = GENERATE  # what the server answers (fleet.model.serving_task): generate, embed or rerank
    # each GPU's memory, and what the weights and one prefill step's KV cache need of it (MiB; None: not
    # known): the act step holds them to the memory fraction the engine resolves on the host
    memory_mib: int | None = None
    need_mib: int | None = None

    def module(self) -> str:
        return "sglang.launch_server" if self.engine == "sglang" else "vllm.entrypoints.openai.api_server"

    def argv(self) -> list[str]:
        words = [self.python, "-m", self.module()]
        for f in self.flags:
            words += f.words()
        return words

    def engine_args(self) -> list[str]:
        return self.argv()[3:]

    def flag(self, name: str) -> Flag | None:
        return next((f for f in self.flags if f.name == name), None)

    @property
    def errors(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.level == "error"]

    def to_json(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "engine_version": show_version(self.engine_version),
            "argv": self.argv(),
            "flags": [
                {
                    "flag": f.name,
                    "value": f.value,
                    "rule": f.rule,
                    "reason": f.reason,
                    "source": f.source,
                    "replaces": f.replaces,
                }
                for f in self.flags
            ],
            "env": [{"name": e.name, "value": e.value, "rule": e.rule, "reason": e.reason} for e in self.env],
            "secret_env": list(self.secret_env),  # names only: values never leave the operator's machine in plans
            "verdicts": [{"level": v.level, "rule": v.rule, "message": v.message} for v in self.verdicts],
            "applied_fixes": list(self.applied_fixes),
            **({"task": self.task} if self.task != GENERATE else {}),  # a chat model's records stay as they were
            "told": dict(self.told),  # the engine's own picks the plan stood on, as its check said them
            "left_to_engine": [
                {"setting": p.setting, "value": p.effective, "resolved": p.value, "source": p.source}
                for p in self.left_to_engine
            ],
            "port": self.port,
            "served_name": self.served_name,
            **(
                {"container": {**self.container.to_json(), "run": self.container.run_argv(self)}}
                if self.container
                else {}
            ),
        }


# --- version-dependent spellings (engines.md §1.1) -------------------------------------------------------
