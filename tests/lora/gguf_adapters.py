"""PEFT LoRA adapter folders written as GGUF files, as llama.cpp's convert_lora_to_gguf.py
writes them: metadata general.type "adapter", adapter.type "lora", adapter.lora.alpha
(float32) and the base model's general.architecture (nothing of its sizes); each adapted
weight's lora_A and lora_B under its GGUF name plus `.lora_a` / `.lora_b`, neither transposed,
lora_b's rows of llama's q/k permuted as the converter permutes the projections' (its
LoraTorchTensor reshapes and swaps the output rows, which are lora_b's); tensors F32, F16,
BF16 or Q8_0 (--outtype; Q8_0 falls back to F16 for rows that are not whole blocks).
The reference for what pagedllm/lora/gguf_adapter.py reads."""

import json
import os

import gguf
import numpy as np
import torch
from gguf.quants import dequantize, quantize
from safetensors.torch import load_file

from tests.gguf.tiny_gguf import ARCH_ENUMS, LLAMA_PERMUTED, gguf_arch, llama_cpp_permute
from tests.lora.peft_folders import PREFIX

F32 = gguf.GGMLQuantizationType.F32
F16 = gguf.GGMLQuantizationType.F16


def gguf_adapter_tensors(folder: str, arch: str, config) -> dict[str, torch.Tensor]:
    """The folder's adapter_model.safetensors under the GGUF names the converter gives them,
    for a base model of TINY architecture `arch` (tests/gguf/tiny_gguf.py) and `config`."""
    names = gguf.get_tensor_name_map(ARCH_ENUMS[arch], config.num_hidden_layers)
    out = {}
    for name, tensor in load_file(os.path.join(folder, "adapter_model.safetensors")).items():
        module, half = name.removeprefix(PREFIX).removesuffix(".weight").rsplit(".", 1)
        if half == "lora_B" and gguf_arch(arch) in LLAMA_PERMUTED:
            if module.endswith("q_proj"):
                tensor = llama_cpp_permute(tensor, config.num_attention_heads)
            if module.endswith("k_proj"):
                tensor = llama_cpp_permute(tensor, config.num_key_value_heads)
        out[f"{names.get_name(module)}.weight.{half.lower()}"] = tensor
    return out


def write_gguf_adapter(
    folder: str,
    path: str,
    arch: str,
    config,
    qtype: gguf.GGMLQuantizationType = F32,
    metadata: dict[str, tuple] | None = None,
    tensors: dict[str, torch.Tensor] | None = None,
) -> str:
    """The PEFT adapter in `folder` written to `path` with its tensors as `qtype`; `metadata`
    sets keys as tiny_gguf.set_metadata does (key -> (value, type), () to drop it) and
    `tensors` (GGUF name -> tensor, None to drop one) edits the tensors, for broken files."""
    with open(os.path.join(folder, "adapter_config.json")) as f:
        alpha = json.load(f)["lora_alpha"]
    writer = gguf.GGUFWriter(path, gguf_arch(arch))
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
    for key, value in (metadata or {}).items():
        writer.kv_data[0].pop(key, None)
        if value:
            writer.kv_data[0][key] = gguf.GGUFValue(*value)
    written = gguf_adapter_tensors(folder, arch, config) | (tensors or {})
    for name, tensor in written.items():
        if tensor is not None:
            array, stored_as = _quantized(tensor, qtype)
            writer.add_tensor(name, array, raw_dtype=None if stored_as == F32 else stored_as)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def stored(tensor: torch.Tensor, qtype: gguf.GGMLQuantizationType) -> torch.Tensor:
    """`tensor` as a file of `qtype` holds it, read back as float32."""
    array, stored_as = _quantized(tensor, qtype)
    return torch.from_numpy(np.array(dequantize(array, stored_as), dtype=np.float32))


def _quantized(
    tensor: torch.Tensor, qtype: gguf.GGMLQuantizationType
) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """(the tensor's data as `qtype`, qtype), or as F16 where its rows are not whole blocks
    of `qtype`, as the converter falls back (--outtype q8_0: lora_b's rows of r values)."""
    try:
        return quantize(tensor.float().numpy(), qtype), qtype
    except gguf.QuantError:
        return quantize(tensor.float().numpy(), F16), F16
