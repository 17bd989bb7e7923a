"""LLM.classify and LLM.score on classifiers (pagedllm/llm.py, classifier_config.py,
layers/classifier.py, model_loader/seq_cls_model.py). Reference: transformers'
AutoModelForSequenceClassification on the same tiny checkpoints in float32 (its last
token's score-head logits, through vLLM's activation rule, computed here), and for a
generative checkpoint converted by classifier_from_token, transformers' causal LM's logits
of those tokens at the prompt's last position. Within 1e-5, prompts longer than a chunk
(chunked prefill) included, in batches of several prompts."""

import os
from collections.abc import Callable

import pytest
import torch
import transformers

from pagedllm import LLM, ClassificationRequestOutput, PoolingParams, ScoringRequestOutput
from tests.classifier_models import hf_label_logits, save_tiny_classifier
from tests.embedding_models import save_byte_tokenizer

CHUNK = 32  # max_num_batched_tokens: the 150- and 200-token prompts run in several chunks


def classifier_llm(folder: str, **kwargs: object) -> LLM:
    return LLM(folder, dtype="float32", max_num_batched_tokens=CHUNK, num_kv_blocks=64, **kwargs)


def tokens(ids: list[int]) -> dict:
    return {"prompt_token_ids": ids}


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(3, 259, (n,), generator=gen).tolist() for n in (1, 7, 31, 64, 150, 200)]


@pytest.mark.parametrize(
    "name",
    [
        "llama-gqa-llama3",
        "llama-tied-mqa",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3-moe",
        "olmo3",
        "exaone4",
        "glm4",
        "starcoder2",
    ],
)
@pytest.mark.parametrize("num_labels", [1, 3])
def test_classify_equals_transformers(
    tmp_path, prompts: list[list[int]], name: str, num_labels: int
) -> None:
    folder = save_tiny_classifier(name, str(tmp_path), num_labels)
    with classifier_llm(folder) as llm:
        outputs = llm.classify([tokens(p) for p in prompts], use_tqdm=False)
        assert llm.llm_engine.block_manager.num_free_blocks == 64, "no KV outlives a request"
    assert all(isinstance(o, ClassificationRequestOutput) and o.finished for o in outputs)
    activation = torch.sigmoid if num_labels == 1 else (lambda x: torch.softmax(x, -1))
    for prompt, output, logits in zip(prompts, outputs, hf_label_logits(folder, prompts)):
        assert output.prompt_token_ids == prompt
        assert output.outputs.num_classes == num_labels
        assert output.outputs.probs == pytest.approx(activation(logits).tolist(), abs=1e-5)


@pytest.mark.parametrize(
    ("problem_type", "activation"),
    [
        ("regression", lambda x: x),
        ("multi_label_classification", torch.sigmoid),
        ("single_label_classification", lambda x: torch.softmax(x, -1)),
    ],
)
def test_problem_type_picks_the_activation(
    tmp_path, prompts: list[list[int]], problem_type: str, activation: Callable
) -> None:
    """vLLM's rule, transformers' loss rule: the config's problem_type."""
    folder = save_tiny_classifier("qwen3", str(tmp_path), 3, problem_type=problem_type)
    with classifier_llm(folder) as llm:
        outputs = llm.classify([tokens(p) for p in prompts[:3]], use_tqdm=False)
    for output, logits in zip(outputs, hf_label_logits(folder, prompts[:3])):
        assert output.outputs.probs == pytest.approx(activation(logits).tolist(), abs=1e-5)


def test_use_activation_false_gives_the_logits(tmp_path, prompts: list[list[int]]) -> None:
    folder = save_tiny_classifier("llama-gqa-llama3", str(tmp_path), 3)
    with classifier_llm(folder) as llm:
        raw = llm.classify(
            [tokens(p) for p in prompts[:3]], PoolingParams(use_activation=False), use_tqdm=False
        )
        (encoded,) = llm.encode(tokens(prompts[0]), use_tqdm=False)
    expected = hf_label_logits(folder, prompts[:3])
    for output, logits in zip(raw, expected):
        assert output.outputs.probs == pytest.approx(logits.tolist(), abs=1e-5)
    assert encoded.outputs.data.tolist() == pytest.approx(
        torch.softmax(expected[0], -1).tolist(), abs=1e-5
    )


def test_labels_do_not_depend_on_the_batch_or_chunks(tmp_path, prompts: list[list[int]]) -> None:
    """The same prompt alone and in a batch, in one chunk and in many: the same bits."""
    folder = save_tiny_classifier("qwen3", str(tmp_path), 3)
    with classifier_llm(folder) as llm:
        batch = llm.classify([tokens(p) for p in prompts], use_tqdm=False)
        alone = [llm.classify(tokens(p), use_tqdm=False)[0] for p in prompts]
    with LLM(folder, dtype="float32", max_num_batched_tokens=512, num_kv_blocks=64) as whole:
        unchunked = whole.classify([tokens(p) for p in prompts], use_tqdm=False)
    for a, b, c in zip(batch, alone, unchunked):
        assert a.outputs.probs == b.outputs.probs == c.outputs.probs


def cross_encoder(tmp_path) -> str:
    return save_tiny_classifier("qwen3", str(tmp_path), 1)


def test_score_runs_each_pair_as_one_prompt(tmp_path) -> None:
    """A one-label classifier scores a pair as the tokenizer's pair encoding of its two
    texts; 1 against N and N against N pair as vLLM's."""
    folder = cross_encoder(tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    query, documents = "what is a cat?", ["a cat is an animal", "stock markets fell", "meow"]
    with classifier_llm(folder) as llm:
        one_to_n = llm.score(query, documents, use_tqdm=False)
        n_to_n = llm.score([query] * 3, documents, use_tqdm=False)
        raw = llm.score(query, documents, pooling_params=PoolingParams(use_activation=False))
    pairs = [tokenizer(text=query, text_pair=d)["input_ids"] for d in documents]
    logits = [x[0].item() for x in hf_label_logits(folder, pairs)]
    assert all(isinstance(o, ScoringRequestOutput) and o.finished for o in one_to_n)
    assert [o.prompt_token_ids for o in one_to_n] == pairs
    expected = torch.sigmoid(torch.tensor(logits)).tolist()
    assert [o.outputs.score for o in one_to_n] == pytest.approx(expected, abs=1e-5)
    assert [o.outputs.score for o in n_to_n] == [o.outputs.score for o in one_to_n]
    assert [o.outputs.score for o in raw] == pytest.approx(logits, abs=1e-5)


def test_score_truncation_cuts_the_pair_as_the_tokenizer_does(tmp_path) -> None:
    """vLLM's rule: truncate_prompt_tokens is the tokenizer's truncation of the pair
    (longest_first), so the query's start stays in every pair."""
    folder = cross_encoder(tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    query, documents = "what is a cat?", ["a cat is an animal", "meow"]
    with classifier_llm(folder) as llm:
        outputs = llm.score(query, documents, truncate_prompt_tokens=10, use_tqdm=False)
        same = llm.score(query, documents, pooling_params=PoolingParams(truncate_prompt_tokens=10))
    cut = [
        tokenizer(text=query, text_pair=d, truncation=True, max_length=10)["input_ids"]
        for d in documents
    ]
    assert [o.prompt_token_ids for o in outputs] == cut
    assert all(ids[:4] == tokenizer(query)["input_ids"][:4] for ids in cut)
    expected = [torch.sigmoid(x)[0].item() for x in hf_label_logits(folder, cut)]
    assert [o.outputs.score for o in outputs] == pytest.approx(expected, abs=1e-5)
    assert [o.outputs.score for o in same] == [o.outputs.score for o in outputs]


def test_score_template_formats_the_pair(tmp_path) -> None:
    folder = cross_encoder(tmp_path)
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    with classifier_llm(folder) as llm:
        (output,) = llm.score("q", "d", chat_template=template, use_tqdm=False)
    ids = tokenizer("<query>q<document>d")["input_ids"]
    assert output.prompt_token_ids == ids
    (logits,) = hf_label_logits(folder, [ids])
    assert output.outputs.score == pytest.approx(torch.sigmoid(logits)[0].item(), abs=1e-5)


def test_sentence_transformers_activation_scores_pairs(tmp_path) -> None:
    """A cross-encoder's config names its activation; classify keeps the default rule."""
    identity = {"activation_fn": "torch.nn.modules.linear.Identity"}
    folder = save_tiny_classifier("qwen3", str(tmp_path), 1, sentence_transformers=identity)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    with classifier_llm(folder) as llm:
        (scored,) = llm.score("a", "b", use_tqdm=False)
        (classified,) = llm.classify("ab", use_tqdm=False)
    (pair_logits,) = hf_label_logits(folder, [tokenizer(text="a", text_pair="b")["input_ids"]])
    (text_logits,) = hf_label_logits(folder, [tokenizer("ab")["input_ids"]])
    assert scored.outputs.score == pytest.approx(pair_logits[0].item(), abs=1e-5)
    assert classified.outputs.probs == pytest.approx(torch.sigmoid(text_logits).tolist(), abs=1e-5)


def generative_folder(tiny_model_path: Callable[[str], str], tmp_path, name: str) -> str:
    """A generative tiny checkpoint (linked) with a tokenizer."""
    source = tiny_model_path(name)
    folder = str(tmp_path / name)
    os.makedirs(folder)
    for file in os.listdir(source):
        os.symlink(os.path.join(source, file), os.path.join(folder, file))
    save_byte_tokenizer(folder)
    return folder


def reranker_overrides(architecture: str) -> dict:
    """vLLM's Qwen3-Reranker recipe (its hf_overrides), with tokens "a" (false) and "b"
    (true) of the tiny vocabulary."""
    return {
        "architectures": [architecture],
        "classifier_from_token": ["a", "b"],
        "is_original_qwen3_reranker": True,
    }


@pytest.mark.parametrize("name", ["qwen3", "qwen2"])  # untied and tied LM heads
def test_llm_as_reranker_scores_the_true_tokens_softmax(
    tiny_model_path: Callable[[str], str], tmp_path, prompts: list[list[int]], name: str
) -> None:
    """from_2_way_softmax: sigmoid(logit_true - logit_false) is the softmax of the two
    tokens' logits at the last position of transformers' causal LM."""
    folder = generative_folder(tiny_model_path, tmp_path, name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    false_id, true_id = tokenizer.convert_tokens_to_ids(["a", "b"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    architecture = f"{name.capitalize()}ForSequenceClassification"
    with classifier_llm(folder, hf_overrides=reranker_overrides(architecture)) as llm:
        classified = llm.classify([tokens(p) for p in prompts], use_tqdm=False)
        (scored,) = llm.score("query ", "document", use_tqdm=False)
    for prompt, output in zip(prompts, classified):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt])).logits[0, -1]
        expected = torch.softmax(logits[[false_id, true_id]], -1)[1].item()
        assert output.outputs.probs == pytest.approx([expected], abs=1e-5)
    joined = tokenizer("query document")["input_ids"]  # an LLM as reranker joins the texts
    assert scored.prompt_token_ids == joined


def test_no_post_processing_takes_each_tokens_logit(
    tiny_model_path: Callable[[str], str], tmp_path, prompts: list[list[int]]
) -> None:
    folder = generative_folder(tiny_model_path, tmp_path, "qwen3")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer.convert_tokens_to_ids(["a", "b", "c"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    overrides = {
        "architectures": ["Qwen3ForSequenceClassification"],
        "method": "no_post_processing",
        "classifier_from_token": ["a", "b", "c"],
    }
    with classifier_llm(folder, hf_overrides=overrides) as llm:
        outputs = llm.classify([tokens(p) for p in prompts[:3]], use_tqdm=False)
    for prompt, output in zip(prompts, outputs):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt])).logits[0, -1, ids]
        assert output.outputs.probs == pytest.approx(torch.softmax(logits, -1).tolist(), abs=1e-5)


def test_each_model_refuses_the_other_kinds_task(
    tmp_path, tiny_model_path: Callable[[str], str]
) -> None:
    folder = save_tiny_classifier("qwen3", str(tmp_path), 3)
    with classifier_llm(folder) as llm:
        with pytest.raises(ValueError, match=r"LLM.embed\(\): this model is a classifier"):
            llm.embed("hello", use_tqdm=False)
        with pytest.raises(ValueError, match="one label .* this model has 3 labels"):
            llm.score("a", "b", use_tqdm=False)
        with pytest.raises(ValueError, match="dimensions is for embeddings"):
            llm.classify("hello", PoolingParams(dimensions=2), use_tqdm=False)
        assert llm.classify("still serving", use_tqdm=False)[0].finished, "after refusals"
    with classifier_llm(cross_encoder(tmp_path / "one-label")) as llm:
        with pytest.raises(TypeError, match="a cross-encoder scores texts"):
            llm.score(tokens([5, 6]), "b", use_tqdm=False)
    embedder = tiny_model_path("qwen3")
    with LLM(embedder, runner="pooling", skip_tokenizer_init=True, num_kv_blocks=64) as llm:
        with pytest.raises(ValueError, match=r"LLM.classify\(\): this model is an embedding"):
            llm.classify(tokens([5, 6]), use_tqdm=False)
        with pytest.raises(ValueError, match="chat_template: a score template"):
            llm.score(tokens([5]), tokens([6]), chat_template="{{ 1 }}", use_tqdm=False)


def test_a_classifier_does_not_generate(tmp_path) -> None:
    folder = save_tiny_classifier("qwen3", str(tmp_path), 2)
    with pytest.raises(ValueError, match="classifies .* use runner 'pooling' or 'auto'"):
        LLM(folder, runner="generate", num_kv_blocks=16)


def test_refusals_name_what_is_wrong(tmp_path, tiny_model_path: Callable[[str], str]) -> None:
    folder = save_tiny_classifier("qwen3", str(tmp_path / "three"), 3)
    with classifier_llm(folder) as llm:
        with pytest.raises(
            ValueError, match="params ask for task 'embed'; this call runs 'classify'"
        ):
            llm.classify("hi", PoolingParams(task="embed"), use_tqdm=False)
        with pytest.raises(
            ValueError, match=r"classifies prompts .*; use classify \(POST /classify\)$"
        ):
            llm.generate("hi", use_tqdm=False)
    with classifier_llm(cross_encoder(tmp_path / "one")) as llm:
        with pytest.raises(ValueError, match=r"use classify \(POST /classify\) or score \(POST"):
            llm.generate("hi", use_tqdm=False)
        with pytest.raises(TypeError, match="got None, not a string"):
            llm.score({"text": "q"}, "d", use_tqdm=False)
        with pytest.raises(TypeError, match="a text, a prompt or a list of them, got b'q'"):
            llm.score(b"q", "d", use_tqdm=False)
    with LLM(tiny_model_path("qwen3"), num_kv_blocks=64, skip_tokenizer_init=True) as llm:
        with pytest.raises(ValueError, match="use a \\*ForSequenceClassification checkpoint"):
            llm.classify(tokens([5]), use_tqdm=False)


def test_pooler_config_use_activation_is_the_models_default(
    tmp_path, prompts: list[list[int]]
) -> None:
    folder = save_tiny_classifier("qwen3", str(tmp_path), 3)
    with classifier_llm(folder, pooler_config={"use_activation": False}) as llm:
        raw = llm.classify(tokens(prompts[2]), use_tqdm=False)[0].outputs.probs
        asked = llm.classify(tokens(prompts[2]), PoolingParams(use_activation=True))
    (logits,) = hf_label_logits(folder, [prompts[2]])
    assert raw == pytest.approx(logits.tolist(), abs=1e-5)
    assert asked[0].outputs.probs == pytest.approx(torch.softmax(logits, -1).tolist(), abs=1e-5)
