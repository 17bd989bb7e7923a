"""ClassifierConfig: what a sequence-classification model (vLLM's classify and cross-encoder
score) computes after pooling, resolved from its config.json as vLLM resolves it.

A classifier's pooled hidden state (its prompt's last token by default) goes through the
checkpoint's `score` head ([num_labels, hidden], no bias) and an activation:
- classify (vLLM's `get_classification_act_fn`, transformers' loss rule): `problem_type`
  "regression" -> none, "multi_label_classification" -> sigmoid, otherwise sigmoid for one
  label and softmax over two or more;
- score (vLLM's `get_cross_encoder_act_fn`): a sentence-transformers cross-encoder's
  `sentence_transformers.activation_fn` or `sbert_ce_default_activation_function` (a
  `torch.nn.modules` class), otherwise as classify's default.

A generative checkpoint runs as a classifier without a `score` tensor where its config
names `classifier_from_token` (vLLM's "LLM as reranker"): `method` "from_2_way_softmax"
(two tokens [false, true]: one label whose logit is the true token's minus the false
token's, so its sigmoid is the softmax of the two) or "no_post_processing" (one label per
token, the LM head's rows). Qwen3-Reranker's `is_original_qwen3_reranker` means
"from_2_way_softmax", as in vLLM.

A token classifier (`*ForTokenClassification`, vLLM's `token_classify` task) has the same
`score` head (with a bias unless `token_classification_bias` is false, as transformers
builds it) applied to every token's hidden state, each token's logits through classify's
activation.
"""

from dataclasses import dataclass

SEQ_CLS_SUFFIX = "ForSequenceClassification"
TOKEN_CLS_SUFFIX = "ForTokenClassification"
SEQ_CLS_LOAD_METHODS = ("from_2_way_softmax", "no_post_processing")

# The activations a cross-encoder's config may name (classes of torch.nn.modules only, as
# vLLM allows) -> pagedllm's name for each.
CROSS_ENCODER_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.Softmax": "classify",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.SiLU": "silu",
}
ACTIVATIONS = ("identity", "sigmoid", "softmax", "classify", "tanh", "relu", "gelu", "silu")
""""classify" is vLLM's PoolerClassify: sigmoid for one label, softmax for more."""


@dataclass(frozen=True)
class ClassifierConfig:
    """`labels`: id2label in index order (None where the config has none); `from_tokens`:
    the LM head rows a converted generative checkpoint scores with (empty: the checkpoint's
    `score.weight`); `pair_tokenized`: a cross-encoder's two texts are tokenized as a pair
    (the tokenizer's separator between them), else the texts are joined and tokenized as
    one (vLLM's rule for an LLM as reranker); `per_token`: a token classifier, whose head
    scores every token of the prompt rather than its pooled state."""

    num_labels: int
    labels: tuple[str, ...] | None
    method: str | None
    from_tokens: tuple[str, ...]
    classify_activation: str
    score_activation: str
    pair_tokenized: bool
    per_token: bool = False

    def label(self, index: int) -> str | None:
        return None if self.labels is None else self.labels[index]


def is_seq_cls_architecture(architecture: str) -> bool:
    return architecture.endswith(SEQ_CLS_SUFFIX)


def is_token_cls_architecture(architecture: str) -> bool:
    return architecture.endswith(TOKEN_CLS_SUFFIX)


def is_classifier_architecture(architecture: str) -> bool:
    """A sequence or token classifier: a score head, no LM head."""
    return is_seq_cls_architecture(architecture) or is_token_cls_architecture(architecture)


def classifier_config(hf_config: object, model: str, per_token: bool = False) -> ClassifierConfig:
    """The classifier a `*ForSequenceClassification` config (`per_token`:
    `*ForTokenClassification`) describes, checked; messages name the model and the config
    field."""
    tokens = getattr(hf_config, "classifier_from_token", None)
    method = getattr(hf_config, "method", None)
    if getattr(hf_config, "is_original_qwen3_reranker", False):
        method = "from_2_way_softmax"
    if per_token and (tokens is not None or method is not None):
        raise ValueError(
            f"{model!r}: classifier_from_token converts a generative checkpoint into a "
            "sequence classifier; a token classifier reads its checkpoint's score head"
        )
    if tokens is not None or method is not None:
        tokens = _checked_tokens(tokens, method, model)
        num_labels = 1 if method == "from_2_way_softmax" else len(tokens)
    else:
        tokens = ()
        num_labels = getattr(hf_config, "num_labels", None)
        if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
            raise ValueError(
                f"{model!r}: config num_labels must be an int >= 1, got {num_labels!r}"
            )
    pair_default = not tokens
    pair = getattr(hf_config, "use_sep_token", getattr(hf_config, "use_pad_token", pair_default))
    return ClassifierConfig(
        num_labels,
        _labels(getattr(hf_config, "id2label", None), num_labels) if not tokens else None,
        method,
        tokens,
        _classify_activation(getattr(hf_config, "problem_type", None)),
        _score_activation(hf_config, model),
        bool(pair),
        per_token,
    )


def _checked_tokens(tokens: object, method: str | None, model: str) -> tuple[str, ...]:
    if method is None:
        method = "no_post_processing"
    if method not in SEQ_CLS_LOAD_METHODS:
        raise ValueError(
            f"{model!r}: config method {method!r} is not supported; use one of "
            f"{', '.join(SEQ_CLS_LOAD_METHODS)}"
        )
    if (
        not isinstance(tokens, list | tuple)
        or not tokens
        or not all(isinstance(t, str) and t for t in tokens)
    ):
        raise ValueError(
            f"{model!r}: config classifier_from_token must be a list of token strings, got "
            f"{tokens!r}"
        )
    if method == "from_2_way_softmax" and len(tokens) != 2:
        raise ValueError(
            f"{model!r}: method from_2_way_softmax takes two classifier_from_token entries "
            f"[false, true], got {len(tokens)}"
        )
    return tuple(tokens)


def _labels(id2label: object, num_labels: int) -> tuple[str, ...] | None:
    """id2label's names in index order (keys may be ints or their strings, as config.json
    stores them); None where the config's map does not cover every label."""
    if not isinstance(id2label, dict):
        return None
    names = {str(k): v for k, v in id2label.items()}
    if set(names) != {str(i) for i in range(num_labels)}:
        return None
    return tuple(str(names[str(i)]) for i in range(num_labels))


def _classify_activation(problem_type: object) -> str:
    if problem_type == "regression":
        return "identity"
    if problem_type == "multi_label_classification":
        return "sigmoid"
    return "classify"


def _score_activation(hf_config: object, model: str) -> str:
    st = getattr(hf_config, "sentence_transformers", None)
    name = st.get("activation_fn") if isinstance(st, dict) else None
    if name is None:
        name = getattr(hf_config, "sbert_ce_default_activation_function", None)
    if name is None:
        return "classify"
    if not isinstance(name, str) or name not in CROSS_ENCODER_ACTIVATIONS:
        raise ValueError(
            f"{model!r}: the cross-encoder activation {name!r} is not supported; pagedllm "
            f"runs {sorted(CROSS_ENCODER_ACTIVATIONS)}"
        )
    return CROSS_ENCODER_ACTIVATIONS[name]
