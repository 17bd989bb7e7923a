"""PoolerConfig (vLLM's name): how a pooling model turns a prompt's final hidden states into
one vector, read from a sentence-transformers folder and overridable by the user.

A sentence-transformers folder says it in `modules.json` (its module list; a
`sentence_transformers.models.Normalize` entry means L2-normalised outputs), in the
pooling module's `config.json` (`1_Pooling/config.json`: one `pooling_mode_*` flag set) and
in any `Dense` modules after the pooling (a linear projection of the pooled vector and an
activation, each module's `config.json` and weights in its folder). Its
`sentence_bert_config.json` gives the longest input (`max_seq_length`, which caps
config.derive_max_model_len).
"""

import json
import os
from dataclasses import dataclass, field

from pagedllm.value_checks import as_json_object

POOLING_TYPES = ("LAST", "MEAN", "CLS", "ALL")
TOKEN_POOLING = "ALL"
"""vLLM's pooling of every token, each its own output: a token classifier's, and only its."""

# sentence-transformers' pooling flags -> vLLM's pooling types.
_ST_POOLING_MODES = {
    "pooling_mode_lasttoken": "LAST",
    "pooling_mode_mean_tokens": "MEAN",
    "pooling_mode_cls_token": "CLS",
}
_ST_NORMALIZE = "sentence_transformers.models.Normalize"
_ST_POOLING = "sentence_transformers.models.Pooling"
_ST_DENSE = "sentence_transformers.models.Dense"
_ST_MODULES = ("sentence_transformers.models.Transformer", _ST_POOLING, _ST_DENSE, _ST_NORMALIZE)

# The activations a Dense module may name (its `activation_function`, a class path);
# sentence-transformers' default, where the config names none, is Tanh.
DENSE_ACTIVATIONS = (
    "torch.nn.modules.linear.Identity",
    "torch.nn.modules.activation.Tanh",
    "torch.nn.modules.activation.ReLU",
    "torch.nn.modules.activation.GELU",
    "torch.nn.modules.activation.Sigmoid",
    "torch.nn.modules.activation.SiLU",
)


@dataclass(frozen=True)
class DenseModule:
    """A sentence-transformers Dense module: `activation(pooled @ W.T + b)`, its weights in
    the folder `path` (layers/st_projector.py loads them)."""

    path: str
    in_features: int
    out_features: int
    bias: bool
    activation: str


@dataclass
class PoolerConfig:
    """`pooling_type`: LAST (the prompt's last token, vLLM's default for decoder models),
    MEAN (the mean over all the prompt's tokens), CLS (its first token) or ALL (every
    token, a token classifier's; config.py allows it there only); `normalize`:
    L2-normalise the pooled vector; `use_activation` (vLLM's): a classifier's activation
    (softmax, sigmoid, ...) for requests that leave theirs unset, and on an embedding model
    `normalize` where that is unset. None leaves a field to the checkpoint, then to the
    defaults (LAST, normalised, activated)."""

    pooling_type: str | None = None
    normalize: bool | None = None
    use_activation: bool | None = None
    dense: tuple[DenseModule, ...] = field(default=(), repr=False)
    """The checkpoint's projections of the pooled vector, in order (not a user's field)."""

    def __post_init__(self) -> None:
        if self.pooling_type is not None:
            self.pooling_type = self.pooling_type.upper()
            if self.pooling_type not in POOLING_TYPES:
                raise ValueError(
                    f"pooling_type {self.pooling_type!r} is not supported; use one of "
                    f"{', '.join(POOLING_TYPES)}"
                )
        for name in ("normalize", "use_activation"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool or None, got {value!r}")

    @classmethod
    def parse(cls, value: "PoolerConfig | dict | str | None") -> "PoolerConfig":
        """A PoolerConfig from itself, a dict, or a JSON object (the CLI's --pooler-config)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, str | dict):
            raise TypeError(f"pooler_config must be a PoolerConfig, a dict or JSON, got {value!r}")
        value = as_json_object("pooler_config", value)
        unknown = set(value) - {"pooling_type", "normalize", "use_activation"}
        if unknown:
            raise ValueError(
                f"pooler_config has unknown fields {sorted(unknown)}; "
                "known: pooling_type, normalize, use_activation"
            )
        return cls(**value)

    def over(self, base: "PoolerConfig", default_type: str = "LAST") -> "PoolerConfig":
        """This config's fields where set, else `base`'s, else the defaults (the model's
        `default_type` of pooling)."""
        pooling_type = self.pooling_type or base.pooling_type or default_type
        normalize = next(
            (v for v in (self.normalize, self.use_activation, base.normalize) if v is not None),
            True,
        )
        return PoolerConfig(pooling_type, normalize, self.use_activation, base.dense)

    def output_size(self, hidden_size: int) -> int:
        """The pooled vector's length: the last projection's, else the hidden size."""
        return self.dense[-1].out_features if self.dense else hidden_size


def check_pooling_type(pooling_type: str, architecture: str, per_token: bool) -> None:
    """ALL for a token classifier, one of the others for every other pooling model."""
    if per_token and pooling_type != TOKEN_POOLING:
        raise ValueError(
            f"pooling_type {pooling_type}: {architecture} classifies every token, so it pools "
            f"{TOKEN_POOLING}"
        )
    if not per_token and pooling_type == TOKEN_POOLING:
        raise ValueError(
            f"pooling_type {TOKEN_POOLING} keeps every token, for token classifiers "
            f"(*ForTokenClassification); {architecture} pools one vector: use LAST, MEAN or CLS"
        )


def is_sentence_transformers_folder(model: str) -> bool:
    return os.path.isfile(os.path.join(model, "modules.json"))


def sentence_transformers_pooler_config(model: str) -> PoolerConfig:
    """The pooling a sentence-transformers folder declares (empty fields when it is none)."""
    if not is_sentence_transformers_folder(model):
        return PoolerConfig()
    with open(os.path.join(model, "modules.json"), encoding="utf-8") as f:
        modules = json.load(f)
    unknown = sorted({m.get("type") for m in modules} - set(_ST_MODULES), key=str)
    if unknown:
        raise ValueError(
            f"{model!r}: modules.json has modules pagedllm does not run: {unknown}; "
            f"it runs {list(_ST_MODULES)}"
        )
    order = [_ST_MODULES.index(m.get("type")) for m in modules]
    if order != sorted(order):
        raise ValueError(
            f"{model!r}: modules.json's modules must come in the order {list(_ST_MODULES)}"
        )
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
    dense = tuple(
        _dense_module(model, m.get("path", "")) for m in modules if m["type"] == _ST_DENSE
    )
    for before, after in zip(dense, dense[1:]):
        if before.out_features != after.in_features:
            raise ValueError(
                f"{model!r}: Dense module {after.path!r} takes {after.in_features} values "
                f"where the one before gives {before.out_features}"
            )
    return PoolerConfig(pooling_type, _ST_NORMALIZE in kinds, dense=dense)


def _dense_module(model: str, path: str) -> DenseModule:
    """A Dense module's `config.json` (sentence-transformers' keys), checked."""
    folder = os.path.join(model, path)
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    activation = config.get("activation_function") or DENSE_ACTIVATIONS[1]
    if activation not in DENSE_ACTIVATIONS:
        raise ValueError(
            f"{model!r}: Dense module {path!r} has activation {activation!r}; pagedllm runs "
            f"{list(DENSE_ACTIVATIONS)}"
        )
    return DenseModule(
        folder, config["in_features"], config["out_features"], config.get("bias", True), activation
    )


def sentence_transformers_max_seq_length(model: str | None) -> int | None:
    """`max_seq_length` of a sentence-transformers folder's sentence_bert_config.json (the
    length sentence-transformers cuts inputs to), where it has one."""
    path = os.path.join(model, "sentence_bert_config.json") if model else ""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("max_seq_length")
    except (json.JSONDecodeError, AttributeError) as e:
        raise ValueError(f"{path} is not a JSON object: {e}") from e
