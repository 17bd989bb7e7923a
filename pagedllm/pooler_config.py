"""PoolerConfig (vLLM's name): how a pooling model turns a prompt's final hidden states into
one vector, read from a sentence-transformers folder and overridable by the user.

A sentence-transformers folder says it in `modules.json` (its module list; a
`sentence_transformers.models.Normalize` entry means L2-normalised outputs) and in the
pooling module's `config.json` (`1_Pooling/config.json`: one `pooling_mode_*` flag set).
"""

import json
import os
from dataclasses import dataclass

POOLING_TYPES = ("LAST", "MEAN", "CLS")

# sentence-transformers' pooling flags -> vLLM's pooling types.
_ST_POOLING_MODES = {
    "pooling_mode_lasttoken": "LAST",
    "pooling_mode_mean_tokens": "MEAN",
    "pooling_mode_cls_token": "CLS",
}
_ST_NORMALIZE = "sentence_transformers.models.Normalize"
_ST_POOLING = "sentence_transformers.models.Pooling"


@dataclass
class PoolerConfig:
    """`pooling_type`: LAST (the prompt's last token, vLLM's default for decoder models),
    MEAN (the mean over all the prompt's tokens) or CLS (its first token); `normalize`:
    L2-normalise the pooled vector. None leaves a field to the checkpoint, then to the
    defaults (LAST, normalised)."""

    pooling_type: str | None = None
    normalize: bool | None = None

    def __post_init__(self) -> None:
        if self.pooling_type is not None:
            self.pooling_type = self.pooling_type.upper()
            if self.pooling_type not in POOLING_TYPES:
                raise ValueError(
                    f"pooling_type {self.pooling_type!r} is not supported; use one of "
                    f"{', '.join(POOLING_TYPES)}"
                )
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise TypeError(f"normalize must be a bool or None, got {self.normalize!r}")

    @classmethod
    def parse(cls, value: "PoolerConfig | dict | str | None") -> "PoolerConfig":
        """A PoolerConfig from itself, a dict, or a JSON object (the CLI's --pooler-config)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"pooler_config {value!r} is not a JSON object: {e}") from e
        if not isinstance(value, dict):
            raise TypeError(f"pooler_config must be a PoolerConfig, a dict or JSON, got {value!r}")
        unknown = set(value) - {"pooling_type", "normalize"}
        if unknown:
            raise ValueError(
                f"pooler_config has unknown fields {sorted(unknown)}; "
                "known: pooling_type, normalize"
            )
        return cls(**value)

    def over(self, base: "PoolerConfig") -> "PoolerConfig":
        """This config's fields where set, else `base`'s, else the defaults."""
        pooling_type = self.pooling_type or base.pooling_type or "LAST"
        normalize = self.normalize if self.normalize is not None else base.normalize
        return PoolerConfig(pooling_type, True if normalize is None else normalize)


def is_sentence_transformers_folder(model: str) -> bool:
    return os.path.isfile(os.path.join(model, "modules.json"))


def sentence_transformers_pooler_config(model: str) -> PoolerConfig:
    """The pooling a sentence-transformers folder declares (empty fields when it is none)."""
    if not is_sentence_transformers_folder(model):
        return PoolerConfig()
    with open(os.path.join(model, "modules.json"), encoding="utf-8") as f:
        modules = json.load(f)
    kinds = {m.get("type"): m.get("path", "") for m in modules}
    pooling_type = None
    if _ST_POOLING in kinds:
        with open(os.path.join(model, kinds[_ST_POOLING], "config.json"), encoding="utf-8") as f:
            pooling = json.load(f)
        modes = [mode for flag, mode in _ST_POOLING_MODES.items() if pooling.get(flag)]
        if len(modes) != 1:
            set_flags = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode") and v)
            raise ValueError(
                f"{model!r}: the pooling module sets {set_flags}; pagedllm pools with exactly "
                f"one of {sorted(_ST_POOLING_MODES)}"
            )
        pooling_type = modes[0]
    return PoolerConfig(pooling_type, _ST_NORMALIZE in kinds)
