"""The planner's rules as data: which flags each engine gets and why (`SGLANG_RULES`, `VLLM_RULES`), and
flag spellings per version, with their sources. The command lines known to crash: fleet.plan.known_crashes."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fleet.model import EMBED, RERANK, ModelSpec
from fleet.plan.drafts import sglang_draft, vllm_draft
from fleet.plan.parsers import ParserChoice, parsers_for
from fleet.plan.picks import ATTENTION, FP4_GEMM, MAMBA, MOE_RUNNER, engine_pick, failing
from fleet.plan.types import GpuSummary, Version, Wishes, show_version

RENAMED: Version = (0, 5, 14)
OLD_NAMES_REMOVED: Version = (0, 5, 20)
MAMBA_OLD, MAMBA_NEW = "--mamba-scheduler-strategy", "--mamba-radix-cache-strategy"
GRAPH_OLD, GRAPH_NEW = "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"
ALIASES = {
    "--tp": "--tp-size",
    "--model": "--model-path",
    "--speculative-draft-model": "--speculative-draft-model-path",
    "-tp": "--tensor-parallel-size",
    "-sc": "--speculative-config",
    "--dp": "--dp-size",
    "-dp": "--data-parallel-size",
    "--pp": "--pp-size",
    "-pp": "--pipeline-parallel-size",
    "--ep": "--ep-size",
}


def spell(flag: str, version: Version | None) -> str:
    """The spelling of a renamed SGLang flag that `version` accepts."""
    if version is None:
        return flag
    new = version >= RENAMED
    if flag in (MAMBA_OLD, MAMBA_NEW):
        return MAMBA_NEW if new else MAMBA_OLD
    if flag in (GRAPH_OLD, GRAPH_NEW):
        return GRAPH_NEW if new else GRAPH_OLD
    return flag


NCCL_PORT_OFFSET = 10000


def nccl_port_for(port: int) -> int:
    """The NCCL port of a placed SGLang server: distinct whenever the HTTP ports are."""
    return port + NCCL_PORT_OFFSET if port + NCCL_PORT_OFFSET <= 65535 else port - NCCL_PORT_OFFSET


# --- the inputs every rule sees --------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanInput:
    model: ModelSpec
    gpus: GpuSummary
    version: Version | None
    wishes: Wishes
    told: Mapping[str, str] = field(default_factory=dict)  # the engine's own picks, as its check on the host said

    @property
    def spec_wanted(self) -> bool:
        """Speculative decoding asked for, on MTP heads the model has and the engine has a draft class for."""
        return self.wishes.speculative and self.model.mtp_layers > 0 and self.has_draft and self.model.generates

    @property
    def has_draft(self) -> bool:
        """Whether the engine drafts for this model with its MTP heads (the engines' own tables: drafts.py)."""
        if self.wishes.engine == "vllm":
            return vllm_draft(self.model.model_type, self.model.architecture) is not None
        return sglang_draft(self.model.architecture, self.version) is not None

    def v_in(self, lo: Version, hi: Version) -> bool:
        """lo <= version <= hi (an unknown version matches nothing)."""
        return self.version is not None and lo <= self.version <= hi


def tp_splits(model: ModelSpec, tp: int) -> bool:
    """Whether `tp` ranks split the attention heads (the KV heads split too, or replicate when fewer)."""
    heads_ok = model.num_attention_heads == 0 or model.num_attention_heads % tp == 0
    kv = model.num_kv_heads or 1
    return heads_ok and (kv % tp == 0 or tp % kv == 0)


def largest_tp(model: ModelSpec, count: int) -> int:
    """The largest power of two up to `count` that splits the attention heads (KV heads replicate when
    fewer); 1 when none does."""
    tp = 1
    candidate = 1
    while candidate <= count:
        if tp_splits(model, candidate):
            tp = candidate
        candidate *= 2
    return tp


def choose_tp(model: ModelSpec, gpus: GpuSummary, wanted: int | None, dp: int = 1) -> int:
    """The playbook's tp:, else the largest TP each of `dp` replicas' share of the GPUs takes."""
    return wanted or largest_tp(model, gpus.count // max(1, dp))


@dataclass(frozen=True)
class Rule:
    id: str
    when: Callable[[PlanInput], bool]
    flags: Callable[[PlanInput], list[tuple[str, str | None]]]
    reason: str
    source: str = ""
    env: Callable[[PlanInput], list[tuple[str, str]]] = field(default=lambda i: [])
    # the engine's own default the flags override, and the evidence that it is not kept (shown in fleet plan)
    replaces: str = ""
    # a setting the engine picks itself (fleet.plan.picks): the rule sets it only where the engine's own pick
    # is known to fail there, or is not known; `replaces` is then said from the pick and its evidence
    keyed_on: str = ""
    # why the engine's own pick is written down where it does not fail (empty: it is left to the engine)
    pin: str = ""


def keyed_flags(rule: Rule, i: PlanInput) -> tuple[list[tuple[str, str | None]], str] | None:
    """A keyed rule's flags and what they replace, or None where the engine's own pick stands."""
    pick = engine_pick(rule.keyed_on, i.model, i.gpus, i.version, i.spec_wanted, i.told)
    if pick is None:
        return rule.flags(i), (
            f"SGLang {show_version(i.version)}'s own {rule.keyed_on} here, which fleet does not know (its table "
            "has 0.5.11 and 0.5.23; a deploy asks the engine on the host first)"
        )
    bad = failing(pick, i.model, i.gpus, i.version, i.spec_wanted)
    if bad is not None:
        return rule.flags(i), f"SGLang's own {rule.keyed_on} {pick.describe()}, which fails here: {bad.evidence}"
    if rule.pin and pick.effective != "auto":
        name = rule.flags(i)[0][0]
        return [(name, pick.effective)], f"nothing: SGLang's own {rule.keyed_on} {pick.describe()}; {rule.pin}"
    return None


# architectures whose SGLang hook refuses NEXTN by name, before it becomes EAGLE: "Only EAGLE and DSPARK
# speculative algorithms are supported", EAGLE with topk 1 only (0.5.23 arg_groups/deepseek_v4_hook.py)
EAGLE_BY_NAME = ("DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMDSpark")


def _spec_flags(i: PlanInput) -> list[tuple[str, str | None]]:
    eagle = i.model.architecture in EAGLE_BY_NAME
    steps, topk = i.wishes.speculative_steps, 1 if eagle else i.wishes.speculative_topk
    draft = steps + 1 if topk == 1 else max(steps + 1, topk * steps)
    return [
        ("--speculative-algorithm", "EAGLE" if eagle else "NEXTN"),
        ("--speculative-num-steps", str(steps)),
        ("--speculative-eagle-topk", str(topk)),
        ("--speculative-num-draft-tokens", str(draft)),
    ]


def _parser_choice(i: PlanInput) -> ParserChoice | None:
    return (
        None
        if i.wishes.parsers is None
        else parsers_for(i.wishes.engine, i.model.model_type, i.version, i.wishes.parsers)
    )


def _parser_flags(i: PlanInput) -> list[tuple[str, str | None]]:
    choice = _parser_choice(i)
    if choice is None:
        return []
    flags: list[tuple[str, str | None]] = []
    if choice.reasoning:
        flags.append(("--reasoning-parser", choice.reasoning))
    if choice.tool_call:
        flags.append(("--tool-call-parser", choice.tool_call))
        if i.wishes.engine == "vllm":  # vLLM parses tool calls only when told it may choose them itself
            flags.append(("--enable-auto-tool-choice", None))
    return flags


# both engines: the flags come from fleet.plan.parsers, which says why in `fleet plan`
PARSERS = Rule(
    "parsers",
    lambda i: i.wishes.parsers is not None and i.model.generates,  # an embedding model writes no text to parse
    _parser_flags,  # none for a family fleet does not know (the plan warns)
    "the playbook asked for parsers: the engine's own detection where it has one, else the family's (plan/parsers.py)",
    replaces="the engine's default: no parser, so thinking and tool calls arrive as plain text in the answer",
)

# both engines: the flag, its condition and its reason are the same
TRUST_REMOTE_CODE = Rule(
    "trust-remote-code",
    lambda i: i.wishes.trust_remote_code,
    lambda i: [("--trust-remote-code", None)],
    "the playbook allows the model's own code (trust_remote_code): its config, tokenizer or model may need it",
    "transformers dynamic_module_utils (resolve_trust_remote_code); SGLang model_loader/utils.py "
    "resolve_transformers_arch",
    replaces="the engine's default: the model's own code is never run, and a model that needs it is refused",
)


SGLANG_EMBEDDING = Rule(
    "embedding-model",
    lambda i: not i.model.generates,
    lambda i: [("--is-embedding", None)],
    "an embedding model or a cross-encoder (fleet.model.serving_task): served on /v1/embeddings and /v1/rerank. "
    "SGLang turns embedding mode on itself only for the encoder architectures it lists; a decoder checkpoint "
    "with a sentence-transformers pipeline (Qwen3-Embedding) needs the flag, so it is always written",
    "sglang configs/model_config.py is_generation_model; configs/embedding_model_spec.py (0.5.23); "
    "docs.sglang.io supported_models/embedding_models, rerank_models",
    replaces="SGLang's default: a generation server, which refuses /v1/embeddings ('does not appear to be an "
    "embedding model by default. Please add `--is-embedding`')",
)
SGLANG_CROSS_ENCODER_ATTENTION = Rule(
    "cross-encoder-attention",
    lambda i: i.model.task == RERANK,
    lambda i: [("--attention-backend", "triton")],
    "a cross-encoder reranker: SGLang's rerank models run on the triton and torch_native attention backends "
    "only; triton is the GPU one",
    "docs.sglang.io supported_models/retrieval_ranking/rerank_models (BGE-Reranker: 'Currently only support "
    "attention-backend triton and torch_native')",
    replaces="SGLang's own attention pick for the GPU, which its rerank models do not support",
)
SGLANG_CROSS_ENCODER_WHOLE_PAIR = Rule(
    "cross-encoder-whole-pair",
    lambda i: i.model.task == RERANK,
    lambda i: [("--disable-radix-cache", None), ("--chunked-prefill-size", "-1")],
    "a cross-encoder reads each query-document pair in one prefill and keeps nothing to decode from: a "
    "prefix cache holds nothing it reuses, and a chunk of a long pair is not the whole pair its attention "
    "sees. SGLang turns neither off itself for a sequence classifier (its spec's safe_disable_radix_cache "
    "and safe_disable_chunked_prefill are False), so its documented reranker launch passes both",
    "docs.sglang.io supported_models/rerank_models (bge-reranker-v2-m3's launch command); sglang 0.5.23 "
    "configs/embedding_model_spec.py (sequence_classification) and arg_groups/model_hook.py",
    replaces="SGLang's defaults: the radix cache on and prefills chunked at its size for the GPU",
)

SGLANG_WEIGHT_CACHE = Rule(
    "weight-cache",
    lambda i: i.wishes.weight_cache,
    lambda i: [("--weight-cache-mode", "client")],
    "weight_cache: the engine maps the weights fleet's weight cache daemon holds (started first, with the "
    "engine's flags but those that only decide how it serves: fleet.plan.weight_cache) instead of loading them "
    "from disk; a relaunch whose fix touches only those reuses them",
    "sglang 0.5.23 weight_cache/daemon.py, model_loader ipc_loader.py, arg_groups/fields/model.py",
    replaces="SGLang's default --weight-cache-mode off: every start reloads the weights from disk",
)

SGLANG_RULES: tuple[Rule, ...] = (
    Rule(
        "tensor-parallel",
        lambda i: True,
        lambda i: [("--tp-size", str(choose_tp(i.model, i.gpus, i.wishes.tp, i.wishes.dp)))],
        "largest power of two <= the deployment's GPU count (each data-parallel replica's share) dividing the "
        "attention heads (gpus: left out, the host's free GPUs: fleet.plan.whole_box; playbook tp: wins)",
        replaces="SGLang's default --tp-size 1: one GPU of the host's, the model often does not fit it",
    ),
    Rule(
        "data-parallel",
        lambda i: i.wishes.dp > 1,
        lambda i: [("--dp-size", str(i.wishes.dp))],
        "gpus: left out on a PCIe-only box, or an embedding or reranker model: replicas of a TP group that holds "
        "the model, one port (fleet.plan.whole_box); SGLang's data-parallel controller starts each on its own GPUs",
        "docs.sglang.io advanced_features/dp_dpa_smg_guide; sglang managers/data_parallel_controller.py "
        "(base_gpu_id advances by tp_size per DP rank)",
        replaces="SGLang's default --dp-size 1: one TP group, the box's other GPUs idle",
    ),
    Rule(
        "speculative-mtp",
        lambda i: i.spec_wanted and i.model.architecture not in EAGLE_BY_NAME,
        _spec_flags,
        "NEXTN with the model's own MTP head; all three of steps/topk/draft-tokens or none (a subset is a bare "
        "AssertionError in every version; draft = steps + 1 when topk = 1)",
        "engines.md §1.3, §2.1",
        replaces="SGLang's default: no speculative decoding (the playbook asked for it)",
    ),
    Rule(
        "speculative-mtp-eagle",
        lambda i: i.spec_wanted and i.model.architecture in EAGLE_BY_NAME,
        _spec_flags,
        "the model's own MTP head under NEXTN's other name, EAGLE, with topk 1: DeepSeek V4's hook refuses "
        "NEXTN ('Only EAGLE and DSPARK speculative algorithms are supported') and any other topk",
        "sglang 0.5.23 arg_groups/deepseek_v4_hook.py",
        replaces="SGLang's default: no speculative decoding (the playbook asked for it)",
    ),
    Rule(
        "hybrid-extra-buffer-old",
        lambda i: i.model.hybrid and i.v_in((0, 5, 9), (0, 5, 13)),
        lambda i: [(MAMBA_OLD, "extra_buffer")],
        "hybrid GDN model on 0.5.9-0.5.13: extra_buffer keeps NEXTN with the radix cache and the overlap "
        "scheduler (0.5.14+ picks it itself)",
        "engines.md §1.1 (auto -> no_buffer), §2.1; sglang issue #27418",
        env=lambda i: [("SGLANG_ENABLE_SPEC_V2", "1")] if i.spec_wanted and i.v_in((0, 5, 9), (0, 5, 10)) else [],
        keyed_on=MAMBA,
    ),
    Rule(
        "hybrid-spec-extra-buffer",
        lambda i: i.spec_wanted and i.model.hybrid and i.v_in(RENAMED, (9, 9, 9)),
        lambda i: [(MAMBA_NEW, "extra_buffer")],
        "hybrid GDN + NEXTN: extra_buffer (the flag was renamed in 0.5.14 and the old name removed in 0.5.20)",
        "engines.md §1.1, §1.2",
        keyed_on=MAMBA,
        pin="written down so that the plan says the same on every version (0.5.9-0.5.13 need it)",
    ),
    Rule(
        "sm120-nvfp4-moe-runner",
        lambda i: i.model.nvfp4 and i.model.moe and i.gpus.consumer_blackwell,
        lambda i: [("--moe-runner-backend", "flashinfer_cutlass")],
        "SM120 NVFP4 MoE: flashinfer_cutlass, the runner SGLang's own fix for consumer Blackwell selects "
        "(flashinfer_cutedsl gives garbage output there)",
        "engines.md §1.4; sglang PR #39807; flashinfer #2723",
        keyed_on=MOE_RUNNER,
    ),
    Rule(
        "sm120-nvfp4-fp4-gemm",
        lambda i: i.model.nvfp4 and i.gpus.consumer_blackwell,
        lambda i: [("--fp4-gemm-backend", "flashinfer_cudnn")],
        "SM120 NVFP4: the FP4 GEMM backend written down, since SGLang's own choice changed between versions; a "
        "version fleet has no pick for gets flashinfer_cudnn, which ran on the 8x RTX PRO 6000 box",
        "engines.md §1.5",
        keyed_on=FP4_GEMM,
        pin="written down because the SM120 default changed between versions: the plan says which one runs",
    ),
    Rule(
        "hybrid-sm120-attention",
        lambda i: i.model.hybrid and i.gpus.consumer_blackwell,
        lambda i: [("--attention-backend", "flashinfer")],
        "hybrid GDN models on Blackwell accept only triton, trtllm_mha, fa4 or flashinfer, and trtllm's prefill "
        "exists only on SM100: flashinfer, in the allow-list on SM120. Set only where SGLang's own pick fails "
        "there; on SM100 it is never set",
        "engines.md §1.6; sglang #35080, #9140",
        keyed_on=ATTENTION,
    ),
    Rule(
        "pcie-custom-all-reduce",
        lambda i: not i.gpus.nvlink and choose_tp(i.model, i.gpus, i.wishes.tp, i.wishes.dp) > 2,
        lambda i: [("--disable-custom-all-reduce", None)],
        "PCIe-only with more than two GPUs: custom all-reduce is off anyway; explicit silences the warning",
        "engines.md §1.8",
        replaces="SGLang's default (custom all-reduce on), which PCIe-only boxes turn off with a warning",
    ),
    Rule(
        "context-length",
        lambda i: i.wishes.context_length is not None,
        lambda i: [("--context-length", str(i.wishes.context_length))],
        "playbook context_length",
        replaces="the model's own maximum context (the playbook set context_length)",
    ),
    Rule(
        "mem-fraction",
        lambda i: i.wishes.mem_fraction is not None,
        lambda i: [("--mem-fraction-static", str(i.wishes.mem_fraction))],
        "playbook mem_fraction",
        replaces="SGLang's computed memory fraction (the playbook set mem_fraction)",
    ),
    Rule(
        "nccl-port",
        lambda i: bool(i.gpus.indices),
        lambda i: [("--nccl-port", str(nccl_port_for(i.wishes.port)))],
        "a server placed beside others gets a fixed NCCL port derived from its HTTP port: SGLang otherwise "
        "takes a free one at start-up, and two servers starting together can take the same",
        "scale-out.md §3; sglang #7418",
        replaces="SGLang's default: a free port taken at start-up, which two servers starting together can both take",
    ),
    SGLANG_EMBEDDING,
    SGLANG_CROSS_ENCODER_ATTENTION,
    SGLANG_CROSS_ENCODER_WHOLE_PAIR,
    SGLANG_WEIGHT_CACHE,
    TRUST_REMOTE_CODE,
    PARSERS,
)

VLLM_RUNNER_FLAG: Version = (0, 10, 1)  # --runner pooling replaced --task embed/score (the docs of 0.10.0 and 0.10.1)


def _vllm_pooling_flags(i: PlanInput) -> list[tuple[str, str | None]]:
    if i.version is not None and i.version < VLLM_RUNNER_FLAG:
        return [("--task", "embed" if i.model.task == EMBED else "score")]
    return [("--runner", "pooling")]


VLLM_POOLING = Rule(
    "pooling-runner",
    lambda i: not i.model.generates,
    _vllm_pooling_flags,
    "an embedding model or a cross-encoder (fleet.model.serving_task): vLLM's pooling runner, which converts the "
    "architecture itself (a causal LM or *Model to embed, *ForSequenceClassification to classify and score) and "
    "serves /v1/embeddings and /v1/rerank; --task embed/score before 0.10.1",
    "docs.vllm.ai models/pooling_models (v0.10.0: --task; v0.10.1.1 and later: --runner, --convert)",
    replaces="vLLM's default runner for a causal-LM architecture: generate, which serves no embeddings",
)

VLLM_RULES: tuple[Rule, ...] = (
    Rule(
        "tensor-parallel",
        lambda i: True,
        lambda i: [("--tensor-parallel-size", str(choose_tp(i.model, i.gpus, i.wishes.tp, i.wishes.dp)))],
        "largest power of two <= the deployment's GPU count (each data-parallel replica's share) dividing the "
        "attention heads (gpus: left out, the host's free GPUs: fleet.plan.whole_box; playbook tp: wins)",
        replaces="vLLM's default --tensor-parallel-size 1: one GPU of the host's, the model often does not fit it",
    ),
    Rule(
        "data-parallel",
        lambda i: i.wishes.dp > 1,
        lambda i: [("--data-parallel-size", str(i.wishes.dp))],
        "gpus: left out on a PCIe-only box, or an embedding or reranker model: replicas of a TP group that holds "
        "the model, one port (fleet.plan.whole_box)",
        "docs.vllm.ai serving/data_parallel_deployment",
        replaces="vLLM's default --data-parallel-size 1: one TP group, the box's other GPUs idle",
    ),
    Rule(
        "speculative-mtp",
        lambda i: i.spec_wanted and i.model.architecture not in EAGLE_BY_NAME,
        lambda i: [
            (
                "--speculative-config",
                json.dumps(
                    {"method": "mtp", "num_speculative_tokens": i.wishes.speculative_steps}, separators=(",", ":")
                ),
            )
        ],
        "vLLM MTP with the model's own heads (model-specific *_mtp methods are deprecated aliases of mtp)",
        "engines.md §6.1",
        replaces="vLLM's default: no speculative decoding (the playbook asked for it)",
    ),
    Rule(
        "sm120-nvfp4-moe-backend",
        lambda i: i.model.nvfp4 and i.model.moe and i.gpus.consumer_blackwell and i.v_in((0, 32, 0), (9, 9, 9)),
        lambda i: [("--moe-backend", "flashinfer_b12x")],
        "SM120 NVFP4 MoE: flashinfer_b12x is vLLM's native SM12x path but opt-in (auto does not pick it; "
        "flashinfer_cutlass's device check covers SM100 only). In the parsers of 0.32 and 0.33; older "
        "versions are not checked, so nothing is added there",
        "engines.md §6.2; vllm issues #31085, #33416",
        replaces="vLLM's default auto, which does not pick flashinfer_b12x and whose cutlass path checks for SM100",
    ),
    Rule(
        "pcie-custom-all-reduce",
        lambda i: not i.gpus.nvlink and choose_tp(i.model, i.gpus, i.wishes.tp, i.wishes.dp) > 2,
        lambda i: [("--disable-custom-all-reduce", None)],
        "PCIe-only with more than two GPUs: custom all-reduce is off anyway; explicit silences the warning",
        "engines.md §6.2; vllm/distributed/device_communicators/custom_all_reduce.py ('not supported on more "
        "than two PCIe-only GPUs')",
        replaces="vLLM's default (custom all-reduce on), which PCIe-only boxes turn off with a warning",
    ),
    Rule(
        "context-length",
        lambda i: i.wishes.context_length is not None,
        lambda i: [("--max-model-len", str(i.wishes.context_length))],
        "playbook context_length",
        replaces="the model's own maximum context (the playbook set context_length)",
    ),
    Rule(
        "mem-fraction",
        lambda i: i.wishes.mem_fraction is not None,
        lambda i: [("--gpu-memory-utilization", str(i.wishes.mem_fraction))],
        "playbook mem_fraction",
        replaces="vLLM's default 0.9 (the playbook set mem_fraction)",
    ),
    Rule(
        "internal-ports",
        lambda i: bool(i.gpus.indices),
        lambda i: [],
        "a server placed beside others starts its internal ports (distributed init, engine-core sockets) at "
        "its HTTP port + 10000: vLLM scans up from VLLM_PORT, else takes free ports at start-up that two "
        "servers starting together can both take",
        "scale-out.md §3; vllm #15987; vllm/utils/network_utils.py get_open_ports_list",
        env=lambda i: [("VLLM_PORT", str(nccl_port_for(i.wishes.port)))],
        replaces="vLLM's default: free ports taken at start-up, which two servers starting together can both take",
    ),
    VLLM_POOLING,
    TRUST_REMOTE_CODE,
    PARSERS,
)


def args_dict(words: list[str]) -> dict[str, str | None]:
    """`--flag value` / `--flag` words → {canonical flag: value or None}; later words win."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("-"):
            name, eq, inline = w.partition("=")
            name = ALIASES.get(name, name)
            if eq:
                out[name] = inline
            elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                out[name] = words[i + 1]
                i += 1
            else:
                out[name] = None
        i += 1
    return out
