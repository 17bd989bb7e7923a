"""A Hugging Face checkpoint's own quantization: its config.json's `quantization_config`.

vLLM's names for the methods: "gptq" (GPTQ, AutoGPTQ / GPTQModel), "awq" (AutoAWQ's GEMM
layout), "compressed-tensors" (llm-compressor's int and fp8 schemes) and "fp8" (block-wise
fp8 checkpoints such as Qwen3-*-FP8). A CheckpointQuant says how each quantized linear
weight is stored; model_loader/checkpoint_formats.py reads them.
"""

import re
from dataclasses import dataclass

PREQUANTIZED_METHODS = ("gptq", "awq", "compressed-tensors", "fp8")


@dataclass(frozen=True)
class WeightScheme:
    """How one quantized weight is stored."""

    bits: int
    group_size: int | None
    """Input columns per scale; None: one scale per output row (per channel or tensor)."""
    symmetric: bool
    kind: str = "int"
    """"int" (codes and scales) or "float" (fp8 values and scales, dequantized at load)."""
    block: tuple[int, int] | None = None
    """A float scheme's [rows, columns] per scale, None for one per row or tensor."""


@dataclass(frozen=True)
class CheckpointQuant:
    method: str
    """One of PREQUANTIZED_METHODS."""
    schemes: tuple[tuple[tuple[str, ...], WeightScheme], ...]
    """(targets, scheme) in the config's order: a target is "Linear" (every linear
    layer) or "re:" and a regular expression over the layer's name."""
    gptq_v1_zeros: bool = False
    """GPTQ's original format stores each zero point minus one."""

    def scheme(self, prefix: str) -> WeightScheme:
        """The scheme of the linear layer named prefix (ValueError if no target matches)."""
        scheme = self.find_scheme(prefix)
        if scheme is None:
            raise ValueError(f"quantization_config names no scheme for {prefix!r}")
        return scheme

    def find_scheme(self, *prefixes: str) -> WeightScheme | None:
        """The scheme of the linear layer named by any of `prefixes` (its name, or each name
        a checkpoint may give it), as vLLM matches targets: a target naming the layer (its
        full name, or "re:" and an expression) first, in the config's order; then a class
        target ("Linear"); None if none matches."""
        fallback = None
        for targets, scheme in self.schemes:
            for target in targets:
                if target.startswith("re:"):
                    if any(re.match(target[3:], prefix) for prefix in prefixes):
                        return scheme
                elif "." in target:
                    if target in prefixes:
                        return scheme
                elif fallback is None:
                    fallback = scheme
        return fallback


def parse_quantization_config(config: object) -> CheckpointQuant:
    """A checkpoint's quantization_config (a dict, or transformers' object of it) as a
    CheckpointQuant; ValueError naming what pagedllm cannot run."""
    if not isinstance(config, dict) and hasattr(config, "to_dict"):
        config = config.to_dict()
    if not isinstance(config, dict):
        raise ValueError(f"quantization_config must be a JSON object, got {config!r}")
    method = str(config.get("quant_method", "")).lower()
    parse = {
        "gptq": _gptq,
        "awq": _awq,
        "compressed-tensors": _compressed_tensors,
        "fp8": _fp8,
    }.get(method)
    if parse is None:
        raise ValueError(
            f"the checkpoint's quantization_config has quant_method {method!r}; pagedllm reads "
            f"{', '.join(PREQUANTIZED_METHODS)} checkpoints (and GGUF files)"
        )
    return parse(config)


def _bits(value: object, allowed: tuple[int, ...], what: str) -> int:
    if type(value) is not int or value not in allowed:
        raise ValueError(
            f"{what} checkpoints of {value!r} bits are not supported (bits: one of {allowed})"
        )
    return value


def _group(value: object) -> int | None:
    return None if value in (None, -1, 0) else int(value)


def _gptq(config: dict) -> CheckpointQuant:
    fmt = config.get("checkpoint_format", "gptq")
    if fmt not in ("gptq", "gptq_v2") or config.get("is_marlin_format"):
        raise ValueError(f"GPTQ checkpoint_format {fmt!r} is not supported (gptq, gptq_v2)")
    _refuse_other(config, "pack_dtype", "int32", "GPTQ")
    if "bits" not in config:
        raise ValueError("the GPTQ quantization_config has no bits")
    base = _gptq_scheme(config, WeightScheme(0, None, True))
    schemes = []
    for key, override in (config.get("dynamic") or {}).items():
        if not key.startswith("-:"):  # "-:" layers are left float, so stored as weights
            pattern = key.removeprefix("+:")
            schemes.append(((f"re:{pattern}",), _gptq_scheme(override, base)))
    schemes.append((("Linear",), base))
    return CheckpointQuant("gptq", tuple(schemes), gptq_v1_zeros=fmt == "gptq")


def _gptq_scheme(fields: dict, base: WeightScheme) -> WeightScheme:
    """GPTQ's bits, group_size and sym, each from `fields` else from base (GPTQModel's
    `dynamic` overrides a layer's)."""
    if not isinstance(fields, dict):
        raise ValueError(f"GPTQ dynamic overrides must be objects, got {fields!r}")
    bits = _bits(fields.get("bits", base.bits), (2, 4, 8), "GPTQ")
    group = _group(fields["group_size"]) if "group_size" in fields else base.group_size
    return WeightScheme(bits, group, bool(fields.get("sym", base.symmetric)))


def _refuse_other(config: dict, field: str, value: object, what: str) -> None:
    if config.get(field, value) != value:
        raise ValueError(
            f"{what} checkpoints with {field} {config[field]!r} are not supported ({value!r})"
        )


def _awq(config: dict) -> CheckpointQuant:
    bits = _bits(config.get("bits", config.get("w_bit")), (4,), "AWQ")
    version = str(config.get("version", "gemm")).lower()
    if version != "gemm":
        raise ValueError(f"AWQ version {version!r} is not supported (gemm)")
    if not config.get("zero_point", True):
        raise ValueError("AWQ checkpoints without zero points are not supported")
    _refuse_other(config, "backend", "autoawq", "AWQ")
    group = _group(config.get("group_size", config.get("q_group_size")))
    return CheckpointQuant("awq", ((("Linear",), WeightScheme(bits, group, False)),))


def _compressed_tensors(config: dict) -> CheckpointQuant:
    sparsity = config.get("sparsity_config") or {}
    if sparsity.get("format", "dense") != "dense":
        raise ValueError(
            f"compressed-tensors sparsity format {sparsity['format']!r} is not supported"
        )
    schemes = []
    for name, group in (config.get("config_groups") or {}).items():
        weights = group.get("weights")
        if not weights:
            continue
        kind = weights.get("type", "int")
        fmt = group.get("format") or config.get("format")
        if kind == "float":
            if weights.get("num_bits") != 8:
                raise ValueError(f"config group {name!r}: float weights of other than 8 bits")
        elif fmt not in ("pack-quantized", "naive-quantized", "int-quantized"):
            raise ValueError(
                f"config group {name!r}: compressed-tensors format {fmt!r} is not supported "
                "(pack-quantized, naive-quantized, int-quantized, float-quantized)"
            )
        bits = _bits(weights.get("num_bits"), (4, 8), "compressed-tensors int")
        strategy = weights.get("strategy")
        group_size = _group(weights.get("group_size")) if strategy == "group" else None
        block = weights.get("block_structure") if strategy == "block" else None
        if kind == "float" and group_size is not None:  # a group: a block of one row
            block, group_size = (1, group_size), None
        if kind != "float" and strategy not in ("tensor", "channel", "group", None):
            raise ValueError(
                f"config group {name!r}: int weights with strategy {strategy!r} are not "
                "supported (tensor, channel, group)"
            )
        scheme = WeightScheme(
            bits,
            group_size,
            bool(weights.get("symmetric", True)),
            kind,
            None if block is None else (int(block[0]), int(block[1])),
        )
        schemes.append((tuple(group.get("targets") or ("Linear",)), scheme))
    if not schemes:
        raise ValueError("the compressed-tensors config quantizes no weights")
    return CheckpointQuant("compressed-tensors", tuple(schemes))


def _fp8(config: dict) -> CheckpointQuant:
    """Block scales stored as raw ue8m0 bytes (`scale_fmt`) are read by their dtype."""
    fmt = config.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"fp8 checkpoints in {fmt!r} are not supported (e4m3)")
    block = config.get("weight_block_size")
    if block is not None:
        if not (
            isinstance(block, list)
            and len(block) == 2
            and all(type(b) is int and b > 0 for b in block)
        ):
            raise ValueError(f"fp8 weight_block_size must be [rows, columns], got {block!r}")
        block = (block[0], block[1])
    return CheckpointQuant("fp8", ((("Linear",), WeightScheme(8, None, True, "float", block)),))
