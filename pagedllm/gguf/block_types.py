"""The GGUF block types pagedllm multiplies as stored, without dequantizing the weight: the
one list the GGUF quantization method (layers/quantization/gguf.py) and the kernels'
boundary (_cpu_kernels/flags.py, whose values csrc/gguf.h mirrors and the extension's load
checks) both read. Other types are dequantized at load."""

from gguf import GGMLQuantizationType as Q

NATIVE_TYPES = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K)
