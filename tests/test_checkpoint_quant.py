"""A checkpoint's quantization_config read as vLLM reads it: the method, and the scheme of
each layer; what pagedllm cannot run is a ValueError naming it."""

import pytest

from pagedllm.checkpoint_quant import WeightScheme, parse_quantization_config


def test_gptq() -> None:
    quant = parse_quantization_config(
        {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
    )
    assert quant.method == "gptq" and quant.gptq_v1_zeros
    assert quant.scheme("model.layers.0.mlp.down_proj") == WeightScheme(4, 128, True)
    v2 = parse_quantization_config(
        {"quant_method": "gptq", "bits": 8, "group_size": -1, "checkpoint_format": "gptq_v2"}
    )
    assert not v2.gptq_v1_zeros and v2.scheme("x") == WeightScheme(8, None, True)


def test_awq_reads_autoawq_and_transformers_field_names() -> None:
    autoawq = {"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "version": "GEMM"}
    transformers = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    assert parse_quantization_config(autoawq).scheme("x") == WeightScheme(4, 64, False)
    assert parse_quantization_config(transformers).scheme("x") == WeightScheme(4, 128, False)


def test_compressed_tensors_schemes_match_regex_targets_first() -> None:
    quant = parse_quantization_config(
        {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {
                "default": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 4, "strategy": "group", "group_size": 128},
                },
                "mlp": {
                    "targets": ["re:.*mlp.down_proj$"],
                    "format": "int-quantized",
                    "weights": {"num_bits": 8, "strategy": "channel", "symmetric": True},
                },
                "fp8": {
                    "targets": ["re:.*self_attn.o_proj$"],
                    "weights": {
                        "num_bits": 8,
                        "type": "float",
                        "strategy": "block",
                        "block_structure": [128, 64],
                    },
                },
            },
        }
    )
    assert quant.scheme("model.layers.3.self_attn.q_proj") == WeightScheme(4, 128, True)
    assert quant.scheme("model.layers.3.mlp.down_proj") == WeightScheme(8, None, True)
    fp8 = quant.scheme("model.layers.3.self_attn.o_proj")
    assert fp8 == WeightScheme(8, None, True, "float", (128, 64))


def test_a_target_naming_the_layer_comes_before_the_class() -> None:
    """vLLM's find_matched_target: the layer's name (exact or "re:") first, then "Linear"."""
    quant = parse_quantization_config(
        {
            "quant_method": "compressed-tensors",
            "config_groups": {
                "all": {
                    "targets": ["Linear"],
                    "format": "pack-quantized",
                    "weights": {"num_bits": 4, "strategy": "group", "group_size": 32},
                },
                "one": {
                    "targets": ["model.layers.0.mlp.down_proj"],
                    "format": "int-quantized",
                    "weights": {"num_bits": 8, "strategy": "channel"},
                },
            },
        }
    )
    assert quant.scheme("model.layers.0.mlp.down_proj") == WeightScheme(8, None, True)
    assert quant.scheme("model.layers.1.mlp.down_proj") == WeightScheme(4, 32, True)


def test_compressed_tensors_fp8_groups_are_blocks_of_one_row() -> None:
    quant = parse_quantization_config(
        {
            "quant_method": "compressed-tensors",
            "config_groups": {
                "g": {
                    "targets": ["Linear"],
                    "format": "float-quantized",
                    "weights": {
                        "num_bits": 8,
                        "type": "float",
                        "strategy": "group",
                        "group_size": 128,
                    },
                }
            },
        }
    )
    assert quant.scheme("x") == WeightScheme(8, None, True, "float", (1, 128))


def test_fp8_block_size() -> None:
    quant = parse_quantization_config(
        {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    )
    assert quant.scheme("x") == WeightScheme(8, None, True, "float", (128, 128))


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes'; pagedllm reads gptq"),
        ({"quant_method": "gptq", "bits": 3}, "GPTQ checkpoints of 3 bits"),
        ({"quant_method": "gptq", "bits": "4"}, "GPTQ checkpoints of '4' bits .* one of"),
        ({"quant_method": "fp8", "weight_block_size": [128]}, "must be \\[rows, columns\\]"),
        ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "'marlin'"),
        ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "AWQ version 'gemv'"),
        ({"quant_method": "awq", "bits": 4, "zero_point": False}, "without zero points"),
        ({"quant_method": "fp8", "fmt": "e5m2"}, "'e5m2' are not supported"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "g": {"format": "nvfp4-pack-quantized", "weights": {"num_bits": 4}}
                },
            },
            "format 'nvfp4-pack-quantized'",
        ),
        ({"quant_method": "compressed-tensors", "config_groups": {}}, "quantizes no weights"),
        ({"quant_method": "gptq", "bits": 4, "pack_dtype": "int16"}, "pack_dtype 'int16'"),
        ({"quant_method": "gptq", "bits": 4, "is_marlin_format": True}, "not supported"),
        ({"quant_method": "gptq", "group_size": 128}, "has no bits"),
        ({"quant_method": "awq", "bits": 4, "backend": "llm-awq"}, "backend 'llm-awq'"),
        (
            {
                "quant_method": "compressed-tensors",
                "sparsity_config": {"format": "sparse-24-bitmask"},
                "config_groups": {"g": {"weights": {"num_bits": 4}, "format": "pack-quantized"}},
            },
            "sparsity format 'sparse-24-bitmask'",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "g": {
                        "format": "int-quantized",
                        "weights": {
                            "num_bits": 8,
                            "strategy": "block",
                            "block_structure": [128, 128],
                        },
                    }
                },
            },
            "int weights with strategy 'block'",
        ),
        (["gptq"], "must be a JSON object"),
    ],
)
def test_what_pagedllm_cannot_run_is_named(config: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_quantization_config(config)
