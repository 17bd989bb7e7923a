"""Linear layers, sharded for tensor parallelism as in Megatron-LM and vLLM.

Each layer's quant method (layers/quantization) owns its weight: a float [out, in] matrix
applied as x @ W^T (UnquantizedLinearMethod), or rows of quantized blocks. The layers own the
tensor-parallel split: ColumnParallel splits the output dimension, RowParallel the input
dimension, and their weight loaders cut each rank's rows or columns (whole blocks) from the
checkpoint tensor.
"""

import torch
from torch import nn

from pagedllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from pagedllm.layers.inference_module import InferenceModule
from pagedllm.layers.parameter import block_of, copy_weight, new_parameter, shard_of
from pagedllm.layers.quantization.base_config import (
    LayerKind,
    LinearMethodBase,
    QuantizationConfig,
)
from pagedllm.layers.quantization.unquantized import UnquantizedLinearMethod


def divide(numerator: int, denominator: int, what: str = "size") -> int:
    if numerator % denominator != 0:
        raise ValueError(
            f"{what} {numerator} is not divisible by tensor parallel size {denominator}"
        )
    return numerator // denominator


class LinearBase(InferenceModule):
    """y = x W^T + b with W of shape [output_size, input_size] as held by this rank.

    output_partition_sizes are the rows of the checkpoint matrices fused in W (q, k, v),
    this rank's share of each; the quant method may store each differently.
    """

    quant_kind = LayerKind.LINEAR

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        output_partition_sizes: list[int] | None = None,
    ) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.input_size = input_size
        self.output_size = output_size
        self.prefix = prefix
        self.params_dtype = torch.get_default_dtype()
        method = quant_config.get_quant_method(self, prefix) if quant_config else None
        self.quant_method: LinearMethodBase = method or UnquantizedLinearMethod()
        self.quant_method.create_weights(
            self,
            input_size,
            output_partition_sizes or [output_size],
            input_size,
            output_size,
            self.params_dtype,
            weight_loader=self.weight_loader,
        )
        self.bias = new_parameter((output_size,), self.weight_loader) if bias else None
        # LoRA adapters' weights for this layer (lora/layers.py LoRASlots), when the engine
        # serves them: its add_to(y, x) adds each row's adapter delta to the output.
        self.lora = None

    def rows(self, param: nn.Parameter, offset: int, size: int) -> torch.Tensor:
        """Output rows [offset, offset + size) of the weight or the bias."""
        if param is self.bias:
            return param.data.narrow(0, offset, size)
        return self.quant_method.weight_rows(param, offset, size)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        copy_weight(self.rows(param, 0, self.output_size), loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.quant_method.apply(self, x, self.bias)
        return y if self.lora is None else self.lora.add_to(y, x)

    def extra_repr(self) -> str:
        method = type(self.quant_method).__name__
        return (
            f"in={self.input_size}, out={self.output_size}, bias={self.bias is not None}, "
            f"quant_method={method}"
        )


class ReplicatedLinear(LinearBase):
    """Every rank holds the whole matrix (e.g. a MoE router)."""


class ColumnParallelLinear(LinearBase):
    """Output rows [r*O/P, (r+1)*O/P) on rank r; output gathered only if asked."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        gather_output: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        output_partition_sizes: list[int] | None = None,
    ) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        size = divide(output_size, tp_size, "output size")
        super().__init__(input_size, size, bias, quant_config, prefix, output_partition_sizes)
        self.gather_output = gather_output

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        size = self.output_size
        shard = shard_of(loaded_weight, 0, self.tp_rank, size, self.tp_size)
        copy_weight(self.rows(param, 0, size), shard)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return tensor_model_parallel_all_gather(y) if self.gather_output else y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel matrices fused along the output (gate_proj + up_proj).

    Each sub-matrix is sharded on its own, so rank r holds [gate_r; up_r].
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        self.output_sizes = output_sizes
        tp_size = get_tensor_model_parallel_world_size()
        self.shard_sizes = [divide(s, tp_size, "output size") for s in output_sizes]
        super().__init__(
            input_size, sum(output_sizes), bias, False, quant_config, prefix, self.shard_sizes
        )

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"shard_id {shard_id!r} must be in [0, {len(self.output_sizes)})")
        sizes = self.shard_sizes
        offset, size = sum(sizes[:shard_id]), sizes[shard_id]
        shard = shard_of(loaded_weight, 0, self.tp_rank, size, self.tp_size)
        copy_weight(self.rows(param, offset, size), shard, f"shard {shard_id}")


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections fused into one matrix, split by heads.

    Query heads are split across ranks; kv heads too when there are at least as many as
    ranks, otherwise each kv head is replicated on tp_size / num_kv_heads ranks.
    """

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int | None = None,
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        total_num_kv_heads = total_num_kv_heads or total_num_heads
        self.head_size = head_size
        self.num_heads = divide(total_num_heads, tp_size, "number of attention heads")
        if total_num_kv_heads >= tp_size:
            self.num_kv_heads = divide(total_num_kv_heads, tp_size, "number of kv heads")
            self.num_kv_replicas = 1
        else:
            if tp_size % total_num_kv_heads != 0:
                raise ValueError(
                    f"tensor parallel size {tp_size} is not a multiple of the number of kv "
                    f"heads {total_num_kv_heads}"
                )
            self.num_kv_heads = 1
            self.num_kv_replicas = tp_size // total_num_kv_heads
        q_size, kv_size = self.num_heads * head_size, self.num_kv_heads * head_size
        output_size = (q_size + 2 * kv_size) * tp_size
        sizes = [q_size, kv_size, kv_size]
        super().__init__(hidden_size, output_size, bias, False, quant_config, prefix, sizes)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        q_size = self.num_heads * self.head_size
        kv_size = self.num_kv_heads * self.head_size
        kv_rank = self.tp_rank // self.num_kv_replicas
        kv_shards = self.tp_size // self.num_kv_replicas
        layout = {"q": (0, q_size, self.tp_rank, self.tp_size)}
        layout["k"] = (q_size, kv_size, kv_rank, kv_shards)
        layout["v"] = (q_size + kv_size, kv_size, kv_rank, kv_shards)
        if shard_id not in layout:
            raise ValueError(f"shard_id {shard_id!r} must be one of 'q', 'k', 'v'")
        offset, size, rank, num_shards = layout[shard_id]
        shard = shard_of(loaded_weight, 0, rank, size, num_shards)
        copy_weight(self.rows(param, offset, size), shard, f"{shard_id}_proj")


class RowParallelLinear(LinearBase):
    """Input columns [r*I/P, (r+1)*I/P) on rank r; partial outputs summed by all-reduce.

    The bias is added once, after the reduce.
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        reduce_results: bool = True,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        size = divide(input_size, tp_size, "input size")
        super().__init__(size, output_size, bias, quant_config, prefix)
        self.reduce_results = reduce_results

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        if param is self.bias:
            copy_weight(param, loaded_weight, "bias")
            return
        size, block = self.input_size, block_of(param)
        shard = shard_of(loaded_weight, 1, self.tp_rank, size, self.tp_size, block)
        copy_weight(self.rows(param, 0, self.output_size), shard)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0 alone adds the bias, so the sum over ranks holds it once."""
        bias = self.bias if self.tp_rank == 0 else None
        y = self.quant_method.apply(self, x, bias)
        if self.lora is not None:
            y = self.lora.add_to(y, x)
        return tensor_model_parallel_all_reduce(y) if self.reduce_results else y
