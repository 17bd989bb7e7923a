"""pooler_config.py: PoolerConfig's checks and overrides, and the pooling a
sentence-transformers folder declares. Reference: sentence-transformers' file layout
(modules.json, 1_Pooling/config.json with its pooling_mode_* flags)."""

from pathlib import Path

import pytest

from pagedllm.pooler_config import PoolerConfig, sentence_transformers_pooler_config
from tests.embedding_models import save_sentence_transformers_files


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
