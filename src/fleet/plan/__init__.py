"""ModelSpec × host GPUs × engine version × playbook wishes × learned fixes → LaunchPlan. Pure.

Rules are data (`SGLANG_RULES`, `VLLM_RULES`, `KNOWN_CRASHES`): each has an id, a condition, what
it emits and why, with the engines.md section or public issue it comes from. The planner never
imports the transport or performs I/O; pre-flight verdicts are values, the caller decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from fleet.model import RERANK, ModelSpec
from fleet.plan.fixes import DERIVED_FIXES, apply_fix, learnable, set_flag
from fleet.plan.known_crashes import KNOWN_CRASHES, KnownCrash, lint
from fleet.plan.parsers import parsers_for
from fleet.plan.picks import FLAGS, SETTINGS, Pick, engine_pick, relevant
from fleet.plan.rules import (
    ALIASES,
    OLD_NAMES_REMOVED,
    RENAMED,
    SGLANG_RULES,
    VLLM_RULES,
    PlanInput,
    Rule,
    args_dict,
    choose_tp,
    keyed_flags,
    spell,
)
from fleet.plan.types import (
    DERIVED_FIX_TEXT,
    EnvVar,
    Fix,
    Flag,
    GpuSummary,
    LaunchPlan,
    LearnedFix,
    Verdict,
    Version,
    Wishes,
    parse_version,
    show_version,
)
from fleet.protocol import SECRET_WORD, Premises

__all__ = [
    "ALIASES",
    "DERIVED_FIXES",
    "DERIVED_FIX_TEXT",
    "KNOWN_CRASHES",
    "OLD_NAMES_REMOVED",
    "RENAMED",
    "SGLANG_RULES",
    "VLLM_RULES",
    "EnvVar",
    "Fix",
    "Flag",
    "GpuSummary",
    "KnownCrash",
    "LaunchPlan",
    "LearnedFix",
    "PlanInput",
    "Rule",
    "Verdict",
    "Version",
    "Wishes",
    "apply_fix",
    "learnable",
    "args_dict",
    "choose_tp",
    "keyed_premises",
    "lint",
    "parse_version",
    "plan_launch",
    "relint",
    "show_version",
    "spell",
]


def plan_launch(
    *,
    model: ModelSpec,
    gpus: GpuSummary,
    engine_version: Version | None,
    python: str,
    wishes: Wishes,
    learned: tuple[LearnedFix, ...] = (),
    told: Mapping[str, str] | None = None,
) -> LaunchPlan:
    """`told`: the engine's own picks for the settings keyed rules decide on (fleet.plan.picks), as its
    check on the host said them; fleet's table of picks otherwise."""
    told = told or {}
    i = PlanInput(model, gpus, engine_version, wishes, dict(told))
    check_address = "127.0.0.1" if wishes.bind_address in ("0.0.0.0", "::") else wishes.bind_address
    flags, env = _given_flags(model, wishes), _given_env(gpus)
    if wishes.literal:
        verdicts = _literal_verdicts(wishes)
    else:
        flags, env = _with_rules(i, flags, env)
        verdicts = _model_verdicts(i)
    for name, value in args_dict(list(wishes.extra_args)).items():
        flags = set_flag(flags, name, value, "playbook-extra-args", "written in the playbook (wins over rules)")
    env = [e for e in env if e.name not in dict(wishes.env)]
    env += [EnvVar(n, v, "playbook-env", "written in the playbook") for n, v in wishes.env]
    verdicts += _engine_verdicts(i)
    plan = LaunchPlan(
        engine=wishes.engine,
        left_to_engine=left_to_engine(i, flags),
        told=tuple(sorted(told.items())),
        engine_version=engine_version,
        python=python,
        model_path=model.path,
        served_name=wishes.served_name,
        port=wishes.port,
        check_address=check_address,
        flags=tuple(flags),
        env=tuple(env),
        secret_env=wishes.secret_env,
        verdicts=tuple(verdicts),
        task=model.task,
    )
    for lf in learned:
        plan = apply_fix(plan, lf.fix, lf.signature, f"learned fix ({lf.signature}, learned {lf.learned_at})")
    return replace(plan, verdicts=(*plan.verdicts, *lint(i, plan.flags)))


def _given_flags(model: ModelSpec, wishes: Wishes) -> list[Flag]:
    """The flags every plan has: the model, its served name, the address and port, the API key."""
    model_flag = "--model-path" if wishes.engine == "sglang" else "--model"
    flags = [
        Flag(model_flag, model.path, "model", "playbook model, on the host"),
        Flag("--served-model-name", wishes.served_name, "served-name", "playbook served_name (/v1/models id)"),
        Flag("--host", wishes.bind_address, "bind-address", "inventory bind_address"),
        Flag("--port", str(wishes.port), "port", "playbook port"),
    ]
    if wishes.api_key_env:
        flags.append(
            Flag(
                "--api-key",
                f"{SECRET_WORD}{wishes.api_key_env}",
                "api-key",
                f"playbook api_key_env: the key in {wishes.api_key_env}, sent to the host on stdin and put here by "
                "fleet's launcher; fleet's own requests send it too",
            )
        )
    return flags


def _given_env(gpus: GpuSummary) -> list[EnvVar]:
    env = [EnvVar("PYTHONUNBUFFERED", "1", "unbuffered-log", "log lines reach the file as written")]
    if gpus.indices:
        env += [
            EnvVar("CUDA_VISIBLE_DEVICES", ",".join(map(str, gpus.indices)), "placement", "the deployment's GPUs"),
            EnvVar("CUDA_DEVICE_ORDER", "PCI_BUS_ID", "placement", "GPU indices mean what nvidia-smi shows"),
        ]
    return env


def _with_rules(i: PlanInput, flags: list[Flag], env: list[EnvVar]) -> tuple[list[Flag], list[EnvVar]]:
    """The engine's rules that hold for this input, their flags and environment added with their reasons."""
    for rule in _rules(i.wishes.engine):
        if not rule.when(i):
            continue
        pairs, replaces = rule.flags(i), rule.replaces
        if rule.keyed_on:  # no flags where the engine's own pick stands (its environment still applies)
            pairs, replaces = keyed_flags(rule, i) or ([], "")
        for name, value in pairs:
            flags = set_flag(flags, name, value, rule.id, rule.reason, rule.source, replaces)
        env = env + [EnvVar(n, v, rule.id, rule.reason) for n, v in rule.env(i)]
    return flags, env


def _model_verdicts(i: PlanInput) -> list[Verdict]:
    """What the rules say of the model itself: code it ships, wishes that do not apply to it, drafts."""
    model, wishes = i.model, i.wishes
    verdicts: list[Verdict] = []
    if model.custom_code and not wishes.trust_remote_code and "--trust-remote-code" not in wishes.extra_args:
        verdicts.append(
            Verdict(
                "warning",
                "trust-remote-code",
                f"config.json's auto_map names code shipped with the model: the engine runs {model.architecture} "
                "without it only if it has its own class; set trust_remote_code: true in the playbook if you "
                "trust this model's code (fleet never does on its own)",
            )
        )
    if model.task == RERANK and model.labels > 1:
        verdicts.append(
            Verdict(
                "error",
                "sequence-classifier",
                f"{model.architecture} with {model.labels} labels is a classifier, not a cross-encoder reranker "
                "(one relevance score per pair): /v1/rerank would rank by its first label alone (SGLang "
                "serving_rerank.py takes embedding[0] as the score), so no answer could prove it serves; fleet "
                "deploys only one-label cross-encoders",
            )
        )
    if not model.generates and (wishes.speculative or wishes.parsers is not None):
        wanted = (("speculative", wishes.speculative), ("parsers", wishes.parsers is not None))
        asked = " and ".join(w for w, on in wanted if on)
        said = f"{model.describe()}: it generates no text, so the playbook's {asked} do not apply"
        verdicts.append(Verdict("info", "embedding-model", said))
    elif wishes.parsers is not None:
        verdicts.append(_parsers_verdict(i))
    # the true reason first: no draft class, whatever the heads
    if wishes.speculative and model.generates and not i.has_draft:
        verdicts.append(
            Verdict(
                "warning",
                "speculative-mtp",
                f"SGLang {show_version(i.version)} has no NEXTN draft model for {model.architecture} (its "
                "ModelConfig maps none): speculative decoding skipped"
                if wishes.engine == "sglang"
                else f"vLLM has no MTP draft for {model.architecture} ({model.model_type}: its speculative "
                "config maps none, and refuses method mtp): speculative decoding skipped",
            )
        )
    elif wishes.speculative and model.generates and model.mtp_layers == 0:
        verdicts.append(
            Verdict(
                "warning", "speculative-mtp", f"{model.architecture} has no MTP heads: speculative decoding skipped"
            )
        )
    return verdicts


def _literal_verdicts(wishes: Wishes) -> list[Verdict]:
    said = "literal playbook: only the playbook's own flags are passed; the rules below only warn"
    verdicts = [Verdict("info", "literal", said)]
    ignored = [k for k, v in (("trust_remote_code", wishes.trust_remote_code), ("parsers", wishes.parsers)) if v]
    if ignored:
        verdicts.append(
            Verdict(
                "warning",
                "literal",
                f"literal playbook: {' and '.join(ignored)} ignored; write the flags in extra_args instead",
            )
        )
    return verdicts


def _engine_verdicts(i: PlanInput) -> list[Verdict]:
    """What the engine version makes of the checkpoint: a quantisation it detects, a feature it lacks."""
    model, wishes = i.model, i.wishes
    verdicts: list[Verdict] = []
    if model.sglang_quantization and wishes.engine == "sglang":
        verdicts.append(
            Verdict(
                "info",
                "quantization",
                f"{model.quantization.upper()} checkpoint: the engine detects "
                f"{model.sglang_quantization} from the model files",
            )
        )
    if wishes.engine == "sglang" and i.spec_wanted and model.hybrid and i.v_in((0, 5, 5), (0, 5, 8)):
        verdicts.append(
            Verdict(
                "warning",
                "hybrid-spec-old-version",
                f"SGLang {show_version(i.version)} has no "
                "mamba extra_buffer: speculative decoding on a hybrid model may be unsupported",
            )
        )
    return verdicts


def _rules(engine: str) -> tuple[Rule, ...]:
    return SGLANG_RULES if engine == "sglang" else VLLM_RULES


def keyed_premises(plan: LaunchPlan, model: ModelSpec, gpus: GpuSummary, wishes: Wishes) -> Premises:
    """What the act step asks the engine before anything is stopped, so that the keyed rules stand on the
    engine's own picks and not only on fleet's table: for each setting a keyed rule decided, the flags it
    set (`drop`: the engine resolves the command line again without them and says what it picks itself;
    a setting they left alone is read from the plan's own resolution), and the picks under which the plan
    stays as it is (`expect`: the one it stood on, and the value fleet set where it set one). Empty where
    no keyed rule decided anything (vLLM, a literal playbook, GPUs outside every rule's scope)."""
    if wishes.literal:
        return {}
    i = PlanInput(model, gpus, plan.engine_version, wishes, dict(plan.told))
    keyed = [r for r in _rules(plan.engine) if r.keyed_on and r.when(i)]
    ids = {r.id for r in keyed}
    expect: dict[str, list[str]] = {}
    drop: dict[str, list[str]] = {}
    for rule in keyed:
        names = FLAGS[rule.keyed_on]
        setter = next((f for f in plan.flags if f.name in names), None)
        if setter is not None and setter.rule not in ids:
            continue  # the playbook or a fix set it: not fleet's rules' to decide
        if setter is not None:
            drop[rule.keyed_on] = [setter.name]
        pick = engine_pick(rule.keyed_on, model, gpus, plan.engine_version, i.spec_wanted, i.told)
        values = expect.setdefault(rule.keyed_on, [])
        told = i.told.get(rule.keyed_on)  # the engine said it before: the plan already stands on it
        for value in (pick.value if pick else None, told, setter.value if setter else None):
            if value is not None and value not in values:
                values.append(value)
    return {"drop": drop, "expect": expect} if expect else {}


def left_to_engine(i: PlanInput, flags: list[Flag]) -> tuple[Pick, ...]:
    """The engine's own picks for the keyed settings no flag of the plan sets, where fleet knows them."""
    if i.wishes.engine != "sglang":
        return ()
    names = {f.name for f in flags}
    out = []
    for setting in SETTINGS:
        if relevant(setting, i.model) and not names & set(FLAGS[setting]):
            pick = engine_pick(setting, i.model, i.gpus, i.version, i.spec_wanted, i.told)
            if pick is not None:
                out.append(pick)
    return tuple(out)


def _parsers_verdict(i: PlanInput) -> Verdict:
    """What the parsers rule chose and why, or why it could not choose."""
    assert i.wishes.parsers is not None
    choice = parsers_for(i.wishes.engine, i.model.model_type, i.version, i.wishes.parsers)
    if choice is None:
        return Verdict(
            "warning",
            "parsers",
            f"fleet knows no parsers for the {i.model.model_type} family on {i.wishes.engine} "
            f"{show_version(i.version)}: none passed; name them in the playbook "
            "(parsers: {reasoning: NAME, tool_call: NAME}, as the engine's --reasoning-parser/--tool-call-parser)",
        )
    names = f"reasoning {choice.reasoning or 'none'}, tool calls {choice.tool_call or 'none'}"
    return Verdict(
        "info", "parsers", f"parsers: {names}: {choice.reason}" + (f" [{choice.source}]" if choice.source else "")
    )


def relint(plan: LaunchPlan, model: ModelSpec, gpus: GpuSummary, wishes: Wishes) -> LaunchPlan:
    """Recompute the known-crash verdicts after fixes changed the flags."""
    i = PlanInput(model, gpus, plan.engine_version, wishes)
    kept = tuple(v for v in plan.verdicts if v.level != "crash")
    return replace(plan, verdicts=(*kept, *lint(i, plan.flags)))
