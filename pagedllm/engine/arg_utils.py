"""EngineArgs: the flat options a user passes (LLM(...), the CLI), turned into EngineConfig."""

import argparse
import os
from dataclasses import MISSING, dataclass, field, fields

import torch

from pagedllm.batch_invariant import env_batch_invariant
from pagedllm.config import (
    MAX_LORA_RANKS,
    SCHEDULING_POLICIES,
    CacheConfig,
    EngineConfig,
    LoRAConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    default_async_scheduling,
    env_attention_backend,
    env_cpu_kv_cache_bytes,
    resolve_device,
)
from pagedllm.engine.arg_checks import HUB_FIELDS, checked_value, refuse_hub_value
from pagedllm.engine.batch_defaults import UsageContext, default_batch_limits
from pagedllm.layers.attention_backends.selector import check_attn_backend
from pagedllm.pooler_config import PoolerConfig
from pagedllm.sampling_params import DEFAULT_MAX_N
from pagedllm.utils.argparse_utils import human_readable_int

# Not command-line flags: processors are Python objects, on the command line --seed is the
# sampling seed of the request, and the entry point says who builds the engine.
_NOT_CLI = ("logits_processors", "seed", "usage_context")
# vLLM's short forms
_SHORT_FLAGS = {
    "tensor_parallel_size": ("-tp",),
    "pipeline_parallel_size": ("-pp",),
    "data_parallel_size": ("-dp",),
}

# Flags with a fixed set of values: argparse's choices and a line of --help for each
_FLAG_OPTIONS = {
    "max_lora_rank": {
        "choices": MAX_LORA_RANKS,
        "help": "the largest rank of a LoRA adapter (vLLM's values; each slot is this wide)",
    },
    "scheduling_policy": {
        "choices": SCHEDULING_POLICIES,
        "help": "the order waiting requests run in: fcfs by arrival, priority by each "
        "request's priority (lower first), then arrival",
    },
}


@dataclass
class EngineArgs:
    """Every field is checked against its annotation when the args are made (arg_checks.py):
    a wrong type is a TypeError naming the argument. A path given as an os.PathLike is kept
    as its str."""

    model: str | os.PathLike | None = None
    # A folder or .gguf file whose tokenizer (and chat template) replaces the model's
    tokenizer: str | os.PathLike | None = None
    tokenizer_mode: str = "auto"
    # vLLM's; pagedllm never runs a checkpoint's own code, so True changes nothing
    trust_remote_code: bool = False
    # vLLM's hub arguments: None only (nothing is downloaded)
    revision: str | None = None
    code_revision: str | None = None
    tokenizer_revision: str | None = None
    download_dir: str | os.PathLike | None = None
    dtype: str | torch.dtype = "auto"
    quantization: str | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_expert_parallel: bool = False
    distributed_executor_backend: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    data_parallel_size: int = 1
    # Multi-node data parallelism (vLLM's names): this node runs replicas
    # data_parallel_start_rank .. + data_parallel_size_local - 1 (default: all of them);
    # rank 0's node serves and listens for the others at address:rpc_port.
    data_parallel_size_local: int | None = None
    data_parallel_start_rank: int = 0
    data_parallel_address: str = "127.0.0.1"
    data_parallel_rpc_port: int = 29550
    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_memory_bytes: int | None = None
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    # None: by the device and usage_context (engine/batch_defaults.py, vLLM's defaults)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    async_scheduling: bool | None = None  # None: where it is supported (default_async_scheduling)
    # vLLM's: "fcfs" or "priority" (requests' `priority`, lower first; config.py)
    scheduling_policy: str = "fcfs"
    kv_cache_dtype: str = "auto"
    seed: int = 0
    skip_tokenizer_init: bool = False
    device: str = "auto"
    max_logprobs: int = 20
    max_n: int = DEFAULT_MAX_N
    logprobs_mode: str = "raw_logprobs"
    logits_processors: tuple | list = ()
    enforce_eager: bool = False
    batch_invariant: bool = field(default_factory=env_batch_invariant)
    attention_backend: str | None = field(default_factory=env_attention_backend)
    runner: str = "auto"
    pooler_config: PoolerConfig | dict | str | None = None
    load_format: str = "auto"
    hf_overrides: dict | str | None = None
    usage_context: UsageContext = UsageContext.LLM_CLASS
    # vLLM's: where the default sampling params come from ("auto": the model's
    # generation_config.json, "vllm": SamplingParams' own, or a folder), and fields over them
    generation_config: str = "auto"
    override_generation_config: dict | str | None = None
    # vLLM's: no periodic stats lines (engine/stat_logger.py; the offline LLM sets it
    # unless told otherwise, as vLLM's)
    disable_log_stats: bool = False
    # vLLM's, accepted: the all-reduce is torch.distributed's (no custom one to turn off)
    disable_custom_all_reduce: bool = False
    # vLLM's CPU swap space in GiB, accepted: a preempted request's KV is recomputed, never
    # swapped (as vLLM v1 does)
    swap_space: float = 4
    # vLLM's: n-gram speculative decoding, a dict or JSON ({"method": "ngram",
    # "num_speculative_tokens": 4, ...}; config.SpeculativeConfig); None: off
    speculative_config: SpeculativeConfig | dict | str | None = None
    # vLLM's LoRA options (config.LoRAConfig, docs/lora.md): requests may name a PEFT
    # adapter (LoRARequest), up to max_loras of them in one step
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            setattr(self, f.name, checked_value(f, getattr(self, f.name)))
        for name in HUB_FIELDS:
            refuse_hub_value(name, getattr(self, name))
        if self.swap_space < 0:
            raise ValueError(f"swap_space must be >= 0 (GiB), got {self.swap_space}")
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)

    def create_engine_config(self) -> EngineConfig:
        device = resolve_device(self.device)
        model_config = ModelConfig.create(
            model=self.model,
            tokenizer=self.tokenizer,
            tokenizer_mode=self.tokenizer_mode,
            generation_config=self.generation_config,
            override_generation_config=self.override_generation_config,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            device=device,
            quantization=self.quantization,
            runner=self.runner,
            pooler_config=self.pooler_config,
            load_format=self.load_format,
            hf_overrides=self.hf_overrides,
        )
        # A pooled request keeps no KV past its prefill, and MEAN and CLS pooling need
        # every prompt token's hidden state: pooling models skip the prefix cache.
        pooling = model_config.runner_type == "pooling"
        parallel_config = ParallelConfig(
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            enable_expert_parallel=self.enable_expert_parallel,
            distributed_executor_backend=self.distributed_executor_backend,
            nnodes=self.nnodes,
            node_rank=self.node_rank,
            master_addr=self.master_addr,
            master_port=self.master_port,
            data_parallel_size=self.data_parallel_size,
        )
        model_config.verify_with_parallel_config(parallel_config)
        config = EngineConfig(
            model_config=model_config,
            cache_config=CacheConfig(
                block_size=self.block_size,
                num_kv_blocks=self.num_kv_blocks,
                kv_cache_memory_bytes=self._kv_cache_memory_bytes(device),
                gpu_memory_utilization=self.gpu_memory_utilization,
                enable_prefix_caching=self.enable_prefix_caching and not pooling,
                cache_dtype=self.kv_cache_dtype,
            ),
            scheduler_config=self._scheduler_config(device, model_config, parallel_config),
            parallel_config=parallel_config,
            device=device,
            seed=self.seed,
            skip_tokenizer_init=self.skip_tokenizer_init,
            max_logprobs=self.max_logprobs,
            max_n=self.max_n,
            logprobs_mode=self.logprobs_mode,
            logits_processors=tuple(self.logits_processors or ()),
            enforce_eager=self.enforce_eager,
            batch_invariant=self.batch_invariant,
            attention_backend=self.attention_backend,
            speculative_config=self.speculative_config,
            lora_config=self._lora_config(),
        )
        if config.attention_backend is not None:
            kv_cache_dtype = config.cache_config.kv_dtype(model_config.dtype)
            check_attn_backend(config.attention_backend, device, model_config.dtype, kv_cache_dtype)
        return config

    def _lora_config(self) -> LoRAConfig | None:
        if not self.enable_lora:
            return None
        return LoRAConfig(self.max_loras, self.max_lora_rank, self.max_cpu_loras)

    def _kv_cache_memory_bytes(self, device: str) -> int | None:
        """kv_cache_memory_bytes, else on a CPU vLLM's VLLM_CPU_KVCACHE_SPACE (GiB), unless
        num_kv_blocks sizes the cache."""
        if self.kv_cache_memory_bytes is not None or self.num_kv_blocks is not None:
            return self.kv_cache_memory_bytes
        if torch.device(device).type != "cpu":
            return None
        return env_cpu_kv_cache_bytes()

    def _scheduler_config(
        self, device: str, model_config: ModelConfig, parallel_config: ParallelConfig
    ) -> SchedulerConfig:
        """The step's limits, each the user's or vLLM's default for the device and entry
        point; without chunked prefill a default step holds the longest prompt, as vLLM's."""
        tokens, seqs = default_batch_limits(device, self.usage_context)
        if self.max_num_batched_tokens is not None:
            tokens = self.max_num_batched_tokens
        elif not self.enable_chunked_prefill:
            tokens = max(tokens, model_config.max_model_len)
        async_scheduling = self.async_scheduling
        if async_scheduling is None:
            # Speculative decoding verifies drafts of tokens known on the host: not with it.
            async_scheduling = self.speculative_config is None and default_async_scheduling(
                device, parallel_config, model_config.runner_type
            )
        return SchedulerConfig(
            max_num_seqs=seqs if self.max_num_seqs is None else self.max_num_seqs,
            max_num_batched_tokens=tokens,
            enable_chunked_prefill=self.enable_chunked_prefill,
            async_scheduling=async_scheduling,
            policy=self.scheduling_policy,
        )

    @staticmethod
    def add_cli_args(
        parser: argparse.ArgumentParser, with_model: bool = True
    ) -> argparse.ArgumentParser:
        """--max-model-len style flags for every option (model as --model if asked); the
        parser, as vLLM's returns it (`parser = EngineArgs.add_cli_args(parser)`)."""
        group = parser.add_argument_group("engine")
        for f in fields(EngineArgs):
            if f.name in _NOT_CLI or (f.name == "model" and not with_model):
                continue
            flag = "--" + f.name.replace("_", "-")
            default = f.default if f.default_factory is MISSING else f.default_factory()
            if f.type in ("bool", bool, bool | None):
                group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
            else:
                kind = (
                    human_readable_int
                    if "int" in str(f.type)
                    else float
                    if "float" in str(f.type)
                    else str
                )
                short = _SHORT_FLAGS.get(f.name, ())
                options = _FLAG_OPTIONS.get(f.name, {})
                group.add_argument(flag, *short, type=kind, default=default, **options)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        names = [f.name for f in fields(cls) if f.name not in _NOT_CLI and hasattr(args, f.name)]
        return cls(**{name: getattr(args, name) for name in names})
