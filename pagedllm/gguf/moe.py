"""MoE GGUF files of llama.cpp's `qwen2moe`, `olmoe` and `granitemoe`: the config fields of
transformers' Qwen2MoeConfig, OlmoeConfig and GraniteMoeConfig that the file states in
llama.cpp's terms, and the tensors llama.cpp requires of them.

convert_hf_to_gguf.py stacks each layer's experts into `ffn_{gate,up,down}_exps` [E, out, in]
(Granite MoE's fused `input_linear` cut into gate then up rows) and names the router
`ffn_gate_inp`. llama.cpp routes all three by a softmax over every expert's logit; what
differs (src/models/*.cpp):

- qwen2moe (Qwen1.5-MoE, Qwen2-57B-A14B): the top-k weights are not renormalized, whatever
  the checkpoint's `norm_topk_prob`; every layer is sparse; a shared expert
  (`ffn_{gate,up,down}_shexp`, of `expert_shared_feed_forward_length`, llama.cpp's default
  `feed_forward_length`) runs on every token, scaled by sigmoid(`ffn_gate_inp_shexp` . x),
  a gate the converter writes squeezed to [hidden] (or [1, hidden] where it did not squeeze);
  the routed experts are of `expert_feed_forward_length` (default `feed_forward_length` /
  `expert_used_count`). q/k/v biases where the file holds them.
- olmoe (OLMoE-1B-7B): OLMo 2's q/k norms over the whole projections, experts of
  `feed_forward_length`, top-k weights not renormalized; llama.cpp does not clip q/k/v.
- granitemoe (Granite 3.x 1B-A400M, 3B-A800M): Granite's four scales and q/k rows permuted as
  llama's, experts of `feed_forward_length`, top-k weights renormalized. A file with a
  shared expert (`expert_shared_feed_forward_length`: Granite MoE Shared) is refused, as
  pagedllm has no such model.
"""

from typing import Any

from pagedllm.gguf.metadata import integer
from pagedllm.gguf.reader import GGUFFile

QWEN2MOE = "qwen2moe"
OLMOE = "olmoe"
GRANITEMOE = "granitemoe"
SHARED_EXPERT_GATE = "ffn_gate_inp_shexp"
_EXPERT_TENSORS = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
_SHARED_EXPERT_TENSORS = (SHARED_EXPERT_GATE, "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")


def experts_used(gguf: GGUFFile, arch: str, experts: int) -> int:
    used = integer(gguf, f"{arch}.expert_used_count")
    if used > experts:
        raise ValueError(
            f"{gguf.path}: {arch}.expert_used_count {used} exceeds {arch}.expert_count {experts}"
        )
    return used


def moe_kwargs(gguf: GGUFFile, arch: str, num_layers: int) -> dict[str, Any]:
    """The config fields of a qwen2moe, olmoe or granitemoe file beyond the common ones;
    ValueError for a missing expert count or size, or a layer without its experts' tensors."""
    experts = integer(gguf, f"{arch}.expert_count")
    used = experts_used(gguf, arch, experts)
    ffn = integer(gguf, f"{arch}.feed_forward_length")
    if arch == QWEN2MOE:
        _require_layer_tensors(gguf, num_layers, _EXPERT_TENSORS + _SHARED_EXPERT_TENSORS)
        return {
            "num_experts": experts,
            "num_experts_per_tok": used,
            "moe_intermediate_size": _size(gguf, f"{arch}.expert_feed_forward_length", ffn // used),
            "shared_expert_intermediate_size": _size(
                gguf, f"{arch}.expert_shared_feed_forward_length", ffn
            ),
            "norm_topk_prob": False,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "qkv_bias": "blk.0.attn_q.bias" in gguf.tensors,
        }
    _require_layer_tensors(gguf, num_layers, _EXPERT_TENSORS)
    if arch == OLMOE:
        return {
            "num_experts": experts,
            "num_experts_per_tok": used,
            "intermediate_size": ffn,
            "norm_topk_prob": False,
            "clip_qkv": None,
        }
    if _size(gguf, f"{arch}.expert_shared_feed_forward_length", 0):
        raise ValueError(
            f"{gguf.path}: {arch}.expert_shared_feed_forward_length states a shared expert "
            "(Granite MoE Shared), which pagedllm does not run"
        )
    return {"num_local_experts": experts, "num_experts_per_tok": used, "intermediate_size": ffn}


def _size(gguf: GGUFFile, key: str, default: int) -> int:
    """A size llama.cpp reads as optional, 0 meaning its default."""
    return integer(gguf, key, 0, minimum=0) or default


def _require_layer_tensors(gguf: GGUFFile, num_layers: int, names: tuple[str, ...]) -> None:
    for layer in range(num_layers):
        for name in names:
            if f"blk.{layer}.{name}.weight" not in gguf.tensors:
                raise ValueError(
                    f"{gguf.path} has no tensor blk.{layer}.{name}.weight, which every layer "
                    "of its architecture needs"
                )
