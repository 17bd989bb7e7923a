"""GGUF files run natively (quantization "gguf") against the same file dequantized at load
("none"), on tiny models that store every native type, a qkv of three types, quantized
experts and Phi-3's fused qkv and gate/up tensors.

With the torch reference ops both runs do the same float arithmetic on the same weights, so
they agree to float rounding: this checks loading (names, llama's q/k row order, fused
shards, per-type segments, experts) and the layers' use of the quant methods. With the CPU
kernels, activations are quantized to 8 bits per block of 32 (see test_cpu_kernels_gguf.py
for that bound); the logprobs then agree to a few hundredths.
"""

import pytest
import torch

from pagedllm import LLM, SamplingParams, _cpu_kernels
from pagedllm.config import ModelConfig
from pagedllm.distributed.parallel_state import override_tensor_parallel
from pagedllm.layers.quantization.gguf import (
    GGUFEmbeddingMethod,
    GGUFFusedMoEMethod,
    GGUFLinearMethod,
)
from pagedllm.model_loader.loader import build_model
from tests.devices import DEVICES
from tests.layers.quantization.quantized_gguf import write_quantized_gguf

ARCHS = ("llama", "phi3", "qwen3moe", "mixtral")
VOCAB = 64
ENGINE = dict(skip_tokenizer_init=True, num_kv_blocks=32, max_logprobs=VOCAB, dtype="float32")
PROMPT = {"prompt_token_ids": [1, 5, 9, 33, 17, 60, 2, 41, 8, 8, 23]}


@pytest.fixture(scope="module")
def quantized_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    files = {}
    for arch in ARCHS:
        path = str(tmp_path_factory.mktemp(arch) / f"{arch}.gguf")
        write_quantized_gguf(path, arch)
        files[arch] = path
    return files


def prompt_logprobs(llm: LLM) -> torch.Tensor:
    """[T - 1, VOCAB] log-probabilities of every next token at every prompt position."""
    params = SamplingParams(max_tokens=1, prompt_logprobs=VOCAB, temperature=0)
    (output,) = llm.generate(PROMPT, params, use_tqdm=False)
    rows = output.prompt_logprobs[1:]
    return torch.tensor([[row[t].logprob for t in range(VOCAB)] for row in rows])


def run(path: str, quantization: str | None, device: str = "cpu") -> torch.Tensor:
    with LLM(path, quantization=quantization, device=device, **ENGINE) as llm:
        return prompt_logprobs(llm)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ARCHS)
def test_native_equals_dequantized_with_the_reference_ops(
    arch: str, device: str, quantized_files: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference: the torch ops alone (pagedllm._C switched off); on CUDA they are the
    only ops."""
    monkeypatch.setattr(_cpu_kernels, "_C", None)
    reference = run(quantized_files[arch], "none", device)
    assert reference.std() > 0.1, "reference logprobs too flat to test anything"
    native = run(quantized_files[arch], None, device)
    torch.testing.assert_close(native, reference, atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_native_kernels_stay_near_the_dequantized_model(
    arch: str, quantized_files: dict[str, str]
) -> None:
    reference = run(quantized_files[arch], "none")
    torch.testing.assert_close(run(quantized_files[arch], "gguf"), reference, atol=0.05, rtol=0)


def test_every_layer_runs_natively_with_its_types(quantized_files: dict[str, str]) -> None:
    model = build_model(ModelConfig.create(quantized_files["qwen3moe"], "float32"), "meta")
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.qkv_proj.quant_method, GGUFLinearMethod)
    assert [s[2] for s in attn.qkv_proj.quant_method.segments] == [12, 13, 14]  # Q4_K/Q5_K/Q6_K
    assert attn.qkv_proj.weight.dtype == torch.uint8 and attn.qkv_proj.weight.dim() == 1
    assert attn.o_proj.weight.shape == (256, 256 // 32 * 18)  # Q4_0
    experts = model.model.layers[0].mlp.experts
    assert isinstance(experts.quant_method, GGUFFusedMoEMethod)
    assert experts.w13_weight.shape == (4, 512, 256 // 32 * 24)  # Q5_1
    assert experts.w2_weight.shape == (4, 256, 144)  # one Q4_K block per row
    assert isinstance(model.model.embed_tokens.quant_method, GGUFEmbeddingMethod)
    assert model.model.layers[0].mlp.gate.weight.dtype == torch.float32  # F32 router


def test_fused_checkpoint_tensors_run_natively(quantized_files: dict[str, str]) -> None:
    """Phi-3's qkv_proj (Q8_0) and gate_up_proj (Q4_1), stored fused: one type per shard."""
    model = build_model(ModelConfig.create(quantized_files["phi3"], "float32"), "meta")
    layer = model.model.layers[0]
    assert layer.self_attn.qkv_proj.quant_method.shard_types == [8, 8, 8]
    assert layer.self_attn.qkv_proj.weight.shape == (512, 256 // 32 * 34)
    assert layer.mlp.gate_up_proj.quant_method.shard_types == [3, 3]


def test_tensor_parallel_shard_that_cuts_a_block_is_named(quantized_files: dict[str, str]) -> None:
    """The experts' down projection is Q4_K over 256 columns, one block per row: split over
    2 ranks, each would hold half a block."""
    config = ModelConfig.create(quantized_files["qwen3moe"])
    with override_tensor_parallel(0, 2), pytest.raises(ValueError, match="whole Q4_K blocks"):
        build_model(config, "meta")


def test_quantization_none_dequantizes_everything(quantized_files: dict[str, str]) -> None:
    config = ModelConfig.create(quantized_files["llama"], "float32", quantization="none")
    model = build_model(config, "meta")
    assert all(p.dtype == torch.float32 for p in model.parameters())
