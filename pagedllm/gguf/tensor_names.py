"""A GGUF file's tensors under Hugging Face checkpoint names and layouts.

llama.cpp renames every tensor (`blk.3.attn_q.weight` for `model.layers.3.self_attn.q_proj.weight`),
stacks each layer's experts into one tensor, for llama and granite permutes the q/k rows, and
for the Gemmas stores the norm weights plus one; this undoes all four, so the model's
`load_weights` reads a GGUF as it reads a safetensors checkpoint. (Phi-3's fused q/k/v and
gate/up tensors keep their checkpoint's fused names.)
"""

import logging
import re
from collections.abc import Callable, Iterator

import torch
from gguf import GGMLQuantizationType

from pagedllm.gguf.exaone4 import EXAONE4
from pagedllm.gguf.gemma import POST_NORM_LAYOUT, checkpoint_norm, is_offset_norm
from pagedllm.gguf.glm4 import GLM4
from pagedllm.gguf.hf_config import CONFIG_TENSORS, LLAMA_LAYOUT, architecture
from pagedllm.gguf.metadata import integer
from pagedllm.gguf.moe import GRANITEMOE, QWEN2MOE, SHARED_EXPERT_GATE
from pagedllm.gguf.olmo2 import OLMO2
from pagedllm.gguf.phi3 import PHI3
from pagedllm.gguf.reader import (
    GGUFFile,
    TensorInfo,
    narrow,
    read_blocks,
    read_gguf,
    read_tensor,
)
from pagedllm.gguf.starcoder2 import STARCODER2

logger = logging.getLogger(__name__)
KeepBlocks = Callable[[str], bool]
"""Whether the loader takes the checkpoint tensor of this HF name as its GGUF blocks."""

# GGUF tensor names (without ".weight"/".bias") -> HF names
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
}
# Gemma 2 and 3 norm each block's outputs too; ffn_norm is the norm before the MLP
_POST_NORM_LAYER_NAMES = _LAYER_NAMES | {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Phi-3's checkpoints fuse q, k and v, and gate and up, and so does llama.cpp (see phi3.py)
_PHI3_LAYER_NAMES = _LAYER_NAMES | {
    "attn_qkv": "self_attn.qkv_proj",
    "ffn_up": "mlp.gate_up_proj",
}
# GLM-4's four norms under GLM's names; its checkpoints fuse gate and up (see glm4.py)
_GLM4_LAYER_NAMES = _LAYER_NAMES | {
    "attn_qkv": "self_attn.qkv_proj",
    "post_attention_norm": "post_self_attn_layernorm",
    "ffn_up": "mlp.gate_up_proj",
    "post_ffw_norm": "post_mlp_layernorm",
}
# StarCoder 2's ungated MLP
_STARCODER2_LAYER_NAMES = _LAYER_NAMES | {"ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
# Qwen2-MoE's shared expert and its gate (see moe.py)
_QWEN2MOE_LAYER_NAMES = _LAYER_NAMES | {
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    SHARED_EXPERT_GATE: "mlp.shared_expert_gate",
}
# each architecture's layer names where they are not _LAYER_NAMES; OLMo 2 and EXAONE 4 norm
# after the blocks under Gemma 2's GGUF names (see olmo2.py, exaone4.py)
_ARCH_LAYER_NAMES = {
    **dict.fromkeys((*POST_NORM_LAYOUT, OLMO2, EXAONE4), _POST_NORM_LAYER_NAMES),
    PHI3: _PHI3_LAYER_NAMES,
    GLM4: _GLM4_LAYER_NAMES,
    STARCODER2: _STARCODER2_LAYER_NAMES,
    QWEN2MOE: _QWEN2MOE_LAYER_NAMES,
}
# architectures whose converter permutes the q/k rows as llama's (Granite MoE's is Granite's)
_PERMUTED_QK = (*LLAMA_LAYOUT, GRANITEMOE)
# stacked expert tensors [E, out, in] -> the per-expert names of HF checkpoints
_EXPERT_NAMES = {
    "ffn_gate_exps": "gate_proj",
    "ffn_up_exps": "up_proj",
    "ffn_down_exps": "down_proj",
}
_EXPERT_INDEX = re.compile(r"\.experts\.\d+\.")
# one expert's tensor `blk.N.ffn_gate.E` [out, in], as older llama files (Mixtral) store them
_SINGLE_EXPERT_NAMES = {
    "ffn_gate": "gate_proj",
    "ffn_up": "up_proj",
    "ffn_down": "down_proj",
}


def iterate_gguf_weights(
    path: str,
    dtype: torch.dtype,
    keep_blocks: KeepBlocks | None = None,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """`(HF name, tensor)` for every weight of the GGUF file, one at a time: as its blocks
    (uint8 [..., bytes per row], see read_blocks) where keep_blocks says so, else dequantized
    to `dtype`. Shapes are HF's: a linear weight is [out, in]. Stacked expert tensors come
    out per expert, as `model.layers.N.mlp.experts.E.gate_proj.weight` [I, H]. For llama,
    the q/k row permutation of llama.cpp is undone (whole rows move, so blocks stay whole);
    for the Gemmas, a norm's weight comes as the checkpoint's (the stored weight minus one),
    in float64 whatever `dtype` (see gemma.checkpoint_norm). Phi-3's fused tensors come
    fused, as its checkpoints hold them (`self_attn.qkv_proj`, `mlp.gate_up_proj`). The rope
    scaling tensors (rope_freqs, LongRoPE's factors) are skipped, as the config holds them;
    so are the tensors whose HF name `keep` rejects (another pipeline stage's, another
    expert-parallel rank's experts): their data is never read. Of a stacked expert tensor
    only the kept experts' rows are read (or dequantized), each run of consecutive experts
    at once.

    The header is read now, so a bad file raises here rather than at the first tensor.
    """
    gguf = read_gguf(path)
    arch = architecture(gguf)
    return _iterate_weights(gguf, arch, dtype, keep_blocks, keep)


def _iterate_weights(
    gguf: GGUFFile,
    arch: str,
    dtype: torch.dtype,
    keep_blocks: KeepBlocks | None,
    keep: Callable[[str], bool] | None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Where keep_blocks is given (a quantized run), one log line names the quantized types
    it did not keep, which were dequantized."""
    dequantized = set()
    for info in gguf.tensors.values():
        if info.name in CONFIG_TENSORS:
            continue
        names = _hf_names(gguf, arch, info)
        wanted = [i for i, name in enumerate(names) if keep is None or keep(name)]
        if not wanted:
            continue
        as_blocks = keep_blocks is not None and keep_blocks(names[0])
        if keep_blocks and not as_blocks and info.qtype.name not in ("F32", "F16", "BF16"):
            dequantized.add(info.qtype.name)
        read = read_blocks if as_blocks else read_tensor
        offset_norm = is_offset_norm(arch, info.name)
        if _is_expert_stack(info.name):
            tensors = _read_experts(gguf, info, names, wanted, read)
        elif offset_norm:
            tensors = [(names[0], checkpoint_norm(read_tensor(gguf, info)))]
        elif arch in _PERMUTED_QK:
            tensors = [(names[0], _unpermute_llama_qk(gguf, arch, info.name, read(gguf, info)))]
        elif f".{SHARED_EXPERT_GATE}." in info.name and not as_blocks:
            tensors = [(names[0], read(gguf, info).reshape(1, -1))]  # [hidden] as [1, hidden]
        else:
            tensors = [(names[0], read(gguf, info))]
        for name, tensor in tensors:  # blocks stay bytes, a Gemma norm float64 (see gemma.py)
            yield name, tensor if as_blocks or offset_norm else tensor.to(dtype)
    if dequantized:
        logger.info("dequantized at load (no native kernels): %s", ", ".join(sorted(dequantized)))


def _read_experts(
    gguf: GGUFFile,
    info: TensorInfo,
    names: list[str],
    wanted: list[int],
    read: Callable[[GGUFFile, TensorInfo], torch.Tensor],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The wanted experts of a stacked [E, out, in] tensor, one [out, in] each: only their
    rows are read, one run of consecutive experts at a time (an expert-parallel rank's run)."""
    for run in _runs(wanted):
        part = read(gguf, narrow(info, run.start, len(run)))
        yield from zip(names[run.start : run.stop], part, strict=True)


def _runs(indices: list[int]) -> list[range]:
    """Ascending indices as runs of consecutive ones: [0, 1, 2, 5] -> range(0, 3), range(5, 6)."""
    runs: list[range] = []
    for i in indices:
        if runs and runs[-1].stop == i:
            runs[-1] = range(runs[-1].start, i + 1)
        else:
            runs.append(range(i, i + 1))
    return runs


def hf_tensor_types(path: str) -> dict[str, int]:
    """HF name -> GGUF type (an int) of every weight in the file; experts under
    `model.layers.N.mlp.experts.gate_proj.weight` (no expert index), stacked or one tensor
    each (whose types must then agree, as llama.cpp stacks them into one tensor)."""
    gguf = read_gguf(path)
    arch = architecture(gguf)
    types: dict[str, int] = {}
    for info in gguf.tensors.values():
        if info.name in CONFIG_TENSORS:
            continue
        name = _EXPERT_INDEX.sub(".experts.", _hf_names(gguf, arch, info)[0])
        if types.setdefault(name, int(info.qtype)) != int(info.qtype):
            raise ValueError(
                f"{path}: tensor {info.name} is {info.qtype.name}, but an earlier expert of "
                f"its layer is {GGMLQuantizationType(types[name]).name}; a layer's experts "
                "must be of one type"
            )
    return types


def _unpermute_llama_qk(gguf: GGUFFile, arch: str, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The q/k tensor `name` with llama.cpp's row permutation undone (unpermute_qk_rows), its
    head counts read from the file; any other tensor as it is."""
    heads = integer(gguf, f"{arch}.attention.head_count")
    if ".attn_k." in name:
        heads = integer(gguf, f"{arch}.attention.head_count_kv", heads)
    elif ".attn_q." not in name:
        return tensor
    return unpermute_qk_rows(tensor, heads)


def unpermute_qk_rows(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo the row permutation llama.cpp's converter applies to llama's q and k projections
    (and to a LoRA adapter's lora_b of them, whose rows are the projection's).

    HF rotates the two halves of each head, llama.cpp adjacent pairs, so the converter reorders
    each head's rows [2, D/2] -> [D/2, 2]; this reorders them back. Rows [heads * D, ...].
    """
    shape = tensor.shape
    per_head = tensor.reshape(heads, shape[0] // heads // 2, 2, *shape[1:])
    return per_head.transpose(1, 2).reshape(shape)


def permutes_qk(arch: str) -> bool:
    """Whether llama.cpp's converter permutes the q/k rows of GGUF architecture `arch`."""
    return arch in _PERMUTED_QK


def _is_expert_stack(name: str) -> bool:
    """Whether GGUF tensor `name` stacks a layer's experts ([E, out, in])."""
    parts = name.rpartition(".")[0].split(".")
    return len(parts) == 3 and parts[0] == "blk" and parts[2] in _EXPERT_NAMES


def _single_expert(parts: list[str]) -> bool:
    """Whether GGUF tensor `blk.N.ffn_gate.E` (split at dots) is one expert's."""
    return (
        len(parts) == 4
        and parts[0] == "blk"
        and parts[2] in _SINGLE_EXPERT_NAMES
        and parts[3].isdigit()
    )


def _layer_names(arch: str) -> dict[str, str]:
    return _ARCH_LAYER_NAMES.get(arch, _LAYER_NAMES)


def _hf_names(gguf: GGUFFile, arch: str, info: TensorInfo) -> list[str]:
    """The HF name(s) of one GGUF tensor: one, or one per expert for stacked experts."""
    if _is_expert_stack(info.name):
        parts = info.name.split(".")
        prefix = f"model.layers.{parts[1]}.mlp.experts"
        return [f"{prefix}.{e}.{_EXPERT_NAMES[parts[2]]}.{parts[3]}" for e in range(info.shape[0])]
    name = hf_name(arch, info.name)
    if name is None:
        raise ValueError(f"{gguf.path}: tensor {info.name!r} has no known Hugging Face name")
    return [name]


def hf_name(arch: str, name: str) -> str | None:
    """The HF name of GGUF tensor `name` of architecture `arch` that is one tensor (not a
    stack of experts): `blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`;
    None for a name with none."""
    base, _, suffix = name.rpartition(".")
    parts = base.split(".")
    layer_names = _layer_names(arch)
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{suffix}"
    if _single_expert(parts):
        part = _SINGLE_EXPERT_NAMES[parts[2]]
        return f"model.layers.{parts[1]}.mlp.experts.{int(parts[3])}.{part}.{suffix}"
    return None
