"""StarCoder 2 GGUF files (llama.cpp's `starcoder2`), as convert_hf_to_gguf.py's StarCoder2Model
writes them: the checkpoint's tensors under gguf's names, no q/k rows permuted (llama.cpp
rotates starcoder2's heads NEOX-style, halves, as transformers does).

What llama.cpp reads differently from the RMSNorm families: the norms are LayerNorms with
weight and bias, their epsilon `attention.layer_norm_epsilon` (the checkpoint's
norm_epsilon, required); the MLP is ungated, `ffn_up` (c_fc), GELU, `ffn_down` (c_proj),
where llama.cpp's GELU is the tanh approximation, the checkpoints' `gelu_pytorch_tanh`; every
linear layer has a bias in the released models (`use_bias`, told by attn_q's). The converter
writes no sliding window and llama.cpp applies none, so neither does the config.
"""

from typing import Any

from pagedllm.gguf.metadata import positive_float
from pagedllm.gguf.reader import GGUFFile

STARCODER2 = "starcoder2"


def starcoder2_kwargs(gguf: GGUFFile, arch: str) -> dict[str, Any]:
    return {
        "norm_epsilon": positive_float(gguf, f"{arch}.attention.layer_norm_epsilon"),
        "use_bias": "blk.0.attn_q.bias" in gguf.tensors,
        "hidden_act": "gelu_pytorch_tanh",
        "sliding_window": None,
    }
