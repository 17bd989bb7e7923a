"""Same request, same answer: a greedy request's tokens and logprobs are the same bits however
it is served. Reference: the request alone on a cold engine. Compared, bit for bit, with the
request hitting the prefix cache (its whole blocks, or the blocks of another request sharing
part of its prompt), batched with 1, 7 and 30 other requests, prefilled in chunks of 16 and
64 tokens, and preempted and recomputed; for the default model as shipped (Q4_1 GGUF), the
same weights dequantized (float32), in bfloat16 where the CPU multiplies it natively,
quantized at load to int8, and in float32 on torch's kernels alone (no pagedllm._C, as on a
GPU) with batch_invariant=True. The server's streamed and plain answers:
tests/entrypoints/openai/test_batch_invariance.py."""

import random
from collections.abc import Iterator

import pytest

from pagedllm import LLM, SamplingParams, _cpu_kernels
from pagedllm.batch_invariant import set_batch_invariant
from pagedllm.benchmarks.hf_folder import write_hf_folder
from pagedllm.config import ModelConfig, default_model_path
from pagedllm.core.sequence import Sequence
from pagedllm.cpu_features import native_bf16_matmul
from pagedllm.engine.tokenizer import get_tokenizer

BLOCK = 16
PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined movable metal type, oil-based ink and a wooden screw press. Within "
    "decades, presses spread across Europe; books became cheaper, literacy rose, and ideas "
    "moved faster than ever before. Printers in Venice, Lyon and Antwerp competed on price "
    "and accuracy, scholars corrected each other's editions, and tables of data could be "
    "copied without the errors of hand copying. Explain, step by step, how this changed the "
    "way scientists worked, and give three examples from astronomy, anatomy and botany:"
)
PARAMS = SamplingParams(temperature=0, max_tokens=12, logprobs=5, ignore_eos=True)
ENGINE = dict(max_model_len=1024, num_kv_blocks=640, seed=0)

Answer = tuple[list[int], list]


@pytest.fixture(scope="module")
def float_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The default model's weights dequantized into a float32 HF folder (bf16 and int8 load
    it)."""
    folder = str(tmp_path_factory.mktemp("smollm2") / "model")
    write_hf_folder(default_model_path(), folder)
    return folder


MODELS = ("gguf", "dequantized", "bf16", "int8", "torch")


@pytest.fixture(scope="module", params=MODELS)
def model(request: pytest.FixtureRequest, float_folder: str) -> Iterator[dict]:
    """The engine arguments of one way to run the default model; "torch" runs it in float32
    without pagedllm._C (torch's kernels, as on a GPU) in batch-invariant mode."""
    if request.param == "torch":
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_cpu_kernels, "_C", None)
            yield {"model": float_folder, "dtype": "float32", "batch_invariant": True}
        set_batch_invariant(False)
        return
    yield _kernel_model(request.param, float_folder)


def _kernel_model(name: str, float_folder: str) -> dict:
    if name == "gguf":
        return {"model": default_model_path()}
    if name == "dequantized":
        return {"model": default_model_path(), "quantization": "none"}
    if name == "bf16":
        if native_bf16_matmul() is None:
            pytest.skip("this CPU has no native bf16 matmul")
        return {"model": float_folder, "dtype": "bfloat16"}
    return {"model": float_folder, "quantization": "int8"}


def _answers(llm: LLM, prompts: list) -> list[Answer]:
    outputs = llm.generate(prompts, PARAMS, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outputs]


@pytest.fixture(scope="module")
def prompts() -> dict[str, list]:
    """The request's prompt at two lengths, a whole number of blocks and not, as token ids
    (every way to run the model shares its tokenizer); and 30 others of 20 to 300 random
    tokens."""
    tokenizer = get_tokenizer(ModelConfig.create(default_model_path()))
    ids = tokenizer.encode(PROMPT)
    assert len(ids) > 6 * BLOCK + 3
    rng = random.Random(0)
    others = [[rng.randrange(100, 40000) for _ in range(rng.randint(20, 300))] for _ in range(30)]
    return {"whole": ids[: 6 * BLOCK], "partial": ids[: 6 * BLOCK + 3], "others": others}


def _request(ids: list[int]) -> dict:
    return {"prompt_token_ids": ids}


@pytest.fixture(scope="module")
def cold(model: dict, prompts: dict) -> dict[str, Answer]:
    """The references: each prompt alone on a cold engine without a prefix cache."""
    llm = LLM(**model, **ENGINE, enable_prefix_caching=False)
    return {key: _answers(llm, [_request(prompts[key])])[0] for key in ("whole", "partial")}


@pytest.mark.parametrize("key", ["whole", "partial"])
def test_a_prefix_cache_hit_gives_the_cold_answer(
    model: dict, prompts: dict, cold: dict, key: str
) -> None:
    """The same request again hits the cache: all its blocks but the token it recomputes
    (whole), or all but its last partial block (partial)."""
    llm = LLM(**model, **ENGINE)
    first = _answers(llm, [_request(prompts[key])])[0]
    again = _answers(llm, [_request(prompts[key])])[0]
    assert first == cold[key]
    assert again == cold[key]


def test_blocks_cached_by_another_request_give_the_cold_answer(
    model: dict, prompts: dict, cold: dict
) -> None:
    """Another prompt sharing the first 3 blocks and 5 tokens of the request fills the cache;
    the request then reuses those 3 blocks and computes the rest."""
    llm = LLM(**model, **ENGINE)
    shared = prompts["partial"][: 3 * BLOCK + 5] + prompts["others"][0][:40]
    _answers(llm, [_request(shared)])
    assert _answers(llm, [_request(prompts["partial"])])[0] == cold["partial"]


@pytest.fixture(scope="module")
def uncached(model: dict) -> LLM:
    return LLM(**model, **ENGINE, enable_prefix_caching=False)


@pytest.mark.parametrize("others", [1, 7, 30])
def test_batched_with_other_requests_gives_the_cold_answer(
    uncached: LLM, prompts: dict, cold: dict, others: int
) -> None:
    """The request in the middle of a batch of others, prefilled and decoded with them."""
    batch = [_request(p) for p in prompts["others"][:others]]
    batch.insert(others // 2, _request(prompts["partial"]))
    assert _answers(uncached, batch)[others // 2] == cold["partial"]


@pytest.mark.parametrize("chunk", [16, 64])
def test_prefill_in_chunks_gives_the_cold_answer(
    model: dict, prompts: dict, cold: dict, chunk: int
) -> None:
    """max_num_batched_tokens = chunk: the prompt prefilled a chunk at a time, alone and
    beside 7 others."""
    llm = LLM(**model, **ENGINE, enable_prefix_caching=False, max_num_batched_tokens=chunk)
    assert _answers(llm, [_request(prompts["partial"])])[0] == cold["partial"]
    batch = [_request(p) for p in prompts["others"][:7]] + [_request(prompts["partial"])]
    assert _answers(llm, batch)[-1] == cold["partial"]


def test_preemption_and_recompute_give_the_cold_answer(
    model: dict, prompts: dict, cold: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two requests of 200 prompt tokens and 40 generated, then the request, in a cache of
    34 blocks (13 + 13 + 7, one spare): when both others need a new block, the newest
    running request, ours, is preempted after a few tokens, and later recomputed (prompt
    and tokens so far) and finished."""
    engine = {**ENGINE, "num_kv_blocks": 34, "max_model_len": 512}
    llm = LLM(**model, **engine, enable_prefix_caching=False)
    scheduler = llm.llm_engine.scheduler
    preempted: list[tuple[int, int]] = []
    preempt = scheduler._preempt

    def record(seq: Sequence) -> None:
        preempted.append((seq.num_prompt_tokens, seq.num_output_tokens))
        preempt(seq)

    monkeypatch.setattr(scheduler, "_preempt", record)
    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    others = [_request(p[:200]) for p in prompts["others"] if len(p) >= 200][:2]
    batch = [*others, _request(prompts["partial"])]
    outputs = llm.generate(batch, [long, long, PARAMS], use_tqdm=False)
    assert [n for n, generated in preempted if generated > 0] == [len(prompts["partial"])]
    answer = outputs[-1].outputs[0]
    assert (answer.token_ids, answer.logprobs) == cold["partial"]
