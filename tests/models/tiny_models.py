"""Tiny random transformers checkpoints with the features of the real targets.

Each entry is a transformers config; `save_tiny_model` writes it with save_pretrained,
so our loader reads exactly what a user's HF folder holds.
"""

import torch
import transformers

COMMON = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    initializer_range=0.1,
    bos_token_id=1,
    eos_token_id=2,
)

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def tiny_configs() -> dict[str, transformers.PretrainedConfig]:
    return {
        "llama-gqa-llama3": transformers.LlamaConfig(
            **COMMON, num_key_value_heads=2, rope_parameters=LLAMA3_ROPE, tie_word_embeddings=False
        ),
        "llama-gqa4": transformers.LlamaConfig(
            **{**COMMON, "num_attention_heads": 8}, num_key_value_heads=4, tie_word_embeddings=False
        ),
        "llama-tied-mqa": transformers.LlamaConfig(
            **COMMON, num_key_value_heads=1, tie_word_embeddings=True
        ),
        "llama-biases": transformers.LlamaConfig(
            **COMMON,
            num_key_value_heads=2,
            head_dim=8,
            attention_bias=True,
            mlp_bias=True,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0},
            tie_word_embeddings=False,
        ),
        "exaone4": transformers.Exaone4Config(
            **{**COMMON, "num_hidden_layers": 3},
            num_key_value_heads=2,
            head_dim=32,
            sliding_window=5,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            rope_parameters={**LLAMA3_ROPE, "rope_theta": 1000.0},
            tie_word_embeddings=False,
        ),
        "exaone4-global": transformers.Exaone4Config(
            **COMMON,
            num_key_value_heads=2,
            sliding_window=None,
            layer_types=["full_attention", "full_attention"],
            tie_word_embeddings=True,
        ),
        "gemma": transformers.GemmaConfig(
            **COMMON, num_key_value_heads=1, head_dim=32, hidden_activation="gelu_pytorch_tanh"
        ),
        "gemma2": transformers.Gemma2Config(
            **COMMON,
            num_key_value_heads=2,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=6,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=4.0,
        ),
        "gemma3": transformers.Gemma3TextConfig(
            **COMMON,
            num_key_value_heads=2,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 50000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            },
        ),
        "glm4": transformers.Glm4Config(
            **COMMON,
            num_key_value_heads=2,
            head_dim=32,
            pad_token_id=0,
            tie_word_embeddings=False,
        ),
        "granite": transformers.GraniteConfig(
            **COMMON,
            num_key_value_heads=2,
            embedding_multiplier=12.0,
            residual_multiplier=0.22,
            attention_multiplier=0.015625,
            logits_scaling=8.0,
            tie_word_embeddings=True,
        ),
        "mistral": transformers.MistralConfig(
            **COMMON, num_key_value_heads=2, sliding_window=7, tie_word_embeddings=False
        ),
        "olmo2": transformers.Olmo2Config(
            **COMMON, num_key_value_heads=2, tie_word_embeddings=False
        ),
        "olmo3": transformers.Olmo3Config(
            **{**COMMON, "num_hidden_layers": 3},
            num_key_value_heads=2,
            sliding_window=6,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            rope_parameters={
                "full_attention": {
                    "rope_type": "yarn",
                    "rope_theta": 50000.0,
                    "factor": 4.0,
                    "original_max_position_embeddings": 128,
                    "attention_factor": 1.2,
                },
                "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
            },
            tie_word_embeddings=False,
        ),
        "phi3": transformers.Phi3Config(
            **{**COMMON, "max_position_embeddings": 128},
            num_key_value_heads=2,
            original_max_position_embeddings=128,
            sliding_window=9,
            pad_token_id=0,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.75,
                "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                "long_factor": [1.0, 2.0, 3.0, 4.0, 6.0, 8.0],
            },
            tie_word_embeddings=True,
        ),
        "qwen2": transformers.Qwen2Config(
            **COMMON, num_key_value_heads=2, tie_word_embeddings=True
        ),
        "qwen3": transformers.Qwen3Config(
            **COMMON, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False
        ),
        "qwen3-moe": transformers.Qwen3MoeConfig(
            **COMMON,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            mlp_only_layers=[1],
            tie_word_embeddings=False,
        ),
        "starcoder2": transformers.Starcoder2Config(
            **{k: v for k, v in COMMON.items() if k != "rms_norm_eps"},
            num_key_value_heads=2,
            norm_epsilon=1e-5,
            sliding_window=7,
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
        ),
    }


def save_tiny_model(config: transformers.PretrainedConfig, folder: str, seed: int = 0) -> None:
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if config.model_type.startswith("gemma"):
        randomize_norms(model)
    if config.model_type in RANDOM_SCALES:
        randomize_scales_and_biases(model)
    model.save_pretrained(folder)


RANDOM_SCALES = ("exaone4", "glm4", "olmo3", "starcoder2")
"""Families whose norms and biases transformers initialises to ones and zeros: random ones
make a model that swapped two norms or dropped a bias fail."""


def randomize_scales_and_biases(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.3)
            elif "norm" in name:
                param.normal_(1.0, 0.3)


def randomize_norms(model: torch.nn.Module) -> None:
    """Gemma stores its norm weights as offsets from 1, initialised to 0: random ones make
    a model that mistook them for the scales themselves fail."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.3)
