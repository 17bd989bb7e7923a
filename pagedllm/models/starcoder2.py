"""StarCoder 2, as transformers' Starcoder2ForCausalLM: Llama's decoder with LayerNorms
(weight and bias, `norm_epsilon`) in place of its RMSNorms, an MLP without a gate (c_fc, the
config's GELU, c_proj), biases on every linear layer (`use_bias`), and the config's
`sliding_window` on every layer (config_fields.sliding_window); the LM head is the
embedding. The norms and the GELU are pagedllm._C launches on a CPU, so decode steps replay
as Llama's do."""

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedllm.layers.activation import get_act_fn
from pagedllm.layers.inference_module import InferenceModule
from pagedllm.layers.layernorm import LayerNorm
from pagedllm.layers.linear import ColumnParallelLinear, RowParallelLinear
from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.models.llama import AttentionOptions, LlamaDecoderLayer, LlamaForCausalLM


class Starcoder2MLP(InferenceModule):
    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        hidden_act: str,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.c_fc = ColumnParallelLinear(
            hidden_size,
            intermediate_size,
            bias=bias,
            quant_config=quant_config,
            prefix=f"{prefix}.c_fc",
        )
        self.act = get_act_fn(hidden_act)
        self.c_proj = RowParallelLinear(
            intermediate_size,
            hidden_size,
            bias=bias,
            quant_config=quant_config,
            prefix=f"{prefix}.c_proj",
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class Starcoder2DecoderLayer(LlamaDecoderLayer):
    norm_class = LayerNorm


class Starcoder2ForCausalLM(LlamaForCausalLM):
    decoder_layer = Starcoder2DecoderLayer

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        return AttentionOptions(qkv_bias=config.use_bias, o_bias=config.use_bias)

    @classmethod
    def has_dense_mlp(cls, config: PretrainedConfig, layer_idx: int) -> bool:
        return False  # c_fc and c_proj, no gate, up and down

    @classmethod
    def lora_target_shapes(cls, config: PretrainedConfig) -> dict[str, tuple[int, int]]:
        """The attention's projections and the MLP's c_fc and c_proj."""
        shapes = super().lora_target_shapes(config)
        hidden, inter = config.hidden_size, config.intermediate_size
        for i in range(config.num_hidden_layers):
            shapes[f"model.layers.{i}.mlp.c_fc"] = (hidden, inter)
            shapes[f"model.layers.{i}.mlp.c_proj"] = (inter, hidden)
        return shapes

    def make_mlp(
        self,
        config: PretrainedConfig,
        layer_idx: int,
        quant_config: QuantizationConfig | None,
        prefix: str,
    ) -> nn.Module:
        return Starcoder2MLP(
            config.hidden_size,
            config.intermediate_size,
            self.hidden_act(config),
            quant_config,
            prefix,
            bias=config.use_bias,
        )
