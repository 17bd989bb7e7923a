"""Quantized checkpoints of the tiny models, written as GPTQ, AWQ, compressed-tensors and
fp8 tools write them, each beside a float32 "reference" folder holding the weights they
dequantize to.

GPTQ and AWQ are packed here from their formats' definitions (AutoGPTQ's and AutoAWQ's
`pack`: the codes, the order of AWQ's columns, GPTQ's zeros stored minus one as GPTQModel
subtracts it, word by word); the
reference weights come from the codes before packing, so a reader that unpacks wrongly
differs from them. compressed-tensors checkpoints are written by the compressed-tensors
library itself, and fp8 ones by torch's float8 cast.
"""

import json
import os
import re
import shutil

import torch
from safetensors import safe_open
from safetensors.torch import save_file

TARGETS = re.compile(r".*\.((q|k|v|o|gate|up|down|qkv|gate_up)_proj|w1|w2|w3)\.weight$")
"""The linear layers quantization tools quantize: not the embedding, LM head or router;
Phi-3's fused qkv_proj and gate_up_proj whole, Mixtral's experts' w1, w3 and w2, as the
tools quantize the checkpoint's nn.Linear modules."""


def _float_weights(folder: str) -> dict[str, torch.Tensor]:
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def _write(folder: str, source: str, weights: dict, quantization_config: dict | None) -> str:
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(source):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(source, name), folder)
    if quantization_config is not None:
        path = os.path.join(folder, "config.json")
        with open(path) as f:
            config = json.load(f)
        config["quantization_config"] = quantization_config
        with open(path, "w") as f:
            json.dump(config, f, indent=2)
    save_file({k: v.contiguous() for k, v in weights.items()}, f"{folder}/model.safetensors")
    return folder


def group_quantize(
    w: torch.Tensor, bits: int, group: int, symmetric: bool, g_idx: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPTQ's min-max quantizer per row and group: (codes uint8 [N, K], scale fp16 [N, G],
    zero int32 [N, G]) with w ~ scale * (codes - zero)."""
    n, k = w.shape
    maxq = (1 << bits) - 1
    if g_idx is None:
        g_idx = torch.arange(k) // group
    groups = int(g_idx.max()) + 1
    scale = torch.empty(n, groups)
    zero = torch.empty(n, groups, dtype=torch.int32)
    for g in range(groups):
        cols = w[:, g_idx == g]
        lo, hi = cols.amin(1).clamp(max=0), cols.amax(1).clamp(min=0)
        if symmetric:
            amax = torch.maximum(lo.abs(), hi).clamp(min=1e-5)
            scale[:, g] = 2 * amax / maxq
            zero[:, g] = (maxq + 1) // 2
        else:
            scale[:, g] = ((hi - lo) / maxq).clamp(min=1e-5)
            zero[:, g] = torch.round(-lo / scale[:, g]).to(torch.int32)
    scale = scale.to(torch.float16)
    s, z = scale.float()[:, g_idx], zero[:, g_idx]
    codes = torch.clamp(torch.round(w / s) + z, 0, maxq).to(torch.uint8)
    return codes, scale, zero


def dequantize(codes, scale, zero, g_idx) -> torch.Tensor:
    return (codes.float() - zero[:, g_idx].float()) * scale.float()[:, g_idx]


def pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """[R, C] codes -> int32 [R * bits / 32, C]: 32 / bits consecutive rows a word, the
    first in the low bits (GPTQ's qweight)."""
    per = 32 // bits
    values = values.to(torch.int64)
    out = torch.zeros(values.shape[0] // per, values.shape[1], dtype=torch.int64)
    for j in range(per):
        out |= values[j::per] << (bits * j)
    return _int32(out)


def _int32(words: torch.Tensor) -> torch.Tensor:
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def pack_columns(values: torch.Tensor, bits: int, order: list[int] | None = None) -> torch.Tensor:
    """[R, C] codes -> int32 [R, C * bits / 32]: 32 / bits columns a word, column
    order[i] of each run in bits i (GPTQ's qzeros: in order; AWQ's: 0 2 4 6 1 3 5 7)."""
    return pack_rows(values.t(), bits).t() if order is None else _pack_awq(values, order)


def _pack_awq(values: torch.Tensor, order: list[int]) -> torch.Tensor:
    values = values.to(torch.int64)
    out = torch.zeros(values.shape[0], values.shape[1] // 8, dtype=torch.int64)
    for col in range(values.shape[1] // 8):
        for i in range(8):
            out[:, col] |= values[:, col * 8 + order[i]] << (4 * i)
    return _int32(out)


def v1_zeros(qzeros: torch.Tensor, bits: int) -> torch.Tensor:
    """GPTQModel's conversion of packed zeros to GPTQ's original format (its
    convert_gptq_v2_to_v1_format): one subtracted from every field at once, from the whole
    int32 word, so a zero of 0 borrows from the field above it."""
    ones = sum(1 << shift for shift in range(0, 32, bits))
    return _int32((qzeros.to(torch.int64) - ones) & 0xFFFFFFFF)


def save_gptq(
    source: str,
    folder: str,
    bits: int = 4,
    group: int = 32,
    symmetric: bool = True,
    act_order: bool = False,
    v2: bool = False,
) -> tuple[str, str]:
    """(quantized folder, reference folder) of the float checkpoint in `source`."""
    weights, reference = {}, {}
    gen = torch.Generator().manual_seed(0)
    for name, w in _float_weights(source).items():
        if not TARGETS.match(name):
            weights[name] = reference[name] = w
            continue
        k = w.shape[1]
        group_size = group if group > 0 else k
        g_idx = torch.arange(k) // group_size
        if act_order:
            g_idx = g_idx[torch.randperm(k, generator=gen)]
        codes, scale, zero = group_quantize(w.float(), bits, group_size, symmetric, g_idx)
        prefix = name.removesuffix(".weight")
        qzeros = pack_columns(zero.t(), bits)
        weights[f"{prefix}.qweight"] = pack_rows(codes.t(), bits)
        weights[f"{prefix}.qzeros"] = qzeros if v2 else v1_zeros(qzeros, bits)
        weights[f"{prefix}.scales"] = scale.t()
        weights[f"{prefix}.g_idx"] = g_idx.to(torch.int32)
        reference[name] = dequantize(codes, scale, zero, g_idx)
    config = {
        "quant_method": "gptq",
        "bits": bits,
        "group_size": group,
        "desc_act": act_order,
        "sym": symmetric,
        "checkpoint_format": "gptq_v2" if v2 else "gptq",
    }
    return _write(folder, source, weights, config), _write(f"{folder}-ref", source, reference, None)


def save_awq(source: str, folder: str, group: int = 32) -> tuple[str, str]:
    weights, reference = {}, {}
    for name, w in _float_weights(source).items():
        if not TARGETS.match(name):
            weights[name] = reference[name] = w
            continue
        g_idx = torch.arange(w.shape[1]) // group
        codes, scale, zero = group_quantize(w.float(), 4, group, False, g_idx)
        prefix = name.removesuffix(".weight")
        order = [0, 2, 4, 6, 1, 3, 5, 7]
        weights[f"{prefix}.qweight"] = pack_columns(codes.t(), 4, order)
        weights[f"{prefix}.qzeros"] = pack_columns(zero.t(), 4, order)
        weights[f"{prefix}.scales"] = scale.t()
        reference[name] = dequantize(codes, scale, zero, g_idx)
    config = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group,
        "zero_point": True,
        "version": "gemm",
    }
    return _write(folder, source, weights, config), _write(f"{folder}-ref", source, reference, None)


def save_fp8(
    source: str, folder: str, block: tuple[int, int] | None = (32, 32), static: bool = False
) -> tuple[str, str]:
    """fp8 e4m3 weights with a float32 scale per block (weight_scale_inv, as Qwen3-*-FP8),
    or one per tensor (weight_scale) when block is None; `static` (with block None): the
    per-tensor scale named weight_scale_inv beside a static activation_scale, as
    transformers' FP8Linear writes Ministral 3's (activation_scheme "static")."""
    weights, reference = {}, {}
    for name, w in _float_weights(source).items():
        if not TARGETS.match(name):
            weights[name] = reference[name] = w
            continue
        prefix = name.removesuffix(".weight")
        n, k = w.shape
        if block is None:
            scale = w.abs().amax().clamp(min=1e-6) / 448
            full = scale.expand(n, k)
            weights[f"{prefix}.weight_scale{'_inv' if static else ''}"] = scale.reshape(())
            if static:
                weights[f"{prefix}.activation_scale"] = torch.tensor(0.05)
        else:
            bn, bk = block
            blocks = torch.zeros(-(-n // bn), -(-k // bk))
            for i in range(blocks.shape[0]):
                for j in range(blocks.shape[1]):
                    part = w[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk]
                    blocks[i, j] = part.abs().amax().clamp(min=1e-6) / 448
            full = blocks.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
            weights[f"{prefix}.weight_scale_inv"] = blocks
        fp8 = (w / full).to(torch.float8_e4m3fn)
        weights[name] = fp8
        reference[name] = fp8.float() * full
    scheme = "static" if static else "dynamic"
    config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": scheme}
    if block is not None:
        config["weight_block_size"] = list(block)
    return _write(folder, source, weights, config), _write(f"{folder}-ref", source, reference, None)


def save_compressed_tensors(
    source: str, folder: str, bits: int = 4, group: int | None = 32, symmetric: bool = True
) -> tuple[str, str]:
    """A compressed-tensors checkpoint written by the library: pack-quantized for 4 bits,
    int-quantized for 8; `group` None for a scale per output row."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
    )
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    strategy = "group" if group else "channel"
    args = QuantizationArgs(
        num_bits=bits, type="int", symmetric=symmetric, strategy=strategy, group_size=group
    )
    fmt = "pack-quantized" if bits == 4 else "int-quantized"
    scheme = QuantizationScheme(targets=["Linear"], weights=args, format=fmt)
    compressor = BaseCompressor.load_from_registry(fmt)
    weights, reference = {}, {}
    for name, w in _float_weights(source).items():
        if not TARGETS.match(name):
            weights[name] = reference[name] = w
            continue
        rows = w.reshape(w.shape[0], -1, group) if group else w.reshape(w.shape[0], 1, -1)
        scale, zero = calculate_qparams(rows.amin(-1), rows.amax(-1), args)
        scale = scale.to(torch.bfloat16)
        state = {"weight": w, "weight_scale": scale, "weight_zero_point": zero}
        compressed = compressor.compress(state, scheme)
        prefix = name.removesuffix(".weight")
        for part, tensor in compressed.items():
            weights[f"{prefix}.{part}"] = tensor
        # the library's codes, dequantized in float32 (its own dequantize rounds to bf16)
        codes = quantize(w, scale, zero, args, dtype=torch.int8).float()
        per_column = (
            (lambda t: t.float().repeat_interleave(group, 1)) if group else torch.Tensor.float
        )
        reference[name] = (codes - per_column(zero)) * per_column(scale)
    config = QuantizationConfig(
        config_groups={"group_0": scheme},
        format=fmt,
        ignore=["lm_head"],
        quantization_status="compressed",
    ).model_dump()
    config["quant_method"] = "compressed-tensors"
    return _write(folder, source, weights, config), _write(f"{folder}-ref", source, reference, None)


VISION_PARTS = re.compile(r"^(model\.)?(vision_tower|multi_modal_projector)\.")
"""An image-and-text checkpoint's vision tower and projector (transformers' older and newer
names of Gemma 3's), which the writers above quantize like any linear layer."""


def with_float_vision(source: str, quantized: str, reference: str) -> tuple[str, str]:
    """The writers' folders of an image-and-text checkpoint as the tools write one: only the
    language model quantized, the vision tower and projector as `source` holds them and
    named in the config's list of layers left alone (compressed-tensors' `ignore`,
    AutoAWQ's and transformers' `modules_to_not_convert`)."""
    vision = {n: w for n, w in _float_weights(source).items() if VISION_PARTS.match(n)}
    for folder in (quantized, reference):
        text = {n: w for n, w in _float_weights(folder).items() if not VISION_PARTS.match(n)}
        save_file({**text, **vision}, f"{folder}/model.safetensors")
    path = os.path.join(quantized, "config.json")
    with open(path) as f:
        config = json.load(f)
    quant = config["quantization_config"]
    if quant["quant_method"] == "compressed-tensors":
        quant["ignore"] = [*quant["ignore"], "re:.*vision_tower.*", "re:.*multi_modal_projector.*"]
    else:
        quant["modules_to_not_convert"] = ["vision_tower", "multi_modal_projector"]
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return quantized, reference


def rename_tensors(folder: str, renames: dict[str, str]) -> str:
    """The folder's tensors renamed in place, each name's first prefix of `renames` replaced
    (transformers' older and newer names of a nested model)."""
    weights = {}
    for name, tensor in _float_weights(folder).items():
        old = next((p for p in renames if name.startswith(p)), "")
        weights[renames.get(old, "") + name[len(old) :]] = tensor
    save_file(weights, f"{folder}/model.safetensors")
    return folder
