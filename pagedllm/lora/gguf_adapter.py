"""A LoRA adapter as a GGUF file, as llama.cpp's convert_lora_to_gguf.py writes one from a
PEFT folder (and `llama-cli --lora` reads it), read as the adapter of that folder.

The file holds metadata `general.type = "adapter"`, `adapter.type = "lora"`,
`general.architecture` (the base model's, in llama.cpp's terms) and `adapter.lora.alpha`
(float32, the folder's lora_alpha); and for each adapted weight two tensors named after the
model's GGUF tensor: `blk.N.attn_q.weight.lora_a` [r, in] and `.lora_b` [out, r] (torch
order: PEFT's lora_A and lora_B, neither transposed). The converter renames them as it renames
a model (gguf/tensor_names.py maps them back), and for llama's layout permutes the q/k rows of
lora_b only, the rows of the output (lora_a's rows are the rank's). llama.cpp scales each
module's product by alpha / r (r: its lora_b's columns), by 1 where alpha is 0 or absent:
PEFT's scaling without rank_pattern, alpha_pattern or use_rslora, which the converter does not
carry. Tensors of any type gguf.quants dequantizes are read as float32 (F32, F16 and BF16
exactly; the converter's q8_0 as llama.cpp dequantizes it). The norm vectors that
mergekit-extract-lora adds (`*_norm.weight`) are skipped, as llama.cpp skips them.
"""

import math
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from pagedllm.gguf.hf_config import gguf_architecture
from pagedllm.gguf.reader import GGUFFile, TensorInfo, read_gguf, read_tensor
from pagedllm.gguf.tensor_names import hf_name, permutes_qk, unpermute_qk_rows
from pagedllm.logger import init_logger
from pagedllm.lora.peft_adapter import check_target, model_modules
from pagedllm.models.weight_loading import WeightsMapper

logger = init_logger(__name__)

GGUF_SUFFIX = ".gguf"
ALPHA_KEY = "adapter.lora.alpha"
# activated LoRA (an adapter applied from its invocation tokens on), as the PEFT path refuses it
_ALORA_KEY = "adapter.alora.invocation_tokens"
_HALVES = ("lora_a", "lora_b")
_NORM_SUFFIX = "_norm.weight"


@dataclass(frozen=True)
class AdapterBase:
    """The served model, which a GGUF adapter must be of: its transformers class and config
    (whose head counts group the q/k rows that llama.cpp permutes)."""

    architecture: str
    hf_config: PretrainedConfig


def is_gguf_adapter(path: str) -> bool:
    """Whether `path` names a GGUF adapter file rather than a PEFT folder."""
    return path.lower().endswith(GGUF_SUFFIX)


def read_gguf_adapter(
    path: str,
    base: AdapterBase,
    target_shapes: dict[str, tuple[int, int]],
    max_lora_rank: int,
    mapper: WeightsMapper | None = None,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """module -> (lora_A [r, in], lora_B * scaling [out, r]), float32 on the CPU, as
    peft_adapter.load_lora_weights gives them for the adapter's PEFT folder: modules under the
    model's checkpoint names (renamed by `mapper`, the model class's hf_to_pagedllm_mapper),
    checked against `target_shapes` and max_lora_rank as a folder's are. ValueError naming
    what is wrong: not a GGUF file, not a LoRA adapter, an adapter of another architecture."""
    gguf = _open(path)
    arch = _check_header(gguf, base)
    pairs = _tensor_pairs(gguf)
    weight_of = {_module_name(arch, weight, path): weight for weight in pairs}
    sources = model_modules(list(weight_of), mapper or WeightsMapper(), path)
    alpha = _alpha(gguf)
    weights = {}
    for module, source in sources.items():
        weight = weight_of[source]
        a_info, b_info = pairs[weight]
        rank = check_target(
            path, module, source, a_info.shape, b_info.shape, target_shapes, max_lora_rank
        )
        a, b = read_tensor(gguf, a_info), read_tensor(gguf, b_info)
        if permutes_qk(arch):
            b = _unpermute_b(b, weight, base.hf_config)
        weights[module] = (a, b * (alpha / rank if alpha else 1.0))
    return weights


def _open(path: str) -> GGUFFile:
    try:
        return read_gguf(path)
    except FileNotFoundError:
        raise ValueError(f"LoRA adapter file {path} does not exist") from None
    except ValueError as e:  # read_gguf's messages start with the path
        raise ValueError(f"LoRA adapter {e}") from None


def _check_header(gguf: GGUFFile, base: AdapterBase) -> str:
    """The adapter's architecture, once the file is a LoRA adapter of the served model's."""
    path, metadata = gguf.path, gguf.metadata
    kind = metadata.get("general.type")
    if kind != "adapter":
        raise ValueError(
            f"{path} is not a LoRA adapter (general.type {kind!r}, not 'adapter'); a GGUF "
            "model is served as the model, not as an adapter"
        )
    adapter_type = metadata.get("adapter.type")
    if adapter_type != "lora":
        raise ValueError(
            f"GGUF adapter {path} is of adapter.type {adapter_type!r}; pagedllm serves 'lora'"
        )
    if _ALORA_KEY in metadata:
        raise ValueError(
            f"LoRA adapter {path} is an activated LoRA ({_ALORA_KEY}), which pagedllm does "
            "not serve"
        )
    arch = metadata.get("general.architecture")
    served = gguf_architecture(base.architecture)
    if served is None:
        raise ValueError(
            f"LoRA adapter {path} is a GGUF adapter, which pagedllm serves on the models "
            f"llama.cpp converts; the served model's {base.architecture} is none of them"
        )
    if arch != served:
        raise ValueError(
            f"LoRA adapter {path} is for {arch!r} models (general.architecture), but the "
            f"served model ({base.architecture}) is {served!r}"
        )
    return arch


def _tensor_pairs(gguf: GGUFFile) -> dict[str, tuple[TensorInfo, TensorInfo]]:
    """The model's GGUF weight name (`blk.0.attn_q.weight`) -> (its lora_a, its lora_b);
    ValueError for a tensor of another kind or a lone half."""
    halves: dict[str, dict[str, TensorInfo]] = {}
    norms = []
    for name, info in gguf.tensors.items():
        weight, _, half = name.rpartition(".")
        if weight and half in _HALVES:
            halves.setdefault(weight, {})[half] = info
        elif name.endswith(_NORM_SUFFIX):
            norms.append(name)
        else:
            raise ValueError(
                f"LoRA adapter {gguf.path}: tensor {name!r} is not a LoRA weight "
                "(<weight>.lora_a / <weight>.lora_b)"
            )
    if norms:
        logger.warning(
            "LoRA adapter %s: its %d norm weights (%s ...) are skipped, as llama.cpp skips them",
            gguf.path,
            len(norms),
            norms[0],
        )
    if not halves:
        raise ValueError(f"LoRA adapter {gguf.path} holds no LoRA weights")
    for weight, pair in halves.items():
        if len(pair) != len(_HALVES):
            missing = next(h for h in _HALVES if h not in pair)
            raise ValueError(f"LoRA adapter {gguf.path}: {weight} has no {weight}.{missing}")
    return {weight: (pair["lora_a"], pair["lora_b"]) for weight, pair in halves.items()}


def _module_name(arch: str, weight: str, path: str) -> str:
    """The checkpoint module of GGUF weight `weight`: blk.0.attn_q.weight ->
    model.layers.0.self_attn.q_proj."""
    name = hf_name(arch, weight)
    if name is None or not name.endswith(".weight"):
        raise ValueError(
            f"LoRA adapter {path}: {weight}.lora_a / .lora_b adapt {weight!r}, which is no "
            f"weight pagedllm knows of a {arch!r} model (LoRA on stacked MoE experts is not "
            "served)"
        )
    return name.removesuffix(".weight")


def _unpermute_b(b: torch.Tensor, weight: str, config: PretrainedConfig) -> torch.Tensor:
    """lora_b [out, r] of a q or k projection with llama.cpp's row permutation undone; any
    other module's as it is."""
    heads = config.num_attention_heads
    if ".attn_k." in weight:
        heads = getattr(config, "num_key_value_heads", None) or heads
    elif ".attn_q." not in weight:
        return b
    return unpermute_qk_rows(b, heads)


def _alpha(gguf: GGUFFile) -> float:
    """adapter.lora.alpha, 0 where absent (llama.cpp's default: each module scaled by 1)."""
    alpha = gguf.metadata.get(ALPHA_KEY, 0.0)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise ValueError(f"LoRA adapter {gguf.path}: {ALPHA_KEY} {alpha!r} is not a number")
    return float(alpha)
