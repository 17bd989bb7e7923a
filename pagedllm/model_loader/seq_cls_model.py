"""A classifier's score head (vLLM's `as_seq_cls_model` and `seq_cls_model_loader`), loaded
for the engine's host beside the model: the checkpoint's `score.weight`
[num_labels, hidden], or, for a generative checkpoint converted by `classifier_from_token`
(classifier_config.py), rows of its LM head (the input embedding where the two are tied):
"from_2_way_softmax" takes the true token's row minus the false token's, in float32;
"no_post_processing" takes each token's row. A token classifier's head is `score.weight`
and, where the checkpoint has one, `score.bias`. The decoder's own weights load as any
pooling model's (pooling_model.py skips `score.` and `lm_head.`)."""

import torch
from transformers import PreTrainedTokenizerBase

from pagedllm.config import ModelConfig
from pagedllm.layers.classifier import SequenceClassifier
from pagedllm.model_loader.safetensors import iterate_safetensors_weights

SCORE_WEIGHT = "score.weight"
SCORE_BIAS = "score.bias"
_LM_HEAD_NAMES = ("lm_head.weight",)
_EMBEDDING_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight")


def load_seq_cls_head(
    model_config: ModelConfig, tokenizer: PreTrainedTokenizerBase | None
) -> SequenceClassifier | None:
    """The classifier head of a classifier model, else None."""
    config = model_config.classifier_config
    if config is None:
        return None
    hidden = model_config.hf_config.hidden_size
    bias = None
    if model_config.load_format == "dummy":
        generator = torch.Generator().manual_seed(0)
        weight = torch.empty(config.num_labels, hidden).uniform_(-1e-3, 1e-3, generator=generator)
    elif not config.from_tokens:
        weight = _read_tensor(model_config.model, (SCORE_WEIGHT,))
        if config.per_token:
            bias = _read_tensor(model_config.model, (SCORE_BIAS,), required=False)
    else:
        weight = _token_rows(model_config, tokenizer)
    if tuple(weight.shape) != (config.num_labels, hidden):
        raise ValueError(
            f"{model_config.model!r}: the score head is {list(weight.shape)}; the config "
            f"asks for [{config.num_labels}, {hidden}] (num_labels, hidden_size)"
        )
    if bias is not None and tuple(bias.shape) != (config.num_labels,):
        raise ValueError(
            f"{model_config.model!r}: the score head's bias is {list(bias.shape)}; the config "
            f"asks for [{config.num_labels}] (num_labels)"
        )
    return SequenceClassifier(weight, config, bias)


def _token_rows(
    model_config: ModelConfig, tokenizer: PreTrainedTokenizerBase | None
) -> torch.Tensor:
    """The LM head rows of the config's classifier_from_token, as its method combines them."""
    config = model_config.classifier_config
    assert config is not None and config.from_tokens
    if tokenizer is None:
        raise ValueError(
            "classifier_from_token names tokens; the engine needs its tokenizer to find their "
            "ids (skip_tokenizer_init=False)"
        )
    ids = []
    for token in config.from_tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ValueError(f"classifier_from_token {token!r} is not a token of the vocabulary")
        ids.append(token_id)
    tied = getattr(model_config.hf_config, "tie_word_embeddings", False)
    names = _EMBEDDING_NAMES if tied else _LM_HEAD_NAMES
    rows = _read_tensor(model_config.model, names)[ids].float()
    if config.method == "from_2_way_softmax":
        return rows[1:2] - rows[0:1]  # [true] - [false]: one label
    return rows


def _read_tensor(folder: str, names: tuple[str, ...], required: bool = True) -> torch.Tensor | None:
    """The first of `names` the folder's safetensors files hold, as stored (a checkpoint
    holds one of them); None where it holds none and the tensor is not `required`."""
    for _, tensor in iterate_safetensors_weights(folder, None, lambda name: name in names):
        return tensor
    if not required:
        return None
    raise ValueError(f"{folder!r} has no tensor {' or '.join(names)} (the classifier's head)")
