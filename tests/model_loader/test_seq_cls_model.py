"""model_loader/seq_cls_model.py: a classifier's head read from its checkpoint, against the
tensors saved: `score.weight`, or the LM head rows of classifier_from_token (the embedding
rows where tied), combined as the method says; a missing or misshapen head is named."""

import json
import os

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from pagedllm.config import ModelConfig
from pagedllm.model_loader.seq_cls_model import load_seq_cls_head
from tests.classifier_models import save_tiny_classifier
from tests.embedding_models import save_byte_tokenizer
from tests.models.tiny_models import save_tiny_model, tiny_configs


def saved(folder: str) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(folder, "model.safetensors"))


def test_the_checkpoints_score_weight(tmp_path) -> None:
    folder = save_tiny_classifier("qwen3", str(tmp_path), 3)
    head = load_seq_cls_head(ModelConfig.create(folder), None)
    assert torch.equal(head.weight, saved(folder)["score.weight"].float())


@pytest.mark.parametrize(
    ("name", "row_tensor"), [("qwen3", "lm_head.weight"), ("qwen2", "model.embed_tokens.weight")]
)
def test_two_way_softmax_is_the_true_row_minus_the_false_row(tmp_path, name, row_tensor) -> None:
    save_tiny_model(tiny_configs()[name], str(tmp_path))
    save_byte_tokenizer(str(tmp_path))
    path = os.path.join(tmp_path, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["architectures"] = [
        config["architectures"][0].replace("CausalLM", "SequenceClassification")
    ]
    config |= {"classifier_from_token": ["a", "b"], "method": "from_2_way_softmax"}
    with open(path, "w") as f:
        json.dump(config, f)
    model_config = ModelConfig.create(str(tmp_path))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    head = load_seq_cls_head(model_config, tokenizer)
    rows = saved(str(tmp_path))[row_tensor][tokenizer.convert_tokens_to_ids(["a", "b"])]
    assert torch.equal(head.weight, (rows[1] - rows[0]).unsqueeze(0))
    with pytest.raises(ValueError, match="needs its tokenizer"):
        load_seq_cls_head(model_config, None)


def test_a_missing_or_misshapen_head_is_named(tmp_path) -> None:
    folder = save_tiny_classifier("qwen3", str(tmp_path), 3)
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["id2label"] = {str(i): f"L{i}" for i in range(4)}
    config["label2id"] = {f"L{i}": i for i in range(4)}
    with open(path, "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError, match=r"score head is \[3, 64\]; the config asks for \[4, 64\]"):
        load_seq_cls_head(ModelConfig.create(folder), None)
    tensors = saved(folder)
    del tensors["score.weight"]
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    with pytest.raises(ValueError, match="has no tensor score.weight"):
        load_seq_cls_head(ModelConfig.create(folder), None)


def test_dummy_weights_make_a_head_of_the_configs_shape(tmp_path) -> None:
    folder = save_tiny_classifier("qwen3", str(tmp_path), 2)
    head = load_seq_cls_head(ModelConfig.create(folder, load_format="dummy"), None)
    assert head.weight.shape == (2, 64)
