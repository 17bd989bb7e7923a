"""Which checkpoint tensors a rank reads: the name filter the loader gives the weight
iterator, so that tensors another rank holds are skipped before they are read (or, from a
GGUF file, dequantized).

Two kinds belong elsewhere: the layers of another pipeline stage (pipeline.py's
PPMissingLayers), and, under expert parallelism, the experts of another rank (each
FusedMoE holds the run `local_experts`). A checkpoint names each expert's matrices apart,
`<module>.{e}.gate_proj.weight`, and so does gguf/tensor_names.py for a GGUF file's stacked
experts, reading only the rows of the experts kept. Without this each of N ranks would read
every expert and keep 1/N of them.
"""

from collections.abc import Callable

from torch import nn

from pagedllm.layers.fused_moe import FusedMoE, checkpoint_expert
from pagedllm.models.pipeline import weight_filter


def expert_filter(model: nn.Module) -> Callable[[str], bool]:
    """Whether a checkpoint tensor is not another expert-parallel rank's expert."""
    held = {
        name: module.local_experts
        for name, module in model.named_modules()
        if isinstance(module, FusedMoE) and module.ep_size > 1
    }

    def keep(name: str) -> bool:
        expert = checkpoint_expert(name) if held else None
        return expert is None or expert[0] not in held or expert[1] in held[expert[0]]

    return keep


def rank_weight_filter(model: nn.Module) -> Callable[[str], bool]:
    """Whether this rank reads a checkpoint tensor: its pipeline stage's, and its experts'."""
    stage, experts = weight_filter(model), expert_filter(model)
    return lambda name: stage(name) and experts(name)
