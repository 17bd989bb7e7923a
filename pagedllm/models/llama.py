"""Llama (and the Llama-shaped family: Mistral, Qwen2, Qwen3 via options).

Attention options cover the family's differences: q/k/v bias (Qwen2), o_proj bias
(Llama's attention_bias), per-head q/k RMSNorm before rotary (Qwen3), GPT-J's rotation of
adjacent channel pairs (ERNIE 4.5) and Llama 4's position-dependent query scale (Ministral
3). Layers without rope (SmolLM3's NoPE layers) are the config's (config_fields.uses_rope).
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedllm import _custom_ops as ops
from pagedllm.distributed import get_tensor_model_parallel_world_size
from pagedllm.distributed.parallel_state import get_pp_group
from pagedllm.layers.activation import get_act_and_mul_fn
from pagedllm.layers.attention import Attention
from pagedllm.layers.inference_module import InferenceModule
from pagedllm.layers.layernorm import RMSNorm
from pagedllm.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from pagedllm.layers.logits_processor import LogitsProcessor
from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.layers.rotary_embedding import RotaryEmbedding, get_nope, get_rope
from pagedllm.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from pagedllm.models.config_fields import (
    head_dim,
    layer_type,
    norm_eps,
    rope_parameters,
    rotary_dim,
    sliding_window,
    uses_rope,
)
from pagedllm.models.pipeline import (
    IntermediateTensors,
    PPMissingLayer,
    layer_index,
    make_layers,
    missing_prefixes,
)
from pagedllm.models.weight_loading import (
    NESTED_LANGUAGE_MODEL,
    WeightsMapper,
    load_named_weights,
)


@dataclass(frozen=True)
class AttentionOptions:
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    scale: float | None = None
    """The softmax scale of q.k; None: head_dim ** -0.5."""
    logits_soft_cap: float | None = None
    """Gemma 2's attn_logit_softcapping: scores s become cap * tanh(s / cap)."""
    is_neox_style: bool = True
    """The rotary embedding's pairs: channel i with i + rotary_dim / 2 (rotate_half, as
    Llama); False: channels 2i and 2i + 1 (GPT-J's, as ERNIE 4.5 and GLM-4)."""
    llama_4_scaling: tuple[float, int] | None = None
    """(beta, original_max_position_embeddings): rotated q is multiplied by
    1 + beta * ln(1 + floor(position / original)) (Llama 4's attention temperature, which
    Ministral 3 takes); None: unscaled."""


def llama_4_attn_scale(positions: torch.Tensor, beta: float, original: int) -> torch.Tensor:
    """positions [T] -> [T, 1] float32, transformers' get_llama_4_attn_scale: 1 up to the
    original context, growing with the log of each multiple of it past there."""
    return (1 + beta * torch.log(1 + torch.floor(positions / original)))[:, None]


@dataclass(frozen=True)
class Multipliers:
    """Constant scales of the residual stream (all 1 but in Granite): the input embeddings,
    each block's output before it joins the residual, and the logits."""

    embedding: float = 1.0
    residual: float = 1.0
    logits: float = 1.0


class LlamaMLP(InferenceModule):
    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        hidden_act: str = "silu",
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        bias: bool = False,
    ) -> None:
        """`bias`: the config's `mlp_bias` (biases on gate, up and down, as vLLM's)."""
        super().__init__()
        self.act_fn = get_act_and_mul_fn(hidden_act)
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size,
            [intermediate_size] * 2,
            bias=bias,
            quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            intermediate_size,
            hidden_size,
            bias=bias,
            quant_config=quant_config,
            prefix=f"{prefix}.down_proj",
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaAttention(InferenceModule):
    def __init__(
        self,
        config: PretrainedConfig,
        options: AttentionOptions,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        norm_class: type[RMSNorm] = RMSNorm,
    ) -> None:
        """norm_class: the q/k norms' (Gemma's scale by 1 + weight)."""
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        self.head_dim = head_dim(config)
        num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            self.head_dim,
            config.num_attention_heads,
            num_kv_heads,
            bias=options.qkv_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_dim,
            config.hidden_size,
            bias=options.o_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )
        layer_idx = layer_index(prefix)
        self.rotary_emb = self._rope(config, options, layer_idx)
        self.llama_4_scaling = options.llama_4_scaling
        scale = self.head_dim**-0.5 if options.scale is None else options.scale
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            scale,
            self.num_kv_heads,
            per_layer_sliding_window=sliding_window(config, layer_idx),
            logits_soft_cap=options.logits_soft_cap,
        )
        self.q_norm = self.k_norm = None
        if options.qk_norm:
            self.q_norm = norm_class(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = norm_class(self.head_dim, eps=config.rms_norm_eps)
        assert tp_size * self.num_heads == config.num_attention_heads

    def _rope(
        self, config: PretrainedConfig, options: AttentionOptions, layer_idx: int
    ) -> RotaryEmbedding:
        """The layer's rotary embedding; for a layer without rope (a NoPE layer), one that
        turns by angle 0 (get_nope)."""
        if not uses_rope(config, layer_idx):
            return get_nope(self.head_dim, config.max_position_embeddings)
        theta, scaling = rope_parameters(config, layer_type(config, layer_idx))
        return get_rope(
            self.head_dim,
            rotary_dim(config, self.head_dim),
            config.max_position_embeddings,
            theta,
            scaling,
            options.is_neox_style,
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        qk_norms = None if self.q_norm is None else (self.q_norm, self.k_norm)
        q, k = self.rotary_emb(positions, q, k, qk_norms)  # each head normed first
        if self.llama_4_scaling is not None:
            q = q * llama_4_attn_scale(positions, *self.llama_4_scaling).to(q.dtype)
        return self.o_proj(self.attn(q, k, v))


class LlamaDecoderLayer(InferenceModule):
    norm_class: type[RMSNorm] = RMSNorm
    """The class of every norm of the model (Gemma's scale by 1 + weight; StarCoder 2's are
    LayerNorms)."""
    attention_class: type[LlamaAttention] = LlamaAttention
    """The class of the self-attention (OLMoE norms q and k over whole projections)."""

    def __init__(
        self,
        config: PretrainedConfig,
        options: AttentionOptions,
        mlp: nn.Module,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        residual_multiplier: float = 1.0,
    ) -> None:
        """residual_multiplier (Granite's): the attention's and the MLP's outputs are
        scaled by it before they join the residual stream."""
        super().__init__()
        self.self_attn = self.attention_class(
            config, options, quant_config, f"{prefix}.self_attn", self.norm_class
        )
        self.mlp = mlp
        self.residual_multiplier = residual_multiplier
        eps = norm_eps(config)
        self.input_layernorm = self.norm_class(config.hidden_size, eps=eps)
        self.post_attention_layernorm = self.norm_class(config.hidden_size, eps=eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        if self.residual_multiplier != 1.0:
            hidden_states = ops.scale(hidden_states, self.residual_multiplier)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        hidden_states = self.mlp(hidden_states)
        if self.residual_multiplier != 1.0:
            hidden_states = ops.scale(hidden_states, self.residual_multiplier)
        return hidden_states, residual


class LlamaModel(nn.Module):
    """The decoder; under pipeline parallelism only this stage's share: the embedding on
    the first stage (and on the last when the LM head is tied to it), layers
    [start_layer, end_layer), the final norm on the last stage."""

    def __init__(
        self,
        config: PretrainedConfig,
        layer_fn: Callable[[int], LlamaDecoderLayer],
        quant_config: QuantizationConfig | None = None,
        prefix: str = "model",
        embedding_multiplier: float = 1.0,
        norm_class: type[RMSNorm] = RMSNorm,
    ) -> None:
        """embedding_multiplier (Granite's): the input embeddings are scaled by it, whether
        looked up here or passed in as inputs_embeds."""
        super().__init__()
        self.embedding_multiplier = embedding_multiplier
        pp = get_pp_group()
        self.is_first_rank, self.is_last_rank = pp.is_first_rank, pp.is_last_rank
        self.embed_tokens: nn.Module = PPMissingLayer()
        if pp.is_first_rank or (config.tie_word_embeddings and pp.is_last_rank):
            self.embed_tokens = VocabParallelEmbedding(
                config.vocab_size,
                config.hidden_size,
                quant_config=quant_config,
                prefix=f"{prefix}.embed_tokens",
            )
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers, layer_fn
        )
        self.norm: nn.Module = PPMissingLayer()
        if pp.is_last_rank:
            self.norm = norm_class(config.hidden_size, eps=norm_eps(config))

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        if self.is_first_rank:
            if inputs_embeds is None:
                inputs_embeds = self.get_input_embeddings(input_ids)
            if self.embedding_multiplier != 1.0:
                inputs_embeds = ops.scale(inputs_embeds, self.embedding_multiplier)
            hidden_states, residual = inputs_embeds, None
        else:
            assert intermediate_tensors is not None, "a later stage continues from the last"
            hidden_states = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]
        for layer in self.layers[self.start_layer : self.end_layer]:
            hidden_states, residual = layer(positions, hidden_states, residual)
        if not self.is_last_rank:
            return IntermediateTensors({"hidden_states": hidden_states, "residual": residual})
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    """input_ids [T], positions [T] -> hidden states [T, hidden]; logits via compute_logits."""

    stacked_params_mapping = [
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
        ("gate_up_proj", "gate_proj", 0),
        ("gate_up_proj", "up_proj", 1),
    ]

    decoder_layer: type[LlamaDecoderLayer] = LlamaDecoderLayer
    """The class of each decoder layer (OLMo 2 places its norms differently)."""

    hf_to_pagedllm_mapper = WeightsMapper()
    """Renames of the checkpoint's names to the model's, which the loader, the quantized
    plan and LoRA adapters all go by: none, unless a checkpoint nests the model (Gemma 3's,
    Mistral 3's: weight_loading.NESTED_LANGUAGE_MODEL)."""

    def __init__(
        self, config: PretrainedConfig, quant_config: QuantizationConfig | None = None
    ) -> None:
        super().__init__()
        self.config = config
        options = self.attention_options(config)

        multipliers = self.multipliers(config)

        def layer_fn(i: int) -> LlamaDecoderLayer:
            prefix = f"model.layers.{i}"
            mlp = self.make_mlp(config, i, quant_config, f"{prefix}.mlp")
            return self.decoder_layer(
                config, options, mlp, quant_config, prefix, multipliers.residual
            )

        self.model = LlamaModel(
            config,
            layer_fn,
            quant_config,
            embedding_multiplier=multipliers.embedding,
            norm_class=self.decoder_layer.norm_class,
        )
        self.lm_head: nn.Module = PPMissingLayer()
        if get_pp_group().is_last_rank:
            self.lm_head = ParallelLMHead(
                config.vocab_size, config.hidden_size, quant_config=quant_config, prefix="lm_head"
            )
            if config.tie_word_embeddings:
                self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(
            config.vocab_size,
            scale=multipliers.logits,
            soft_cap=getattr(config, "final_logit_softcapping", None),
        )

    @classmethod
    def multipliers(cls, config: PretrainedConfig) -> "Multipliers":
        return Multipliers(logits=getattr(config, "logit_scale", None) or 1.0)

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        bias = bool(getattr(config, "attention_bias", False))
        return AttentionOptions(qkv_bias=bias, o_bias=bias)

    @classmethod
    def mlp_bias(cls, config: PretrainedConfig) -> bool:
        """Whether gate, up and down have biases (Llama's `mlp_bias`)."""
        return bool(getattr(config, "mlp_bias", False))

    @classmethod
    def hidden_act(cls, config: PretrainedConfig) -> str:
        """The MLP's gated activation (layers/activation.py's get_act_and_mul_fn)."""
        return config.hidden_act

    @classmethod
    def packed_modules_mapping(cls) -> dict[str, list[str]]:
        """Fused parameter -> the checkpoint tensors it holds, in order."""
        packed: dict[str, list[str]] = {}
        for param_name, weight_name, _ in cls.stacked_params_mapping:
            packed.setdefault(param_name, []).append(weight_name)
        return packed

    @classmethod
    def has_dense_mlp(cls, config: PretrainedConfig, layer_idx: int) -> bool:
        """Whether layer `layer_idx`'s MLP is gate, up and down projections (make_mlp's)."""
        return True

    @classmethod
    def lora_target_shapes(cls, config: PretrainedConfig) -> dict[str, tuple[int, int]]:
        """Each linear layer a LoRA adapter may target, by its checkpoint (Hugging Face)
        name, with its (in_features, out_features): the attention's q/k/v/o projections and
        a dense MLP's gate/up/down (lora/peft_adapter.py checks an adapter against them)."""
        size = head_dim(config)
        heads = config.num_attention_heads
        q, kv = heads * size, (getattr(config, "num_key_value_heads", None) or heads) * size
        hidden, inter = config.hidden_size, config.intermediate_size
        shapes: dict[str, tuple[int, int]] = {}
        for i in range(config.num_hidden_layers):
            attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
            shapes[f"{attn}.q_proj"] = (hidden, q)
            shapes[f"{attn}.k_proj"] = shapes[f"{attn}.v_proj"] = (hidden, kv)
            shapes[f"{attn}.o_proj"] = (q, hidden)
            if cls.has_dense_mlp(config, i):
                shapes[f"{mlp}.gate_proj"] = shapes[f"{mlp}.up_proj"] = (hidden, inter)
                shapes[f"{mlp}.down_proj"] = (inter, hidden)
        return shapes

    def make_mlp(
        self,
        config: PretrainedConfig,
        layer_idx: int,
        quant_config: QuantizationConfig | None,
        prefix: str,
    ) -> nn.Module:
        return LlamaMLP(
            config.hidden_size,
            config.intermediate_size,
            self.hidden_act(config),
            quant_config,
            prefix,
            bias=self.mlp_bias(config),
        )

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        """inputs_embeds [T, hidden], when given, stand for the embeddings of input_ids (vLLM's
        signature; the CPU decode graphs pass their static buffer). A stage after the first
        continues from the previous stage's intermediate_tensors; one before the last
        returns its own."""
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden_states)

    def expert_params_mapping(self) -> list[tuple[str, str, int, str]]:
        return []

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        skip = ("lm_head.",) if self.config.tie_word_embeddings else ()
        load_named_weights(
            self,
            weights,
            self.stacked_params_mapping,
            self.expert_params_mapping(),
            skip_prefixes=skip + missing_prefixes(self),
        )


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral's decoder is Llama's; a config's `sliding_window` applies to every layer.
    Also (with Ministral 3's) the language model of Mistral3ForConditionalGeneration
    checkpoints, run text-only (config.TEXT_ONLY_ARCHITECTURES)."""

    hf_to_pagedllm_mapper = NESTED_LANGUAGE_MODEL
