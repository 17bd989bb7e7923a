"""A PEFT LoRA adapter folder, read and checked against the model before any request runs
with it: adapter_config.json and adapter_model.safetensors (or PEFT's older
adapter_model.bin), as `PeftModel.save_pretrained` writes them.

An adapter names modules as the model it was trained on does; the model class's
hf_to_pagedllm_mapper renames them to the model's (Gemma 3's image-and-text checkpoints nest
the language model under `language_model`), and modules of parts the model does not run (a
vision tower) are ignored, as vLLM ignores them when it serves the language model's LoRA only.

Module m's weights are lora_A [r, in] and lora_B [out, r]; PEFT adds
(x A^T) B^T * scaling to m's output, with scaling = lora_alpha / r (lora_alpha / sqrt(r)
under use_rslora), r and lora_alpha per module where rank_pattern and alpha_pattern name it.
`load_lora_weights` folds the scaling into B once, so a step multiplies twice and adds.
"""

import json
import math
import os
import re
from dataclasses import dataclass

import regex
import torch
import xxhash
from safetensors import SafetensorError, safe_open

from pagedllm.logger import init_logger
from pagedllm.models.weight_loading import WeightsMapper

logger = init_logger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
SAFETENSORS_FILE = "adapter_model.safetensors"
BIN_FILE = "adapter_model.bin"
_NAME_PREFIX = "base_model.model."
# An adapter's rank_pattern / alpha_pattern keys are regular expressions from its folder,
# matched on the engine's thread: a key that backtracks without end is refused after this
# long instead of stalling every request.
PATTERN_TIMEOUT_S = 0.1
_WEIGHT_NAME = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])\.weight$")

# PEFT options that change what an adapter computes beyond (x A^T) B^T * scaling: an adapter
# that sets one is refused by name rather than served wrong.
_REFUSED_OPTIONS = {
    "use_dora": "DoRA adapters (use_dora)",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D layers)",
    "lora_bias": "LoRA biases (lora_bias)",
    "use_qalora": "QA-LoRA (use_qalora)",
    "modules_to_save": "modules_to_save (fully trained modules beside the adapter)",
    "trainable_token_indices": "trainable_token_indices (trained embedding rows)",
    "layer_replication": "layer_replication",
    "target_parameters": "target_parameters (LoRA on parameters, e.g. MoE experts)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "use_bdlora": "block-diagonal LoRA (use_bdlora)",
    "kasa_config": "KaSA (kasa_config: SVD-truncated base weights)",
    "arrow_config": "Arrow routing between adapters (arrow_config)",
}


@dataclass
class PeftAdapter:
    """An adapter checked against the model: the folder, its weights file, and for each
    target module (the model's checkpoint name) its rank and scaling."""

    path: str
    weights_file: str
    ranks: dict[str, int]
    scalings: dict[str, float]
    tensors: dict[str, torch.Tensor]  # the weights file's, as read
    sources: dict[str, str]  # target module -> the adapter's name of it

    @property
    def rank(self) -> int:
        return max(self.ranks.values())


def read_peft_adapter(
    path: str,
    target_shapes: dict[str, tuple[int, int]],
    max_lora_rank: int,
    mapper: WeightsMapper | None = None,
) -> PeftAdapter:
    """The adapter at `path`, its module names renamed by `mapper` (the model class's
    hf_to_pagedllm_mapper), checked against the model's `target_shapes` (module ->
    (in_features, out_features), the model class's lora_target_shapes) and max_lora_rank;
    ValueError naming what is wrong. The folder is read once: the weights are checked as
    they were read."""
    config = _read_config(path)
    weights_file = _weights_file(path)
    tensors = _load_tensors(weights_file)
    pairs = _module_pairs({k: tuple(t.shape) for k, t in tensors.items()}, weights_file)
    sources = model_modules(list(pairs), mapper or WeightsMapper(), path)
    ranks, scalings = {}, {}
    for module, source in sources.items():
        rank = check_target(path, module, source, *pairs[source], target_shapes, max_lora_rank)
        # PEFT matches rank_pattern / alpha_pattern on the name it trained the module under
        ranks[module], scalings[module] = rank, _scaling(config, source, rank, path)
    return PeftAdapter(path, weights_file, ranks, scalings, tensors, sources)


def check_target(
    path: str,
    module: str,
    source: str,
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    target_shapes: dict[str, tuple[int, int]],
    max_lora_rank: int,
) -> int:
    """The rank of the adapter's weights of the model's `module` (`source` in the adapter),
    lora_A `a_shape` and lora_B `b_shape`; ValueError unless the model serves LoRA on the
    module, the shapes are its [r, in] and [out, r] and r is within max_lora_rank."""
    if module not in target_shapes:
        raise ValueError(_unsupported_module(source, path))
    in_features, out_features = target_shapes[module]
    rank = a_shape[0]
    if rank < 1 or a_shape != (rank, in_features) or b_shape != (out_features, rank):
        raise ValueError(
            f"LoRA adapter {path}: {source} has lora_A {list(a_shape)} and lora_B "
            f"{list(b_shape)}; this model's {module} needs [r, {in_features}] and "
            f"[{out_features}, r]"
        )
    if rank > max_lora_rank:
        raise ValueError(
            f"LoRA adapter {path} has rank {rank} ({source}), over max_lora_rank "
            f"{max_lora_rank}; raise --max-lora-rank"
        )
    return rank


def load_lora_weights(adapter: PeftAdapter) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """module -> (lora_A [r, in], lora_B * scaling [out, r]), float32 on the CPU."""
    weights = {}
    for module, scaling in adapter.scalings.items():
        name = f"{_NAME_PREFIX}{adapter.sources[module]}"
        a, b = adapter.tensors[f"{name}.lora_A.weight"], adapter.tensors[f"{name}.lora_B.weight"]
        weights[module] = (a.float(), b.float() * scaling)
    return weights


def weights_digest(weights: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> str:
    """xxhash64 of the weights as they run (B scaled), module by module in name order: what
    an adapter computes, whatever its folder or name."""
    digest = xxhash.xxh64()
    for module in sorted(weights):
        digest.update(module.encode())
        for tensor in weights[module]:
            digest.update(repr(tuple(tensor.shape)).encode())
            digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


def _read_config(path: str) -> dict:
    if not os.path.isdir(path):
        raise ValueError(
            f"LoRA adapter path {path!r} is neither a PEFT adapter folder nor a .gguf file"
        )
    file = os.path.join(path, ADAPTER_CONFIG)
    try:
        with open(file) as f:
            config = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"LoRA adapter {path} has no {ADAPTER_CONFIG}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"LoRA adapter {file} is not readable JSON: {e!r}") from None
    if not isinstance(config, dict):
        raise ValueError(f"LoRA adapter {file} must hold a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(
            f"LoRA adapter {path} is a {config.get('peft_type')!r} adapter; pagedllm serves "
            "LORA adapters"
        )
    for option, what in _REFUSED_OPTIONS.items():
        if config.get(option):
            raise ValueError(f"LoRA adapter {path} uses {what}, which pagedllm does not serve")
    if config.get("bias", "none") != "none":
        raise ValueError(
            f"LoRA adapter {path} trains biases (bias={config['bias']!r}); pagedllm serves "
            "adapters with bias 'none'"
        )
    return config


def _weights_file(path: str) -> str:
    """The folder's adapter_model.safetensors, else its adapter_model.bin."""
    for name in (SAFETENSORS_FILE, BIN_FILE):
        file = os.path.join(path, name)
        if os.path.isfile(file):
            return file
    raise ValueError(f"LoRA adapter {path} has neither {SAFETENSORS_FILE} nor {BIN_FILE}")


def _load_tensors(file: str) -> dict[str, torch.Tensor]:
    if file.endswith(".safetensors"):
        try:
            with safe_open(file, framework="pt") as f:
                return {k: f.get_tensor(k) for k in f.keys()}
        except (SafetensorError, OSError, RuntimeError) as e:  # RuntimeError: file gone
            raise ValueError(
                f"LoRA adapter {file} is not a readable safetensors file: {e}"
            ) from None
    try:
        tensors = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle, zip and torch's own errors
        raise ValueError(f"LoRA adapter {file} is not a readable torch file: {e}") from None
    if not isinstance(tensors, dict) or not all(
        isinstance(t, torch.Tensor) for t in tensors.values()
    ):
        raise ValueError(f"LoRA adapter {file} must hold a dict of tensors")
    return tensors


def _module_pairs(
    shapes: dict[str, tuple[int, ...]], file: str
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """module -> (lora_A's shape, lora_B's shape); ValueError for any other tensor or a
    lone half."""
    halves: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, shape in shapes.items():
        match = _WEIGHT_NAME.match(name)
        if not name.startswith(_NAME_PREFIX) or match is None or len(shape) != 2:
            raise ValueError(
                f"LoRA adapter {file}: tensor {name!r} {list(shape)} is not a LoRA weight "
                f"({_NAME_PREFIX}<module>.lora_A.weight / .lora_B.weight, 2-D); embedding "
                "LoRA and other PEFT parts are not served"
            )
        module = match["module"][len(_NAME_PREFIX) :]
        halves.setdefault(module, {})[match["which"]] = shape
    if not halves:
        raise ValueError(f"LoRA adapter {file} holds no LoRA weights")
    for module, pair in halves.items():
        if set(pair) != {"A", "B"}:
            missing = ({"A", "B"} - set(pair)).pop()
            raise ValueError(f"LoRA adapter {file}: {module} has no lora_{missing}.weight")
    return {module: (pair["A"], pair["B"]) for module, pair in halves.items()}


def model_modules(modules: list[str], mapper: WeightsMapper, path: str) -> dict[str, str]:
    """The model's name of each of the adapter's modules -> the adapter's; modules the
    mapper drops (parts of the checkpoint the model does not run) are left out, with a
    warning, unless they are all the adapter has."""
    sources: dict[str, str] = {}
    dropped = []
    for source in modules:
        module = mapper.map_name(source)
        if module is None:
            dropped.append(source)
        elif module in sources:
            raise ValueError(
                f"LoRA adapter {path} adapts {module} twice, as {sources[module]} and {source}"
            )
        else:
            sources[module] = source
    if dropped and not sources:
        raise ValueError(
            f"LoRA adapter {path} adapts only modules outside the language model pagedllm "
            f"runs ({', '.join(dropped[:3])}{' ...' if len(dropped) > 3 else ''})"
        )
    if dropped:
        logger.warning(
            "LoRA adapter %s: its %d modules outside the language model (%s%s) are ignored",
            path,
            len(dropped),
            ", ".join(dropped[:3]),
            " ..." if len(dropped) > 3 else "",
        )
    return sources


def _unsupported_module(module: str, path: str) -> str:
    leaf = module.rsplit(".", 1)[-1]
    return (
        f"LoRA adapter {path} targets {module}, which this model does not serve LoRA on: "
        "pagedllm applies adapters to the attention's q/k/v/o_proj and dense MLPs' "
        f"gate/up/down_proj{' (not to MoE experts)' if '.experts.' in module else ''}"
        f"{'' if leaf.endswith('_proj') else ' (not to embeddings or the LM head)'}"
    )


def _scaling(config: dict, module: str, rank: int, path: str) -> float:
    """PEFT's lora_alpha / r (or / sqrt(r) under use_rslora), each per module where
    rank_pattern / alpha_pattern name it; the config's r must be the weights' rank."""
    r = _pattern_value(config, "rank_pattern", module, config.get("r", 8))
    alpha = _pattern_value(config, "alpha_pattern", module, config.get("lora_alpha", 8))
    if r != rank:
        raise ValueError(
            f"LoRA adapter {path}: {module} has rank {rank} in its weights but r={r!r} in "
            f"{ADAPTER_CONFIG}"
        )
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise ValueError(f"LoRA adapter {path}: lora_alpha {alpha!r} for {module} is not a number")
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


def _pattern_value(config: dict, field: str, module: str, default: object) -> object:
    """PEFT's get_pattern_key on config[field] (rank_pattern, alpha_pattern): the value of
    the first key that matches the module name's end on a dot."""
    pattern = config.get(field) or {}
    if not isinstance(pattern, dict):
        raise ValueError(f"LoRA adapter {field} must be a JSON object, got {pattern!r}")
    for key in pattern:
        try:
            if regex.match(rf"(.*\.)?({key})$", module, timeout=PATTERN_TIMEOUT_S):
                return pattern[key]
        except regex.error as e:
            raise ValueError(
                f"LoRA adapter pattern key {key!r} is not a regular expression: {e}"
            ) from None
        except TimeoutError:
            raise ValueError(
                f"LoRA adapter pattern key {key!r} takes over {PATTERN_TIMEOUT_S} s to match "
                f"{module!r}; use a simpler expression"
            ) from None
    return default
