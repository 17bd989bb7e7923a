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
    config = copy.deepcopy(tiny_configs()[name])
    config.num_labels = num_labels
    for key, value in fields.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # a score head large enough that labels differ clearly
        model.score.weight.normal_(0, 0.5)
    model.save_pretrained(folder)
    save_byte_tokenizer(folder)
    return folder


def hf_label_logits(folder: str, prompts: list[list[int]]) -> list[torch.Tensor]:
    """transformers' logits [num_labels] of each prompt, run alone (its last token pooled)."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        folder, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        return [model(torch.tensor([ids])).logits[0].float() for ids in prompts]


def save_tiny_token_classifier(name: str, folder: str, num_labels: int, **fields: object) -> str:
    """tiny_configs()[name] with `num_labels` (and other config `fields`, such as
    token_classification_bias) saved as its token-classification model, seeded; its score
    head (and bias) large enough that labels differ clearly."""
    config = copy.deepcopy(tiny_configs()[name])
    config.num_labels = num_labels
    for key, value in fields.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = transformers.AutoModelForTokenClassification.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.score.weight.normal_(0, 0.5)
        if model.score.bias is not None:
            model.score.bias.normal_(0, 0.5)
    model.save_pretrained(folder)
    save_byte_tokenizer(folder)
    return folder


def hf_token_logits(folder: str, prompts: list[list[int]]) -> list[torch.Tensor]:
    """transformers' logits [num_tokens, num_labels] of each prompt, run alone."""
    model = transformers.AutoModelForTokenClassification.from_pretrained(
        folder, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        return [model(torch.tensor([ids])).logits[0].float() for ids in prompts]
