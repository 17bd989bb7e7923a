"""pooler_config.py: PoolerConfig's checks and overrides, and the pooling a
sentence-transformers folder declares. Reference: sentence-transformers' file layout
(modules.json, 1_Pooling/config.json with its pooling_mode_* flags, a Dense module's
config.json with its default activation, Tanh)."""

import json
from pathlib import Path

import pytest
import torch

from pagedllm.pooler_config import (
    DenseModule,
    PoolerConfig,
    check_pooling_type,
    sentence_transformers_pooler_config,
)
from tests.embedding_models import add_dense_module, save_sentence_transformers_files


@pytest.mark.parametrize(
    ("mode", "normalize", "expected"),
    [
        ("lasttoken", True, PoolerConfig("LAST", True)),
        ("mean_tokens", False, PoolerConfig("MEAN", False)),
        ("cls_token", True, PoolerConfig("CLS", True)),
    ],
)
def test_sentence_transformers_folder(
    tmp_path: Path, mode: str, normalize: bool, expected: PoolerConfig
) -> None:
    save_sentence_transformers_files(str(tmp_path), mode, normalize)
    assert sentence_transformers_pooler_config(str(tmp_path)) == expected


def test_unsupported_sentence_transformers_mode_is_named(tmp_path: Path) -> None:
    save_sentence_transformers_files(str(tmp_path), "max_tokens", True)
    with pytest.raises(ValueError, match="pooling_mode_max_tokens"):
        sentence_transformers_pooler_config(str(tmp_path))


def test_a_plain_folder_declares_nothing(tmp_path: Path) -> None:
    assert sentence_transformers_pooler_config(str(tmp_path)) == PoolerConfig()


def test_user_fields_override_the_folder_then_defaults() -> None:
    folder = PoolerConfig("MEAN", False)
    assert PoolerConfig().over(folder) == folder
    assert PoolerConfig(normalize=True).over(folder) == PoolerConfig("MEAN", True)
    assert PoolerConfig().over(PoolerConfig()) == PoolerConfig("LAST", True)


def test_parse_takes_dicts_and_json() -> None:
    assert PoolerConfig.parse('{"pooling_type": "cls"}') == PoolerConfig("CLS")
    assert PoolerConfig.parse({"normalize": False}) == PoolerConfig(normalize=False)
    with pytest.raises(ValueError, match="pooling_type 'MAX'"):
        PoolerConfig.parse({"pooling_type": "max"})
    with pytest.raises(ValueError, match="unknown fields"):
        PoolerConfig.parse({"dimensions": 3})
    with pytest.raises(ValueError, match="not a JSON object"):
        PoolerConfig.parse("{")


def test_dense_modules_are_read_in_order(tmp_path: Path) -> None:
    save_sentence_transformers_files(str(tmp_path), "cls_token", True)
    add_dense_module(str(tmp_path), torch.zeros(16, 64), None, None)
    config = sentence_transformers_pooler_config(str(tmp_path))
    tanh = "torch.nn.modules.activation.Tanh"
    assert (config.pooling_type, config.normalize) == ("CLS", True)
    assert config.dense == (DenseModule(str(tmp_path / "2_Dense"), 64, 16, False, tanh),)
    assert PoolerConfig(normalize=False).over(config).output_size(64) == 16
    assert PoolerConfig().over(PoolerConfig()).output_size(64) == 64


def test_modules_pagedllm_does_not_run_are_named(tmp_path: Path) -> None:
    save_sentence_transformers_files(str(tmp_path), "cls_token", True)
    add_dense_module(str(tmp_path), torch.zeros(16, 64), None, "my.Activation")
    with pytest.raises(ValueError, match="activation 'my.Activation'"):
        sentence_transformers_pooler_config(str(tmp_path))
    modules = json.loads((tmp_path / "modules.json").read_text())
    modules[2]["type"] = "sentence_transformers.models.LayerNorm"
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="models.LayerNorm"):
        sentence_transformers_pooler_config(str(tmp_path))
    (tmp_path / "modules.json").write_text(json.dumps(modules[3:] + modules[:2]))
    with pytest.raises(ValueError, match="in the order"):
        sentence_transformers_pooler_config(str(tmp_path))


def test_use_activation_is_vllms_model_default() -> None:
    """A classifier's default activation; on an embedding model, normalize where unset."""
    folder = PoolerConfig("MEAN", True)
    assert PoolerConfig(use_activation=False).over(folder) == PoolerConfig("MEAN", False, False)
    both = PoolerConfig(normalize=True, use_activation=False).over(folder)
    assert (both.normalize, both.use_activation) == (True, False)
    assert PoolerConfig.parse('{"use_activation": false}').use_activation is False
    with pytest.raises(TypeError, match="use_activation must be a bool"):
        PoolerConfig(use_activation="no")


def test_all_pools_a_token_classifier_and_nothing_else() -> None:
    """vLLM's ALL pooling (every token) is a token classifier's default and its only one."""
    assert PoolerConfig().over(PoolerConfig(), "ALL").pooling_type == "ALL"
    check_pooling_type("ALL", "LlamaForTokenClassification", per_token=True)
    check_pooling_type("MEAN", "LlamaModel", per_token=False)
    with pytest.raises(ValueError, match="classifies every token, so it pools ALL"):
        check_pooling_type("LAST", "LlamaForTokenClassification", per_token=True)
    with pytest.raises(ValueError, match="ALL keeps every token, for token classifiers"):
        check_pooling_type("ALL", "LlamaModel", per_token=False)
