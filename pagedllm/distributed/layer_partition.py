"""Which decoder layers each pipeline stage holds (vLLM's get_pp_indices).

Evenly split, with the remainder going to the stages just before the last (the last one
also holds the norm and the LM head): 5 layers over 2 stages are (0, 3), (3, 5).
PAGEDLLM_PP_LAYER_PARTITION, a comma-separated count per stage (vLLM's
VLLM_PP_LAYER_PARTITION), overrides the split: "2,3" gives (0, 2), (2, 5).
"""

import os

PARTITION_ENV = "PAGEDLLM_PP_LAYER_PARTITION"


def layer_partition(num_hidden_layers: int, pp_size: int) -> list[int]:
    """The number of layers of each stage."""
    override = os.environ.get(PARTITION_ENV)
    if override:
        try:
            partitions = [int(n) for n in override.split(",")]
        except ValueError:
            raise ValueError(
                f"{PARTITION_ENV}={override!r} is not a comma-separated list of ints"
            ) from None
        if len(partitions) != pp_size or sum(partitions) != num_hidden_layers:
            raise ValueError(
                f"{PARTITION_ENV}={override!r} must give {pp_size} layer counts (one per stage) "
                f"that add up to the model's {num_hidden_layers} layers"
            )
        if min(partitions) < 1:
            raise ValueError(f"{PARTITION_ENV}={override!r}: every stage needs a layer")
        return partitions
    if num_hidden_layers < pp_size:
        raise ValueError(
            f"pipeline_parallel_size {pp_size} is more than the model's {num_hidden_layers} "
            "layers; every stage needs a layer"
        )
    partitions = [num_hidden_layers // pp_size] * pp_size
    for i in range(2, num_hidden_layers % pp_size + 2):
        partitions[-i] += 1
    return partitions


def get_pp_indices(num_hidden_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    """[start, end) of the layers stage `pp_rank` holds."""
    partitions = layer_partition(num_hidden_layers, pp_size)
    start = sum(partitions[:pp_rank])
    return start, start + partitions[pp_rank]
