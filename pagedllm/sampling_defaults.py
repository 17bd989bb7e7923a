"""The model's recommended sampling defaults (vLLM's `generation_config`): the fields of a
checkpoint's generation_config.json that vLLM takes as the default SamplingParams, used
where a request leaves a field unset (`LLM.generate` without sampling params; a server
request without `temperature`, ...).

`generation_config`: "auto" (the model folder's generation_config.json), "vllm" (none:
SamplingParams' own defaults) or a folder holding one. `override_generation_config`
(vLLM's) sets fields over what was read. Only the values the file sets are taken
(transformers' `to_diff_dict`), so a file without `top_k` does not bring transformers'
own default of 50.
"""

import logging
import os

from transformers import GenerationConfig

from pagedllm.value_checks import as_json_object

logger = logging.getLogger(__name__)  # pagedllm.logger is a unit of this layer's row

SAMPLING_FIELDS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")
"""The generation config's fields vLLM reads (max_new_tokens is SamplingParams' max_tokens)."""


def sampling_defaults(
    model: str, generation_config: str, override: dict | str | None = None
) -> dict[str, object]:
    """SamplingParams field -> the default the model recommends (empty for none)."""
    if generation_config == "vllm":
        config: dict[str, object] = {}
    else:
        folder = model if generation_config == "auto" else generation_config
        config = _read(folder, generation_config != "auto")
    config.update(_parse_override(override))
    fields = {name: config[name] for name in SAMPLING_FIELDS if config.get(name) is not None}
    if "max_new_tokens" in fields:
        fields["max_tokens"] = fields.pop("max_new_tokens")
    if fields:
        logger.warning(
            "sampling defaults from the model's generation config: %s (requests that leave "
            "a field unset get these; --generation-config vllm uses SamplingParams' own)",
            fields,
        )
    return fields


def override_max_tokens(override: dict | str | None) -> int | None:
    """vLLM's cap on every server request's max_tokens: override_generation_config's
    max_new_tokens, where it sets one."""
    return _parse_override(override).get("max_new_tokens")


def _read(folder: str, required: bool) -> dict[str, object]:
    """The values a folder's generation_config.json sets; {} when the model has none (a GGUF
    file, a folder without one). A folder named by the user must hold one."""
    path = os.path.join(folder, "generation_config.json")
    if not os.path.isfile(path):
        if required:
            raise ValueError(
                f"generation_config {folder!r} must be 'auto', 'vllm' or a folder holding "
                "generation_config.json"
            )
        return {}
    try:
        return GenerationConfig.from_pretrained(folder).to_diff_dict()
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from e


def _parse_override(override: dict | str | None) -> dict[str, object]:
    if override is None:
        return {}
    return dict(as_json_object("override_generation_config", override))
