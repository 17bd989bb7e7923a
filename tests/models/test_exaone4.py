"""pagedllm/models/exaone4.py beyond the shared comparison with transformers
(test_models_vs_transformers.py): which layers rotate q and k, by transformers'
Exaone4Attention rule (`sliding_window is None or is_sliding`)."""

import transformers

from pagedllm.models.exaone4 import rotates

SIZES = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)


def test_a_hybrid_config_rotates_its_sliding_layers_only() -> None:
    config = transformers.Exaone4Config(
        **SIZES, num_hidden_layers=8, sliding_window=16, sliding_window_pattern=4
    )
    assert config.layer_types[3] == config.layer_types[7] == "full_attention"
    assert [rotates(config, i) for i in range(8)] == [True, True, True, False] * 2


def test_a_config_without_a_window_rotates_every_layer() -> None:
    config = transformers.Exaone4Config(
        **SIZES, num_hidden_layers=2, sliding_window=None, layer_types=["full_attention"] * 2
    )
    assert [rotates(config, i) for i in range(2)] == [True, True]
