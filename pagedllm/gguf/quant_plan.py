"""The GGUF type each tensor of a model gets under a quantized file type, keyed by the tensor's
Hugging Face name and shape, and its bytes: numel / block size * type size.

File types:

- `q4_k_m`: llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M, as `llama_tensor_get_type` in llama.cpp's
  src/llama-quant.cpp picks them:
  - Q4_K by default, the token embedding included (an untied one);
  - the LM head (and a tied token embedding, which stands for it) Q6_K, or Q8_0 when its rows
    are not whole Q4_K blocks of 256;
  - attn_v (v_proj) and ffn_down (down_proj, the experts' too) Q6_K in the layers that
    `use_more_bits(i, n)` picks: i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2 (half the layers);
  - a "70B" model (llama.cpp's LLM_TYPE_70B: llama/mistral with 80 layers and fewer kv than
    query heads, qwen2 with 80 layers) gets Q5_K rather than Q4_K for its other attn_v;
  - a model of exactly 8 experts (Mixtral's shape) gets Q8_0 attn_v and attn_k, Q5_K attn_output;
  - the fallbacks when a row (the input dimension, ggml's ne[0]) is not whole blocks:
    Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and F16 when not even 32-blocks fit.
  Layers are counted by the index in the name: llama.cpp counts attn_v tensors in layer order,
  which is the same when every layer has one, as in every architecture pagedllm runs.
  Not implemented: rules for architectures pagedllm does not run (Falcon's ffn_down), user
  overrides (--output-tensor-type, --tensor-type, --pure) and imatrix-dependent choices.
- `q8_0`: LLAMA_FTYPE_MOSTLY_Q8_0: Q8_0 for every 2-D weight (llama.cpp's rules change nothing
  for it).
- `int8`: pagedllm's own int8 mode (layers/quantization/int8.py): Q8_0 blocks for every linear
  layer (the experts included), the token embedding and the LM head; every other tensor, the
  MoE router too (its error would change which experts run), in the model's float type.

In the GGUF file types, tensors llama.cpp never quantizes stay F32 as its converter writes
them: 1-D tensors (norms, biases), every `*norm.weight`, and the MoE router (`mlp.gate`).
A Q8_0 row that is not whole 32-blocks (llama.cpp refuses such a tensor) stays in float:
F16, or the float type under int8.
"""

import re
from dataclasses import dataclass
from enum import Enum, auto

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
FILE_TYPES = ("q4_k_m", "q8_0", "int8")


@dataclass(frozen=True)
class PlanModel:
    """What the rules read from a model besides a tensor's name and shape."""

    model_type: str  # transformers' model_type: "llama", "qwen2", "qwen3_moe", ...
    num_layers: int
    num_heads: int
    num_kv_heads: int
    num_experts: int = 0
    tied_embeddings: bool = False
    float_type: GGMLQuantizationType = Q.F32  # int8's type for what it leaves unquantized


class Category(Enum):
    """llama.cpp's tensor categories (tensor_category), plus the tensors it never quantizes."""

    TOKEN_EMBD = auto()
    OUTPUT = auto()
    ATTENTION_Q = auto()
    ATTENTION_K = auto()
    ATTENTION_V = auto()
    ATTENTION_OUTPUT = auto()
    FFN_GATE = auto()
    FFN_UP = auto()
    FFN_DOWN = auto()
    ROUTER = auto()
    FLOAT = auto()  # 1-D, norms, anything else: not quantized


# the module name before ".weight" -> category
_MODULE_CATEGORY = {
    "embed_tokens": Category.TOKEN_EMBD,
    "lm_head": Category.OUTPUT,
    "q_proj": Category.ATTENTION_Q,
    "k_proj": Category.ATTENTION_K,
    "v_proj": Category.ATTENTION_V,
    "o_proj": Category.ATTENTION_OUTPUT,
    "gate_proj": Category.FFN_GATE,
    "up_proj": Category.FFN_UP,
    "down_proj": Category.FFN_DOWN,
    "c_fc": Category.FFN_UP,  # StarCoder 2's gateless MLP, llama.cpp's ffn_up and ffn_down
    "c_proj": Category.FFN_DOWN,
    "gate": Category.ROUTER,
}
_LAYER = re.compile(r"\bmodel\.layers\.(\d+)\.")
# llama.cpp's fallbacks for a row that is not whole blocks of the chosen type
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}


def category(name: str, shape: tuple[int, ...]) -> Category:
    module, _, param = name.rpartition(".")
    leaf = module.rpartition(".")[2]
    if len(shape) < 2 or param != "weight" or leaf not in _MODULE_CATEGORY:
        return Category.FLOAT
    return _MODULE_CATEGORY[leaf]


def tensor_type(
    file_type: str, name: str, shape: tuple[int, ...], model: PlanModel
) -> GGMLQuantizationType:
    """The GGUF type of checkpoint tensor `name` of `shape` ([out, in]) under `file_type`."""
    if file_type not in FILE_TYPES:
        raise ValueError(f"file type {file_type!r} is not one of {', '.join(FILE_TYPES)}")
    kind = category(name, shape)
    if file_type == "int8":
        if kind in (Category.FLOAT, Category.ROUTER):
            return model.float_type
        return _fit(Q.Q8_0, shape[-1], model.float_type)
    if kind in (Category.FLOAT, Category.ROUTER):
        return Q.F32
    if file_type == "q8_0":
        return _fit(Q.Q8_0, shape[-1], Q.F16)
    return _fit(_q4_k_m(kind, name, shape[-1], model), shape[-1], Q.F16)


def _q4_k_m(kind: Category, name: str, row: int, model: PlanModel) -> GGMLQuantizationType:
    """llama_tensor_get_type_impl for LLAMA_FTYPE_MOSTLY_Q4_K_M, before the fallbacks."""
    if kind is Category.OUTPUT or (kind is Category.TOKEN_EMBD and model.tied_embeddings):
        return Q.Q8_0 if row % GGML_QUANT_SIZES[Q.Q4_K][0] else Q.Q6_K
    eight_experts = model.num_experts == 8
    more_bits = kind in (Category.ATTENTION_V, Category.FFN_DOWN) and use_more_bits(
        _layer(name), model.num_layers
    )
    if kind is Category.ATTENTION_V:
        qtype = Q.Q6_K if more_bits else Q.Q5_K if is_70b(model) else Q.Q4_K
        return Q.Q8_0 if eight_experts else qtype
    if kind is Category.ATTENTION_K and eight_experts:
        return Q.Q8_0
    if kind is Category.ATTENTION_OUTPUT and eight_experts:
        return Q.Q5_K
    return Q.Q6_K if more_bits else Q.Q4_K


def use_more_bits(layer: int, num_layers: int) -> bool:
    """llama.cpp's pick of the layers whose attn_v and ffn_down get more bits: the first and
    last eighth, and every third layer between."""
    eighth = num_layers // 8
    return layer < eighth or layer >= 7 * num_layers // 8 or (layer - eighth) % 3 == 2


def is_70b(model: PlanModel) -> bool:
    """llama.cpp's LLM_TYPE_70B: llama with 80 layers and grouped kv heads, or qwen2's 80."""
    if model.num_layers != 80:
        return False
    if model.model_type in ("llama", "mistral"):
        return model.num_heads != model.num_kv_heads
    return model.model_type == "qwen2"


def _layer(name: str) -> int:
    match = _LAYER.search(name)
    if match is None:
        raise ValueError(f"tensor {name!r} names no layer (model.layers.N.)")
    return int(match.group(1))


def _fit(
    qtype: GGMLQuantizationType, row: int, last_resort: GGMLQuantizationType
) -> GGMLQuantizationType:
    """llama.cpp's tensor_type_fallback: `qtype` when a row of `row` values is whole blocks of
    it, else its fallback when that fits, else `last_resort` (a float type)."""
    for candidate in (qtype, _FALLBACK.get(qtype)):
        if candidate is not None and row % GGML_QUANT_SIZES[candidate][0] == 0:
            return candidate
    return last_resort


def tensor_bytes(qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of `shape` in `qtype`; its rows (last dimension) must be whole blocks."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    numel = 1
    for size in shape:
        numel *= size
    assert shape[-1] % block_size == 0, f"rows of {shape[-1]} are not whole {qtype.name} blocks"
    return numel // block_size * type_size
