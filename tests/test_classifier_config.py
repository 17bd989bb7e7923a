"""classifier_config.py: vLLM's rules for a classifier's config (its activations by
problem_type and sentence-transformers' activation_fn, classifier_from_token conversions,
id2label), checked on transformers configs."""

import pytest
import transformers

from pagedllm.classifier_config import (
    classifier_config,
    is_classifier_architecture,
    is_seq_cls_architecture,
    is_token_cls_architecture,
)


def config(**fields: object) -> transformers.PretrainedConfig:
    return transformers.Qwen3Config(**fields)


def test_defaults_are_softmax_over_the_labels_and_the_pair_encoding() -> None:
    c = classifier_config(config(num_labels=3), "m")
    assert (c.num_labels, c.classify_activation, c.score_activation) == (3, "classify", "classify")
    assert c.labels == ("LABEL_0", "LABEL_1", "LABEL_2") and c.label(2) == "LABEL_2"
    assert c.pair_tokenized and c.from_tokens == () and c.method is None


def test_id2label_names_the_labels_in_index_order() -> None:
    c = classifier_config(config(id2label={"1": "positive", "0": "negative"}), "m")
    assert c.labels == ("negative", "positive")


@pytest.mark.parametrize(
    ("problem_type", "activation"),
    [("regression", "identity"), ("multi_label_classification", "sigmoid"), (None, "classify")],
)
def test_problem_type_sets_the_classify_activation(problem_type, activation) -> None:
    assert classifier_config(config(problem_type=problem_type), "m").classify_activation == (
        activation
    )


def test_cross_encoder_activation_from_its_config() -> None:
    st = {"activation_fn": "torch.nn.modules.activation.Tanh"}
    assert classifier_config(config(sentence_transformers=st), "m").score_activation == "tanh"
    sbert = config(sbert_ce_default_activation_function="torch.nn.modules.linear.Identity")
    assert classifier_config(sbert, "m").score_activation == "identity"
    with pytest.raises(ValueError, match="'m': the cross-encoder activation 'os.system'"):
        classifier_config(config(sbert_ce_default_activation_function="os.system"), "m")
    with pytest.raises(ValueError, match=r"the cross-encoder activation \['x'\]"):
        classifier_config(config(sentence_transformers={"activation_fn": ["x"]}), "m")


def test_qwen3_reranker_is_one_label_from_two_tokens_joined_texts() -> None:
    c = classifier_config(
        config(classifier_from_token=["no", "yes"], is_original_qwen3_reranker=True), "m"
    )
    assert (c.num_labels, c.method, c.from_tokens) == (1, "from_2_way_softmax", ("no", "yes"))
    assert not c.pair_tokenized and c.labels is None


def test_no_post_processing_gives_a_label_per_token() -> None:
    c = classifier_config(config(classifier_from_token=["a", "b", "c"]), "m")
    assert (c.num_labels, c.method) == (3, None)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"classifier_from_token": ["yes"], "method": "from_2_way_softmax"}, "takes two"),
        ({"classifier_from_token": "yes"}, "must be a list of token strings"),
        ({"classifier_from_token": ["a", "b"], "method": "sum"}, "method 'sum' is not supported"),
    ],
)
def test_bad_conversions_are_named(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        classifier_config(config(**fields), "m")


def test_seq_cls_architectures() -> None:
    assert is_seq_cls_architecture("Qwen3ForSequenceClassification")
    assert not is_seq_cls_architecture("Qwen3ForCausalLM")


def test_token_classifiers() -> None:
    """*ForTokenClassification: a classifier per token, with no token conversion."""
    assert is_token_cls_architecture("Qwen2ForTokenClassification")
    assert is_classifier_architecture("Qwen2ForTokenClassification")
    assert is_classifier_architecture("Qwen2ForSequenceClassification")
    assert not is_classifier_architecture("Qwen2ForCausalLM")
    assert classifier_config(config(num_labels=5), "m", per_token=True).per_token
    with pytest.raises(ValueError, match="a token classifier reads its checkpoint's score"):
        classifier_config(config(classifier_from_token=["no", "yes"]), "m", per_token=True)
