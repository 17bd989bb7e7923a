"""EngineArgs (pagedllm/engine/arg_utils.py). Reference: its fields: each one (but
logits_processors, Python objects, and seed, which on the command line is a request's sampling
seed) is a --kebab-case flag of its type, flags parse back to the same EngineArgs, and
create_engine_config hands every field to the config part that owns it; vLLM's hub arguments
(revision, download_dir) are flags whose only accepted value is their default."""

import argparse
import pathlib
import re
from dataclasses import fields

import pytest
import torch

from pagedllm import _triton_ops
from pagedllm.engine.arg_utils import EngineArgs
from tests.engine.engine_helpers import LLAMA

NOT_CLI = {"logits_processors", "seed", "usage_context"}
HUB = {"revision": "main", "code_revision": "main", "tokenizer_revision": "v1", "download_dir": "d"}


def parser_with_flags(with_model: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser, with_model=with_model)
    return parser


def flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> its flag (booleans also get a --no- form)."""
    return {a.dest: a.option_strings[0] for a in parser._actions if a.dest != "help"}


def test_every_field_but_the_programmatic_ones_has_a_flag() -> None:
    names = [f.name for f in fields(EngineArgs) if f.name not in NOT_CLI]
    expected = {name: "--" + name.replace("_", "-") for name in names}
    assert flags(parser_with_flags()) == expected
    del expected["model"]
    assert flags(parser_with_flags(with_model=False)) == expected


def test_no_flags_give_the_defaults() -> None:
    assert EngineArgs.from_cli_args(parser_with_flags().parse_args([])) == EngineArgs()


def test_add_cli_args_returns_the_parser_as_vllms() -> None:
    """vLLM's examples write `parser = EngineArgs.add_cli_args(parser)`."""
    parser = argparse.ArgumentParser()
    assert EngineArgs.add_cli_args(parser) is parser


def test_flags_round_trip_with_their_types() -> None:
    argv = [
        "--model",
        "m",
        "--tokenizer",
        "t",
        "--tokenizer-mode",
        "slow",
        "--trust-remote-code",
        "--disable-log-stats",
        "--disable-custom-all-reduce",
        "--swap-space",
        "2.5",
        "--dtype",
        "float16",
        "-tp",
        "2",
        "-pp",
        "3",
        "--enable-expert-parallel",
        "--distributed-executor-backend",
        "ray",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "1234",
        "--max-model-len",
        "128",
        "--block-size",
        "8",
        "--kv-cache-memory-bytes",
        "4096",
        "--num-kv-blocks",
        "9",
        "--gpu-memory-utilization",
        "0.75",
        "--max-num-seqs",
        "3",
        "--max-num-batched-tokens",
        "64",
        "--no-enable-prefix-caching",
        "--no-enable-chunked-prefill",
        "--async-scheduling",
        "--scheduling-policy",
        "priority",
        "--skip-tokenizer-init",
        "--device",
        "cpu",
        "--max-logprobs",
        "4",
        "--max-n",
        "5",
        "--logprobs-mode",
        "processed_logprobs",
        "--quantization",
        "int8",
        "--kv-cache-dtype",
        "bfloat16",
        "--enforce-eager",
        "--load-format",
        "dummy",
        "--batch-invariant",
        "--runner",
        "pooling",
        "--pooler-config",
        '{"pooling_type": "MEAN"}',
        "--attention-backend",
        "TORCH_SDPA",
        "--hf-overrides",
        '{"num_hidden_layers": 1}',
        "-dp",
        "3",
        "--data-parallel-size-local",
        "2",
        "--data-parallel-start-rank",
        "1",
        "--data-parallel-address",
        "10.0.0.1",
        "--data-parallel-rpc-port",
        "13345",
        "--generation-config",
        "vllm",
        "--override-generation-config",
        '{"temperature": 0.5}',
        "--enable-lora",
        "--max-loras",
        "2",
        "--max-lora-rank",
        "8",
        "--max-cpu-loras",
        "3",
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}',
    ]
    args = EngineArgs.from_cli_args(parser_with_flags().parse_args(argv))
    assert args == EngineArgs(
        model="m",
        tokenizer="t",
        tokenizer_mode="slow",
        trust_remote_code=True,
        disable_log_stats=True,
        disable_custom_all_reduce=True,
        dtype="float16",
        tensor_parallel_size=2,
        pipeline_parallel_size=3,
        enable_expert_parallel=True,
        distributed_executor_backend="ray",
        nnodes=2,
        node_rank=1,
        master_addr="10.0.0.1",
        master_port=1234,
        max_model_len=128,
        block_size=8,
        kv_cache_memory_bytes=4096,
        num_kv_blocks=9,
        gpu_memory_utilization=0.75,
        max_num_seqs=3,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
        enable_chunked_prefill=False,
        async_scheduling=True,
        scheduling_policy="priority",
        skip_tokenizer_init=True,
        device="cpu",
        max_logprobs=4,
        max_n=5,
        logprobs_mode="processed_logprobs",
        quantization="int8",
        kv_cache_dtype="bfloat16",
        enforce_eager=True,
        load_format="dummy",
        batch_invariant=True,
        runner="pooling",
        pooler_config='{"pooling_type": "MEAN"}',
        attention_backend="TORCH_SDPA",
        hf_overrides='{"num_hidden_layers": 1}',
        data_parallel_size=3,
        data_parallel_size_local=2,
        data_parallel_start_rank=1,
        data_parallel_address="10.0.0.1",
        data_parallel_rpc_port=13345,
        generation_config="vllm",
        override_generation_config='{"temperature": 0.5}',
        swap_space=2.5,
        speculative_config={"num_speculative_tokens": 4, "prompt_lookup_max": 4},
        enable_lora=True,
        max_loras=2,
        max_lora_rank=8,
        max_cpu_loras=3,
    )
    assert {f.name for f in fields(EngineArgs) if f.name not in NOT_CLI | set(HUB)} == {
        name for name, value in vars(args).items() if value != getattr(EngineArgs(), name)
    }, "every flag above differs from its default"


@pytest.mark.parametrize("name, value", HUB.items())
def test_a_hub_flag_is_refused_by_name(name: str, value: str) -> None:
    """pagedllm downloads nothing: a revision or download folder is a ValueError naming it."""
    flag = "--" + name.replace("_", "-")
    namespace = parser_with_flags().parse_args([flag, value])
    with pytest.raises(ValueError, match=f"{name}='{value}': pagedllm loads local folders"):
        EngineArgs.from_cli_args(namespace)


def test_from_cli_args_ignores_the_sampling_seed() -> None:
    namespace = argparse.Namespace(model="m", seed=5)
    assert EngineArgs.from_cli_args(namespace) == EngineArgs(model="m")


def test_create_engine_config_passes_every_field(tiny_model_path) -> None:
    processors = ["pkg.Processor"]
    args = EngineArgs(
        tiny_model_path(LLAMA),
        dtype="float16",
        tensor_parallel_size=2,
        tokenizer=tiny_model_path(LLAMA),
        tokenizer_mode="slow",
        enable_expert_parallel=True,
        distributed_executor_backend="mp",
        nnodes=2,
        node_rank=1,
        master_addr="10.0.0.1",
        master_port=1234,
        max_model_len=128,
        block_size=8,
        kv_cache_memory_bytes=4096,
        num_kv_blocks=20,
        gpu_memory_utilization=0.5,
        max_num_seqs=3,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
        enable_chunked_prefill=True,
        scheduling_policy="priority",
        seed=11,
        skip_tokenizer_init=True,
        device="cpu",
        max_logprobs=4,
        max_n=5,
        logprobs_mode="processed_logprobs",
        logits_processors=processors,
        enforce_eager=True,
        batch_invariant=True,
        attention_backend="torch_sdpa",
        hf_overrides='{"num_hidden_layers": 1, "rope_theta": 500.0}',
    )
    config = args.create_engine_config()
    model = config.model_config
    assert (model.model, str(model.dtype), model.max_model_len) == (
        args.model,
        "torch.float16",
        128,
    )
    cache = config.cache_config
    assert (cache.block_size, cache.num_kv_blocks, cache.kv_cache_memory_bytes) == (8, 20, 4096)
    assert cache.gpu_memory_utilization == 0.5
    assert cache.enable_prefix_caching is False
    sched = config.scheduler_config
    assert (sched.max_num_seqs, sched.max_num_batched_tokens, sched.enable_chunked_prefill) == (
        3,
        64,
        True,
    )
    assert sched.policy == "priority"
    assert config.parallel_config.tensor_parallel_size == 2
    assert config.parallel_config.enable_expert_parallel is True
    parallel = config.parallel_config
    assert (parallel.distributed_executor_backend, parallel.nnodes, parallel.node_rank) == (
        "mp",
        2,
        1,
    )
    assert (parallel.master_addr, parallel.master_port) == ("10.0.0.1", 1234)
    assert (config.device, config.seed, config.skip_tokenizer_init) == ("cpu", 11, True)
    assert (config.max_logprobs, config.max_n, config.logprobs_mode) == (4, 5, "processed_logprobs")
    assert config.logits_processors == ("pkg.Processor",)
    assert (config.enforce_eager, config.batch_invariant) == (True, True)
    assert config.attention_backend == "TORCH_SDPA"
    assert (model.hf_config.num_hidden_layers, model.hf_config.rope_theta) == (1, 500.0)
    assert (model.tokenizer, model.tokenizer_mode) == (args.tokenizer, "slow")


def test_an_unknown_scheduling_policy_is_named_with_the_choices(tiny_model_path) -> None:
    args = EngineArgs(tiny_model_path(LLAMA), scheduling_policy="lifo", device="cpu")
    with pytest.raises(ValueError, match="scheduling policy 'lifo' .* use one of fcfs, priority"):
        args.create_engine_config()


def test_the_scheduling_policy_flag_lists_its_choices(capsys: pytest.CaptureFixture) -> None:
    """vLLM's --scheduling-policy {fcfs,priority}: --help shows the choices and a line of
    help; another value is argparse's usage error."""
    parser = parser_with_flags()
    help_text = parser.format_help()
    assert "--scheduling-policy {fcfs,priority}" in help_text
    assert "the order waiting requests run in" in help_text
    with pytest.raises(SystemExit):
        parser.parse_args(["--scheduling-policy", "lifo"])
    assert "invalid choice: 'lifo'" in capsys.readouterr().err


@pytest.mark.parametrize("overrides", ["{not json", "[1, 2]", {1: 2}])
def test_hf_overrides_must_be_an_object_of_fields(tiny_model_path, overrides) -> None:
    with pytest.raises(ValueError, match="hf_overrides"):
        EngineArgs(tiny_model_path(LLAMA), hf_overrides=overrides).create_engine_config()


def test_create_engine_config_rejects_a_bad_device(tiny_model_path) -> None:
    with pytest.raises(ValueError, match="device 'gpu0' is not a torch device"):
        EngineArgs(tiny_model_path(LLAMA), device="gpu0").create_engine_config()


@pytest.mark.parametrize(
    "device, gpus, message",
    [
        ("cuda", 0, "device 'cuda': torch finds no CUDA GPU on this machine"),
        ("cuda:0", 0, "device 'cuda:0': torch finds no CUDA GPU on this machine"),
        ("cuda:1", 1, r"device 'cuda:1': torch finds 1 CUDA GPU\(s\), cuda:0 on"),
    ],
)
def test_a_cuda_device_this_machine_lacks_is_named(
    tiny_model_path, monkeypatch: pytest.MonkeyPatch, device: str, gpus: int, message: str
) -> None:
    """Not torch's AssertionError at the first allocation, deep in loading."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    with pytest.raises(ValueError, match=message):
        EngineArgs(tiny_model_path(LLAMA), device=device).create_engine_config()


def test_a_cuda_device_this_machine_has_is_taken(tiny_model_path, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    config = EngineArgs(tiny_model_path(LLAMA), device="cuda:1").create_engine_config()
    assert config.device == "cuda:1"


def test_the_meta_device_is_refused(tiny_model_path) -> None:
    with pytest.raises(ValueError, match="device 'meta' holds no data"):
        EngineArgs(tiny_model_path(LLAMA), device="meta").create_engine_config()


def _allocates_on(device: str) -> bool:
    try:
        torch.empty(0, device=device)
    except Exception:  # this torch's way of saying it cannot
        return False
    return True


@pytest.mark.parametrize("device", ["xpu", "mps"])
def test_a_device_torch_cannot_allocate_on_here_is_named(tiny_model_path, device) -> None:
    """Skipped where it can (an Intel GPU, a Mac)."""
    if _allocates_on(device):
        pytest.skip(f"torch allocates on {device} here")
    with pytest.raises(ValueError, match=f"device '{device}' is not usable here: "):
        EngineArgs(tiny_model_path(LLAMA), device=device).create_engine_config()


@pytest.mark.parametrize(
    ("value", "expected"), [("1", True), ("on", True), ("0", False), ("", False)]
)
def test_batch_invariant_defaults_to_pagedllm_batch_invariant(monkeypatch, value, expected) -> None:
    monkeypatch.setenv("PAGEDLLM_BATCH_INVARIANT", value)
    assert EngineArgs().batch_invariant is expected
    assert parser_with_flags().parse_args([]).batch_invariant is expected
    assert parser_with_flags().parse_args(["--no-batch-invariant"]).batch_invariant is False


def test_a_bad_pagedllm_batch_invariant_is_named(monkeypatch) -> None:
    monkeypatch.setenv("PAGEDLLM_BATCH_INVARIANT", "maybe")
    with pytest.raises(ValueError, match="PAGEDLLM_BATCH_INVARIANT='maybe'"):
        EngineArgs()


@pytest.mark.parametrize(("value", "expected"), [("TRITON_ATTN", "TRITON_ATTN"), ("", None)])
def test_attention_backend_defaults_to_pagedllm_attention_backend(
    monkeypatch, value, expected
) -> None:
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", value)
    assert EngineArgs().attention_backend == expected
    assert parser_with_flags().parse_args([]).attention_backend == expected
    flag = ["--attention-backend", "CPU_ATTN"]
    assert parser_with_flags().parse_args(flag).attention_backend == "CPU_ATTN"


def test_an_unknown_attention_backend_is_named_with_the_choices(tiny_model_path) -> None:
    with pytest.raises(ValueError, match="'FLASH' is not one of TRITON_ATTN, CPU_ATTN, TORCH_SDPA"):
        EngineArgs(tiny_model_path(LLAMA), attention_backend="FLASH").create_engine_config()


def test_an_attention_backend_that_cannot_run_here_is_named(tiny_model_path, monkeypatch) -> None:
    """CPU_ATTN has no float16 kernels; TRITON_ATTN runs CPU tensors only under Triton's
    interpreter. Each error names the backends that can run."""
    path = tiny_model_path(LLAMA)
    with pytest.raises(ValueError, match="CPU_ATTN cannot run torch.float16 on cpu.*TORCH_SDPA"):
        EngineArgs(
            path, device="cpu", dtype="float16", attention_backend="CPU_ATTN"
        ).create_engine_config()
    monkeypatch.setattr(_triton_ops, "interpreting", lambda: False)
    with pytest.raises(ValueError, match="TRITON_ATTN cannot run .*TRITON_INTERPRET=1"):
        EngineArgs(path, device="cpu", attention_backend="TRITON_ATTN").create_engine_config()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_model_len": "128"}, "max_model_len must be an int or None, got '128' of type str"),
        ({"max_model_len": 64.5}, "max_model_len must be an int or None, got 64.5"),
        ({"max_num_seqs": 2.5}, "max_num_seqs must be an int or None, got 2.5"),
        ({"max_num_batched_tokens": 100.5}, "max_num_batched_tokens must be an int or None"),
        ({"block_size": 16.0}, "block_size must be an int, got 16.0 of type float"),
        ({"block_size": True}, "block_size must be an int, got True of type bool"),
        ({"num_kv_blocks": 40.5}, "num_kv_blocks must be an int or None, got 40.5"),
        ({"tensor_parallel_size": "2"}, "tensor_parallel_size must be an int, got '2'"),
        ({"seed": None}, "seed must be an int, got None of type NoneType"),
        ({"seed": "1"}, "seed must be an int, got '1' of type str"),
        ({"seed": 1.5}, "seed must be an int, got 1.5 of type float"),
        ({"gpu_memory_utilization": "0.5"}, "gpu_memory_utilization must be a number, got '0.5'"),
        ({"enforce_eager": 1}, "enforce_eager must be a bool, got 1 of type int"),
        ({"async_scheduling": "yes"}, "async_scheduling must be a bool or None, got 'yes'"),
        ({"dtype": 16}, "dtype must be a str or a torch.dtype, got 16"),
        ({"device": None}, "device must be a str, got None"),
        ({"model": 123}, "model must be a str or an os.PathLike or None, got 123 of type int"),
        ({"tokenizer": 1}, "tokenizer must be a str or an os.PathLike or None, got 1"),
        ({"trust_remote_code": "true"}, "trust_remote_code must be a bool, got 'true'"),
    ],
)
def test_a_value_of_the_wrong_type_is_named_with_the_types_allowed(kwargs, message) -> None:
    """Not an error from deep inside ('<=' between int and str, torch's seed TypeError),
    and no float or str silently taken as an int."""
    with pytest.raises(TypeError, match=re.escape(message)):
        EngineArgs(**kwargs)


def test_an_int_outside_int64_or_a_non_finite_number_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="seed must be an int in the signed 64-bit range"):
        EngineArgs(seed=2**64)
    with pytest.raises(ValueError, match="gpu_memory_utilization must be a number, got nan"):
        EngineArgs(gpu_memory_utilization=float("nan"))


def test_values_of_the_right_types_are_kept() -> None:
    """None where the type allows it, an int for a float, a torch dtype, a list of processors."""
    args = EngineArgs(
        max_model_len=None, gpu_memory_utilization=1, dtype=torch.float16, logits_processors=[]
    )
    assert args.gpu_memory_utilization == 1.0 and isinstance(args.gpu_memory_utilization, float)
    assert (args.max_model_len, args.dtype, args.logits_processors) == (None, torch.float16, [])


def test_paths_may_be_path_objects(tiny_model_path) -> None:
    """pathlib.Path (any os.PathLike) is taken as its str, as vLLM takes it."""
    folder = tiny_model_path(LLAMA)
    args = EngineArgs(model=pathlib.Path(folder), tokenizer=pathlib.Path(folder))
    assert (args.model, args.tokenizer) == (folder, folder)
    assert args.create_engine_config().model_config.model == folder


@pytest.mark.parametrize(
    "kwargs", [{"trust_remote_code": True}, {"disable_log_stats": True}, {"tokenizer_mode": "hf"}]
)
def test_vllms_arguments_of_a_typical_script_are_accepted(tiny_model_path, kwargs) -> None:
    config = EngineArgs(tiny_model_path(LLAMA), skip_tokenizer_init=True, **kwargs)
    assert config.create_engine_config().model_config.model == tiny_model_path(LLAMA)


def test_swap_space_is_accepted_as_vllms(tiny_model_path) -> None:
    """Preemption recomputes, as vLLM v1's: the swap space asks for nothing, but its value
    is checked."""
    EngineArgs(tiny_model_path(LLAMA), swap_space=16).create_engine_config()
    with pytest.raises(ValueError, match="swap_space must be >= 0"):
        EngineArgs(swap_space=-1)


@pytest.mark.parametrize(
    ("env", "kwargs", "expected"),
    [
        ("2", {}, 2 * 1024**3),
        ("0.5", {}, 1024**3 // 2),
        ("0", {}, None),  # vLLM's 0: the default share
        ("2", {"kv_cache_memory_bytes": 4096}, 4096),
        ("2", {"num_kv_blocks": 40}, None),
    ],
)
def test_vllm_cpu_kvcache_space_sizes_a_cpu_cache(
    tiny_model_path, monkeypatch, env: str, kwargs: dict, expected: int | None
) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", env)
    args = EngineArgs(tiny_model_path(LLAMA), device="cpu", **kwargs)
    assert args.create_engine_config().cache_config.kv_cache_memory_bytes == expected


@pytest.mark.parametrize("env", ["x", "-1", "inf"])
def test_a_bad_vllm_cpu_kvcache_space_is_named(tiny_model_path, monkeypatch, env: str) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", env)
    with pytest.raises(ValueError, match="VLLM_CPU_KVCACHE_SPACE"):
        EngineArgs(tiny_model_path(LLAMA), device="cpu").create_engine_config()
