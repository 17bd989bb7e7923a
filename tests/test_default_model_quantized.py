"""The default model run as stored (Q4_1 linears, Q8_0 embedding and tied LM head): it
answers like the float32 model, holds no more memory than the file's tensors, and its
perplexity on a fixed public-domain text stays within 1% of the dequantized model's."""

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.benchmarks.perplexity import DEFAULT_TEXT, perplexity
from pagedllm.config import default_model_path
from pagedllm.gguf.reader import read_gguf
from pagedllm.layers.quantization.gguf import GGUFEmbeddingMethod, GGUFLinearMethod
from pagedllm.model_loader.loader import weight_bytes

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(num_kv_blocks=160, max_model_len=2560)


def test_layers_run_natively(llm: LLM) -> None:
    model = llm.llm_engine.executor.runner.model
    assert isinstance(model.model.layers[0].mlp.down_proj.quant_method, GGUFLinearMethod)
    assert isinstance(model.lm_head.quant_method, GGUFEmbeddingMethod)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_greedy_says_paris(llm: LLM) -> None:
    (output,) = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert "Paris" in output.outputs[0].text


def test_resident_weights_are_the_files_tensor_bytes(llm: LLM) -> None:
    """Parameters and buffers (norms, the rotary cache) within 5% of the file's tensors."""
    file_bytes = sum(info.nbytes for info in read_gguf(default_model_path()).tensors.values())
    resident = weight_bytes(llm.llm_engine.executor.runner.model)
    assert file_bytes <= resident <= 1.05 * file_bytes


def test_perplexity_within_one_percent_of_the_dequantized_model(llm: LLM) -> None:
    """The fixture (tests/fixtures/README.md) is >= 2,000 tokens, scored in windows of 1024.
    Native runs quantize activations to 8 bits per block of 32; the dequantized model does
    the same float32 arithmetic as transformers on the file's weights."""
    with open(DEFAULT_TEXT, encoding="utf-8") as f:
        token_ids = llm.get_tokenizer().encode(f.read())
    assert len(token_ids) >= 2000
    native = perplexity(llm, token_ids, window=1024)
    with LLM(
        quantization="none", dtype="float32", num_kv_blocks=160, max_model_len=2560
    ) as dequantized:
        reference = perplexity(dequantized, token_ids, window=1024)
    assert 1 < reference < 100, "a model this size should predict English text"
    assert abs(native / reference - 1) <= 0.01, (native, reference)
