"""The default model (SmolLM2-135M-Instruct GGUF) through LLM, dequantized to float32 at load:
its logits equal transformers' Llama on transformers' own GGUF load to 1e-3, it knows that
Paris is the capital of France, and streaming, chat and stop strings give the text a user
expects. (test_default_model_quantized.py runs the file as stored.)"""

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.initialization import no_init_weights
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from pagedllm import LLM, SamplingParams
from pagedllm.config import default_model_path
from pagedllm.core.sequence import Sequence
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.executor.batch import SeqChunk
from pagedllm.executor.model_runner import StepInput
from pagedllm.gguf.hf_config import load_gguf_config
from pagedllm.sampling_params import RequestOutputKind

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(
        dtype="float32", quantization="none", device="cpu", num_kv_blocks=48, max_model_len=512
    )


def greedy(max_tokens: int = 8, **kwargs: object) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kwargs)


def transformers_gguf_model() -> torch.nn.Module:
    """transformers' LlamaForCausalLM on the tensors transformers dequantizes from the GGUF
    (what `from_pretrained(gguf_file=...)` does, which needs `accelerate`)."""
    path = default_model_path()
    config = load_gguf_config(path)
    with torch.device("meta"):
        names_model = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(
        path, return_tensors=True, model_to_load=names_model, torch_dtype=torch.float32
    )["tensors"]
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    assert missing == ["lm_head.weight"] and not unexpected  # tied to the embedding
    model.tie_weights()
    return model.eval()


def paged_logits(engine: LLMEngine, token_ids: list[int]) -> torch.Tensor:
    """Logits [T, V] at every prompt position from one paged prefill in the engine's cache."""
    seq = Sequence(-1, token_ids, engine.block_manager.block_size)
    seq.skip_prefix_cache = True
    engine.block_manager.allocate(seq)
    try:
        step = StepInput([SeqChunk(token_ids, 0, seq.block_table)], [], [0], [0])
        _, prompt_logits = engine.executor.runner.forward(step)
    finally:
        engine.block_manager.free(seq)
    return prompt_logits[0]


def test_logits_match_transformers_gguf_load(llm: LLM) -> None:
    ids = llm.get_tokenizer().encode("Steps: 1. Mix flour, 2 eggs and milk; 2. Bake at 180°C.")
    ours = paged_logits(llm.llm_engine, ids)
    with torch.no_grad():
        ref = transformers_gguf_model()(torch.tensor([ids])).logits[0]
    assert ref.std() > 1.0, "reference logits too flat to test anything"
    torch.testing.assert_close(ours, ref, atol=1e-3, rtol=0)


def test_greedy_says_paris(llm: LLM) -> None:
    (output,) = llm.generate(PROMPT, greedy(), use_tqdm=False)
    assert output.prompt == PROMPT
    assert output.prompt_token_ids == llm.get_tokenizer().encode(PROMPT)
    assert "Paris" in output.outputs[0].text
    assert output.outputs[0].finish_reason == "length"


def test_chat_answers_and_stops_at_end_of_turn(llm: LLM) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    (output,) = llm.chat(messages, greedy(48), use_tqdm=False)
    completion = output.outputs[0]
    assert "Paris" in completion.text
    assert completion.finish_reason == "stop"
    assert completion.token_ids[-1] == llm.get_tokenizer().convert_tokens_to_ids("<|im_end|>")
    assert "<|im_end|>" not in completion.text


@pytest.mark.parametrize(
    "stop, include, text",
    [
        (["."], False, " Paris"),
        (["."], True, " Paris."),
        (["\n\nThe answer"], False, " Paris."),  # spans several tokens
        (["\n", ".\n"], False, " Paris"),  # the earliest of two in one new token
    ],
)
def test_stop_strings(llm: LLM, stop: list[str], include: bool, text: str) -> None:
    params = greedy(16, stop=stop, include_stop_str_in_output=include)
    completion = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert completion.text == text
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop[-1])


def stream(engine: LLMEngine, prompt: str, params: SamplingParams) -> list:
    engine.add_request("stream", prompt, params)
    deltas = []
    while engine.has_unfinished_requests():
        deltas += [out.outputs[0] for out in engine.step()]
    return deltas


@pytest.mark.parametrize("stop", [[], ["answer is"]])
def test_streamed_deltas_add_up_to_the_final_output(llm: LLM, stop: list[str]) -> None:
    final = llm.generate(PROMPT, greedy(16, stop=stop), use_tqdm=False)[0].outputs[0]
    params = greedy(16, stop=stop, output_kind=RequestOutputKind.DELTA)
    deltas = stream(llm.llm_engine, PROMPT, params)
    assert len([d for d in deltas if d.text]) > 3
    assert "".join(d.text for d in deltas) == final.text
    assert sum((d.token_ids for d in deltas), []) == final.token_ids
    assert [d.finish_reason for d in deltas] == [None] * (len(deltas) - 1) + [final.finish_reason]
