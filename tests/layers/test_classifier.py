"""layers/classifier.py: the score head and its activations, against their definitions
(F.linear in float32, then sigmoid / softmax / the named activation)."""

import pytest
import torch

from pagedllm.classifier_config import ClassifierConfig
from pagedllm.layers.classifier import SequenceClassifier


def head(num_labels: int, classify: str = "classify", score: str = "classify"):
    weight = torch.randn(num_labels, 8, dtype=torch.bfloat16)
    config = ClassifierConfig(num_labels, None, None, (), classify, score, True)
    return SequenceClassifier(weight, config), weight.float()


def test_many_labels_softmax_one_label_sigmoid() -> None:
    pooled = torch.randn(8)
    many, weight = head(3)
    assert torch.equal(many(pooled, "classify"), torch.softmax(weight @ pooled, -1))
    one, weight = head(1)
    assert torch.equal(one(pooled, "score"), torch.sigmoid(weight @ pooled))


def test_score_and_classify_take_their_own_activation() -> None:
    pooled = torch.randn(8)
    classifier, weight = head(1, classify="identity", score="tanh")
    logits = weight @ pooled
    assert torch.allclose(classifier(pooled, "classify"), logits)
    assert torch.allclose(classifier(pooled, "score"), torch.tanh(logits))


def test_use_activation_false_gives_the_logits_in_float32() -> None:
    classifier, weight = head(3)
    pooled = torch.randn(8, dtype=torch.bfloat16)
    out = classifier(pooled, "classify", use_activation=False)
    assert out.dtype == torch.float32
    assert out == pytest.approx((weight @ pooled.float()).tolist())


def test_a_token_classifier_scores_every_row_with_its_bias() -> None:
    """Per token, as transformers' *ForTokenClassification: softmax(rows @ W.T + b)."""
    rows, weight, bias = torch.randn(5, 8), torch.randn(3, 8), torch.randn(3)
    config = ClassifierConfig(3, None, None, (), "classify", "classify", True, per_token=True)
    classifier = SequenceClassifier(weight, config, bias)
    logits = rows @ weight.T + bias
    assert torch.allclose(classifier(rows, "token_classify", False), logits, atol=1e-6)
    assert torch.allclose(classifier(rows, "token_classify"), torch.softmax(logits, -1), atol=1e-6)
