"""Tiny random transformers checkpoints with the features of the real targets.

Each entry is a transformers config; `save_tiny_model` writes it with save_pretrained,
so our loader reads exactly what a user's HF folder holds.
"""

import json
from pathlib import Path

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
        "internlm3": transformers.InternLM3Config(
            **COMMON,
            num_key_value_heads=2,
            head_dim=16,
            qkv_bias=True,  # InternLM3Config's names of attention_bias and mlp_bias
            bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
            tie_word_embeddings=False,
        ),
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
        "ernie4_5": transformers.Ernie4_5Config(
            **COMMON,
            num_key_value_heads=2,
            head_dim=16,
            use_bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
            pad_token_id=0,
            tie_word_embeddings=True,
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
        "granitemoe": transformers.GraniteMoeConfig(
            **{**COMMON, "intermediate_size": 32},
            num_key_value_heads=2,
            num_local_experts=8,
            num_experts_per_tok=2,
            embedding_multiplier=12.0,
            residual_multiplier=0.22,
            attention_multiplier=0.015625,
            logits_scaling=8.0,
            tie_word_embeddings=True,
        ),
        "ministral": transformers.MinistralConfig(
            **{**COMMON, "num_hidden_layers": 3},
            num_key_value_heads=2,
            head_dim=16,  # stated, as Ministral-8B's config does: MinistralConfig derives none
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            tie_word_embeddings=False,
        ),
        "ministral3": transformers.Ministral3Config(
            **COMMON,
            num_key_value_heads=2,
            head_dim=16,
            rope_parameters={  # Ministral 3's, over an original context of 8 tokens
                "rope_type": "yarn",
                "rope_theta": 1000000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 8,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "llama_4_scaling_beta": 0.1,
            },
            pad_token_id=None,  # Ministral3Config's default, 11, is a token of the prompts
            tie_word_embeddings=False,
        ),
        "mistral": transformers.MistralConfig(
            **COMMON, num_key_value_heads=2, sliding_window=7, tie_word_embeddings=False
        ),
        "mixtral": transformers.MixtralConfig(
            **{**COMMON, "intermediate_size": 32},
            num_key_value_heads=2,
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=7,
            tie_word_embeddings=False,
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
        "olmoe": transformers.OlmoeConfig(
            **{**COMMON, "intermediate_size": 32},
            num_key_value_heads=2,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=False,
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
        "qwen2-moe": transformers.Qwen2MoeConfig(
            **COMMON,
            num_key_value_heads=2,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            norm_topk_prob=False,
            mlp_only_layers=[1],
            tie_word_embeddings=False,
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
        "seed-oss": transformers.SeedOssConfig(
            **COMMON,
            num_key_value_heads=2,
            head_dim=16,
            attention_bias=True,  # Seed-OSS-36B's: q/k/v biases, none on o_proj
            attention_out_bias=False,
            pad_token_id=0,
            tie_word_embeddings=False,
        ),
        "seed-oss-out-bias": transformers.SeedOssConfig(
            **COMMON,
            num_key_value_heads=2,
            head_dim=16,
            attention_bias=False,
            attention_out_bias=True,
            mlp_bias=True,
            pad_token_id=0,
            tie_word_embeddings=True,
        ),
        "smollm3": transformers.SmolLM3Config(
            **{**COMMON, "num_hidden_layers": 4},
            num_key_value_heads=2,
            no_rope_layer_interval=2,  # layers 1 and 3 without rope (SmolLM3-3B: every 4th)
            use_sliding_window=True,  # on the NoPE layers, as the config's layer_types say
            sliding_window=6,
            rope_parameters={"rope_type": "default", "rope_theta": 2000000.0},
            pad_token_id=None,  # SmolLM3Config's default, 128004, is past the tiny vocabulary
            tie_word_embeddings=True,
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
    randomize_biases(model)
    if config.model_type in RANDOM_SCALES:
        randomize_scales_and_biases(model)
    model.save_pretrained(folder)
    _as_remote_code_checkpoint(config.model_type, folder)


REMOTE_CODE_CHECKPOINTS = {
    "internlm3": {
        "architectures": ["InternLM3ForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_internlm3.InternLM3Config",
            "AutoModelForCausalLM": "modeling_internlm3.InternLM3ForCausalLM",
        },
    }
}
"""model_type -> the config.json fields of its released checkpoints, made for their own
modeling code, which transformers runs as another class (InternLM3 as Llama): they name
their class, where save_pretrained names transformers'."""
REMOTE_CODE_NAMES = {"internlm3": {"attention_bias": "qkv_bias", "mlp_bias": "bias"}}
"""model_type -> {transformers' field: the released config.json's name of it}."""


def _as_remote_code_checkpoint(model_type: str, folder: str) -> None:
    if model_type not in REMOTE_CODE_CHECKPOINTS:
        return
    path = Path(folder) / "config.json"
    fields = json.loads(path.read_text())
    for name, released in REMOTE_CODE_NAMES[model_type].items():
        fields[released] = fields.pop(name)
    path.write_text(json.dumps(fields | REMOTE_CODE_CHECKPOINTS[model_type], indent=2))


def randomize_biases(model: torch.nn.Module) -> None:
    """transformers initialises linear biases to 0: random ones make a model that drops a
    bias, or adds it in the wrong place, fail."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.1)


GEMMA3_VISION = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=1,
    num_attention_heads=2,
    image_size=28,
    patch_size=14,
)
"""A tiny SigLIP vision tower for an image-and-text Gemma 3."""


def save_tiny_gemma3_multimodal(folder: str) -> None:
    """A tiny Gemma3ForConditionalGeneration: the tiny Gemma 3 text model, a SigLIP tower;
    transformers writes its language model under `language_model.`."""
    config = transformers.Gemma3Config(
        text_config=tiny_configs()["gemma3"].to_dict(),
        vision_config=GEMMA3_VISION,
        mm_tokens_per_image=4,
        image_token_index=300,
        boi_token_index=301,
        eoi_token_index=302,
        architectures=["Gemma3ForConditionalGeneration"],
    )
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config)
    randomize_norms(model)
    model.save_pretrained(folder)


PIXTRAL_VISION = dict(
    model_type="pixtral",
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=1,
    num_attention_heads=2,
    head_dim=16,
    image_size=28,
    patch_size=14,
)
"""A tiny Pixtral vision tower for an image-and-text Mistral 3."""


def save_tiny_mistral3(folder: str, text: str, tied: bool = False) -> None:
    """A tiny Mistral3ForConditionalGeneration: the tiny `text` model ("mistral" as Mistral
    Small 3.1, "ministral3" as Ministral 3) beside a Pixtral tower; transformers writes its
    language model under `language_model.`. `tied`: the LM head is the embedding (Ministral
    3 3B's), stated both in the text config and the top-level one transformers ties by."""
    text_config = tiny_configs()[text]
    text_config.tie_word_embeddings = tied
    config = transformers.Mistral3Config(
        text_config=text_config.to_dict(),
        vision_config=PIXTRAL_VISION,
        image_token_index=300,
        tie_word_embeddings=tied,
        architectures=["Mistral3ForConditionalGeneration"],
    )
    torch.manual_seed(0)
    model = transformers.Mistral3ForConditionalGeneration(config)
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
