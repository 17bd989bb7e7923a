"""Tiny classifier checkpoints for the classification and cross-encoder tests: a tiny random
model of tests/models/tiny_models.py saved as transformers' `*ForSequenceClassification`
or `*ForTokenClassification` (its `score` head included) with the byte-level tokenizer of
tests/embedding_models.py, and transformers' label logits of it (the reference)."""

import copy

import torch
import transformers

from tests.embedding_models import save_byte_tokenizer
from tests.models.tiny_models import tiny_configs


def save_tiny_classifier(name: str, folder: str, num_labels: int, **fields: object) -> str:
    """tiny_configs()[name] with `num_labels` (and any other config `fields`, such as
    problem_type or id2label), saved as its sequence-classification model, seeded."""
    return _save(transformers.AutoModelForSequenceClassification, name, folder, num_labels, fields)


def hf_label_logits(folder: str, prompts: list[list[int]]) -> list[torch.Tensor]:
    """transformers' logits [num_labels] of each prompt, run alone (its last token pooled)."""
    return _hf_logits(transformers.AutoModelForSequenceClassification, folder, prompts)


def save_tiny_token_classifier(name: str, folder: str, num_labels: int, **fields: object) -> str:
    """tiny_configs()[name] with `num_labels` (and other config `fields`, such as
    token_classification_bias) saved as its token-classification model, seeded."""
    return _save(transformers.AutoModelForTokenClassification, name, folder, num_labels, fields)


def hf_token_logits(folder: str, prompts: list[list[int]]) -> list[torch.Tensor]:
    """transformers' logits [num_tokens, num_labels] of each prompt, run alone."""
    return _hf_logits(transformers.AutoModelForTokenClassification, folder, prompts)


def _save(auto_class: type, name: str, folder: str, num_labels: int, fields: dict) -> str:
    """The model `auto_class` makes of the config, seeded, its score head (and a token
    head's bias) large enough that labels differ clearly, with the byte tokenizer."""
    config = copy.deepcopy(tiny_configs()[name])
    config.num_labels = num_labels
    for key, value in fields.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = auto_class.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.score.weight.normal_(0, 0.5)
        if model.score.bias is not None:
            model.score.bias.normal_(0, 0.5)
    model.save_pretrained(folder)
    save_byte_tokenizer(folder)
    return folder


def _hf_logits(auto_class: type, folder: str, prompts: list[list[int]]) -> list[torch.Tensor]:
    model = auto_class.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return [model(torch.tensor([ids])).logits[0].float() for ids in prompts]
