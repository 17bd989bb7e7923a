"""LLM (pagedllm/llm.py) end to end on tiny random checkpoints: greedy generations equal
transformers' `generate(do_sample=False)` run prompt by prompt, bad input raises ValueError
and leaves the engine serving, the progress bar obeys use_tqdm, and chat gives the template
its tools and options."""

import json
import os
import shutil
import signal
import threading
import weakref

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from pagedllm import LLM, PoolingParams, SamplingParams, TextPrompt
from pagedllm.lora.request import LoRARequest
from pagedllm.sampling_params import StructuredOutputsParams
from tests.devices import DEVICES
from tests.embedding_models import save_byte_tokenizer
from tests.entrypoints.openai.scripted_model import save_scripted_model
from tests.reference_cycles import left_for_the_cyclic_collector

GREEDY_MODELS = ["llama-gqa-llama3", "qwen3", "qwen3-moe"]
MAX_TOKENS = 32
ENGINE_KWARGS = dict(skip_tokenizer_init=True, dtype="float32", device="cpu")
SMALL_ENGINE = dict(dtype="float32", device="cpu", num_kv_blocks=16, max_model_len=128)


def greedy_params(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)


def as_prompts(token_lists: list[list[int]]) -> list[dict]:
    return [{"prompt_token_ids": ids} for ids in token_lists]


def assert_matches_reference(outputs: list, reference: list) -> None:
    for out, ref in zip(outputs, reference, strict=True):
        ref.assert_matches(out.outputs[0])


@pytest.fixture(scope="module")
def llm_for(tiny_model_path):
    """(name, device) -> a float32 LLM on that tiny model, built once per module."""
    llms = {}

    def get(name: str, device: str = "cpu") -> LLM:
        if (name, device) not in llms:
            path = tiny_model_path(name)
            engine = {**ENGINE_KWARGS, "device": device}
            llms[name, device] = LLM(path, num_kv_blocks=64, max_model_len=256, **engine)
        return llms[name, device]

    return get


@pytest.mark.parametrize("name", ["llama-gqa-llama3", "qwen3-moe"])
def test_a_dropped_llm_is_freed_without_the_cyclic_collector(name, tiny_model_path) -> None:
    """An LLM's memory goes when its last reference does: nothing in it (weights, whose
    views share one arena, KV cache, sampler) sits in a reference cycle, which Python frees
    only on a full collection, at a time of its choosing, and nothing outside it (the rotary
    module get_rope shares between models) holds its weights; a process that builds one LLM
    after another (a test suite, a notebook) would hold several models meanwhile."""

    weights = []

    def build_and_use() -> LLM:
        path = tiny_model_path(name)
        with LLM(path, num_kv_blocks=16, max_model_len=128, **ENGINE_KWARGS) as llm:
            params = SamplingParams(n=2, seed=1, max_tokens=4, logprobs=1, ignore_eos=True)
            llm.generate(as_prompts([[5, 6, 7]]), params, use_tqdm=False)
        model = llm.llm_engine.executor.runner.model
        weights.extend(weakref.ref(p.untyped_storage()) for p in model.parameters())
        return llm

    assert left_for_the_cyclic_collector(build_and_use) == []
    assert all(w() is None for w in weights), "its weights outlived it (held from outside)"


def test_a_dropped_default_model_llm_with_structured_output_is_freed() -> None:
    """The same on the default model (a GGUF file, its tokenizer, detokenizing, a chat
    template and a grammar)."""

    def build_and_use() -> LLM:
        llm = LLM(num_kv_blocks=16, max_model_len=128)
        so = StructuredOutputsParams(choice=["yes", "no"])
        chat = [[{"role": "user", "content": "Yes or no?"}]]
        llm.chat(chat, SamplingParams(max_tokens=4, structured_outputs=so), use_tqdm=False)
        return llm

    assert left_for_the_cyclic_collector(build_and_use) == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", GREEDY_MODELS)
def test_greedy_batch_matches_transformers(
    name, device, llm_for, hf_greedy, spread_prompts
) -> None:
    """The reference is transformers on the CPU, for both devices."""
    reference = hf_greedy(name, spread_prompts, MAX_TOKENS)
    prompts = as_prompts(spread_prompts)
    outputs = llm_for(name, device).generate(prompts, greedy_params(), use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == spread_prompts
    assert all(o.finished and o.outputs[0].finish_reason == "length" for o in outputs)
    assert_matches_reference(outputs, reference)


def prompt_token_logprobs(llm: LLM, prompts: list[list[int]]) -> torch.Tensor:
    """The logprob of every prompt token after the first, all prompts concatenated."""
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0)
    outputs = llm.generate(as_prompts(prompts), params, use_tqdm=False)
    return torch.tensor(
        [
            row[t].logprob
            for out in outputs
            for row, t in zip(out.prompt_logprobs[1:], out.prompt_token_ids[1:], strict=True)
        ]
    )


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_stays_near_float32(device, llm_for, tiny_model_path, spread_prompts) -> None:
    """bf16 weights, activations and KV cache (the default dtype on CUDA): every prompt
    token's logprob within 0.1 of float32's on the same device (0.04 seen on the CPU)."""
    path = tiny_model_path("qwen3")
    reference = prompt_token_logprobs(llm_for("qwen3", device), spread_prompts)
    engine = {**ENGINE_KWARGS, "device": device, "dtype": "bfloat16"}
    with LLM(path, num_kv_blocks=64, max_model_len=256, **engine) as llm:
        model = llm.llm_engine.executor.runner.model
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        logprobs = prompt_token_logprobs(llm, spread_prompts)
    assert reference.std() > 0.1, "logprobs too flat to test anything"
    torch.testing.assert_close(logprobs, reference, atol=0.1, rtol=0)


def test_stop_token_ids_end_at_first_occurrence(llm_for, hf_greedy, spread_prompts) -> None:
    (reference,) = hf_greedy("llama-gqa-llama3", spread_prompts[5:6], MAX_TOKENS)
    stop_id = reference.token_ids[6]
    end = reference.token_ids.index(stop_id) + 1
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop_token_ids=[stop_id])
    (output,) = llm_for("llama-gqa-llama3").generate(
        as_prompts(spread_prompts[5:6]), params, use_tqdm=False
    )
    completion = output.outputs[0]
    assert completion.token_ids == reference.token_ids[:end]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop_id)


def assert_idle_and_serving(llm: LLM, hf_greedy, prompt: list[int]) -> None:
    """No request is left behind, every block is free, and a new request runs correctly."""
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.num_blocks
    engine.block_manager.check_invariants([])
    outputs = llm.generate(as_prompts([prompt]), greedy_params(8), use_tqdm=False)
    assert_matches_reference(outputs, hf_greedy("llama-gqa-llama3", [prompt], 8))


@pytest.mark.parametrize(
    "bad_prompt, message",
    [
        ({"prompt_token_ids": []}, r"empty \(0 tokens\); give at least 1"),
        ({"prompt_token_ids": [5] * 257}, r"257 tokens, more than max_model_len=256"),
        ({"prompt_token_ids": [5, 320, -1]}, r"\[320, -1\] are outside the vocabulary \[0, 320\)"),
        ({"prompt": "hello"}, "text prompts need a tokenizer"),
    ],
)
def test_bad_prompt_raises_and_engine_keeps_serving(
    bad_prompt, message, llm_for, hf_greedy, spread_prompts
) -> None:
    llm = llm_for("llama-gqa-llama3")
    good = {"prompt_token_ids": spread_prompts[3]}
    with pytest.raises(ValueError, match=message):
        llm.generate([good, bad_prompt], greedy_params(), use_tqdm=False)
    assert_idle_and_serving(llm, hf_greedy, spread_prompts[2])


def test_bad_sampling_params_count_raises(llm_for) -> None:
    llm = llm_for("llama-gqa-llama3")
    with pytest.raises(ValueError, match="got 2 sampling params for 1 prompts"):
        llm.generate([{"prompt_token_ids": [5]}], [greedy_params()] * 2, use_tqdm=False)
    with pytest.raises(TypeError, match="must be a SamplingParams or a list.*got PoolingParams"):
        llm.generate([{"prompt_token_ids": [5]}], PoolingParams(), use_tqdm=False)
    with pytest.raises(TypeError, match="must be a SamplingParams or a list.*got dict"):
        llm.generate([{"prompt_token_ids": [5]}], {"max_tokens": 2}, use_tqdm=False)
    with pytest.raises(TypeError, match="must each be a SamplingParams, got dict"):
        llm.generate([{"prompt_token_ids": [5]}], [{"max_tokens": 2}], use_tqdm=False)
    with pytest.raises(TypeError, match="prompt_token_ids"):
        llm.generate([5, 6, 7], use_tqdm=False)


def test_stop_token_id_outside_vocab_raises(llm_for, hf_greedy, spread_prompts) -> None:
    llm = llm_for("llama-gqa-llama3")
    with pytest.raises(ValueError, match=r"stop_token_ids must be token ids in \[0, 320\)"):
        llm.generate([{"prompt_token_ids": [5]}], SamplingParams(stop_token_ids=[400]))
    assert_idle_and_serving(llm, hf_greedy, spread_prompts[2])


def test_n_returns_n_completions(llm_for, spread_prompts) -> None:
    params = SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
    (output,) = llm_for("llama-gqa-llama3").generate(
        as_prompts(spread_prompts[4:5]), params, use_tqdm=False
    )
    assert [c.index for c in output.outputs] == [0, 1]
    assert [len(c.token_ids) for c in output.outputs] == [12, 12]
    assert output.outputs[0].token_ids != output.outputs[1].token_ids


def test_use_tqdm_false_prints_nothing(llm_for, spread_prompts, capsys) -> None:
    llm = llm_for("llama-gqa-llama3")
    capsys.readouterr()
    llm.generate(as_prompts(spread_prompts[:2]), greedy_params(4), use_tqdm=False)
    assert capsys.readouterr() == ("", "")
    llm.generate(as_prompts(spread_prompts[:2]), greedy_params(4), use_tqdm=True)
    assert "Processed prompts" in capsys.readouterr().err


def test_max_model_len_beyond_cache_raises(tiny_model_path) -> None:
    path = tiny_model_path("llama-gqa-llama3")
    with pytest.raises(
        ValueError, match=r"4 blocks x 16 = 64 tokens, fewer than max_model_len=256"
    ):
        LLM(path, num_kv_blocks=4, max_model_len=256, **ENGINE_KWARGS)


def copy_model(tiny_model_path, tmp_path) -> str:
    folder = str(tmp_path / "model")
    shutil.copytree(tiny_model_path("llama-gqa-llama3"), folder)
    return folder


def test_unknown_architecture_raises(tiny_model_path, tmp_path) -> None:
    folder = copy_model(tiny_model_path, tmp_path)
    config_path = os.path.join(folder, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["architectures"] = ["FooForCausalLM"]
    with open(config_path, "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError, match=r"'FooForCausalLM' is not supported.*LlamaForCausalLM"):
        LLM(folder, num_kv_blocks=32, max_model_len=256, **ENGINE_KWARGS)


def test_missing_weight_names_it(tiny_model_path, tmp_path) -> None:
    folder = copy_model(tiny_model_path, tmp_path)
    weights_path = os.path.join(folder, "model.safetensors")
    tensors = load_file(weights_path)
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, weights_path, metadata={"format": "pt"})
    with pytest.raises(
        ValueError, match=r"no weights for 1 parameters: model\.layers\.1\.mlp\.down"
    ):
        LLM(folder, num_kv_blocks=32, max_model_len=256, **ENGINE_KWARGS)


def test_chat_passes_tools_and_template_options(tmp_path) -> None:
    """LLM.chat as vLLM's: tools, chat_template_kwargs and continue_final_message reach the
    template (the scripted model's; reference: its greedy chain of words)."""
    save_scripted_model(str(tmp_path))
    llm = LLM(str(tmp_path), num_kv_blocks=16, max_model_len=64)
    params = SamplingParams(temperature=0, max_tokens=8)
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    user = [{"role": "user", "content": "Weather?"}]
    (called,) = llm.chat(user, params, use_tqdm=False, tools=tools)
    expected = llm.get_tokenizer().encode("user Weather? tools get_weather assistant")
    assert called.prompt_token_ids == expected
    kwargs = {"enable_thinking": False}
    (plain,) = llm.chat(user, params, use_tqdm=False, chat_template_kwargs=kwargs)
    assert plain.outputs[0].text.startswith("<tool_call>")  # after the closed think part
    started = [*user, {"role": "assistant", "content": "It"}]
    (continued,) = llm.chat(
        started, params, use_tqdm=False, add_generation_prompt=False, continue_final_message=True
    )
    assert continued.outputs[0].text == " is sunny"


def test_chat_reads_messages_as_openais(tmp_path) -> None:
    """As the server and vLLM: text parts joined, null content "", a call's JSON arguments
    an object for the template; a message or template it cannot take is a ValueError."""
    save_scripted_model(str(tmp_path))
    llm = LLM(str(tmp_path), num_kv_blocks=16, max_model_len=64)
    template = (
        "{% for m in messages %}{{ m.role }} {{ m.content }}"
        "{% for c in m.tool_calls or [] %}{{ c.function.name }} {{ c.function.arguments.city }}"
        "{% endfor %} {% endfor %}"
    )
    call = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "?"}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": call}],
        },
    ]
    params = SamplingParams(max_tokens=1)
    kwargs = dict(use_tqdm=False, chat_template=template, add_generation_prompt=False)
    (out,) = llm.chat(messages, params, **kwargs)
    assert out.prompt_token_ids == llm.get_tokenizer().encode(
        "user Weather\n? assistant get_weather Paris "
    )
    assert out.prompt == "user Weather\n? assistant get_weather Paris ", "vLLM's LLM.chat"
    for bad, words in [
        ([{"content": "hi"}], "needs a role"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "only text parts"),
        ([{"role": "user", "content": "hi"}], "cannot apply the chat template"),
    ]:
        with pytest.raises(ValueError, match=words):
            llm.chat(
                bad,
                params,
                use_tqdm=False,
                chat_template="{{ raise_exception('no') }}" if "apply" in words else template,
            )


@pytest.mark.parametrize("tensor_parallel_size", [1, 2])
def test_ctrl_c_ends_generate_between_steps(tiny_model_path, tensor_parallel_size: int) -> None:
    """A Ctrl-C mid-step waits for the step: cut midway, rank 0 and its workers would be out
    of step, and the next generate would hang or fail. After it, the LLM answers as before."""
    path = tiny_model_path("llama-gqa-llama3")
    llm = LLM(path, tensor_parallel_size=tensor_parallel_size, num_kv_blocks=256, **ENGINE_KWARGS)
    before = llm.generate(as_prompts([[5, 6, 7]]), greedy_params(), use_tqdm=False)
    many = as_prompts([[5 + i, 6, 7] for i in range(64)])
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    for delay in (0.2, 0.25, 0.3, 0.35, 0.4, 0.45):  # wherever in a step it lands
        threading.Timer(delay, signal.raise_signal, (signal.SIGINT,)).start()
        with pytest.raises(KeyboardInterrupt):
            llm.generate(many, long, use_tqdm=False)
        assert not llm.llm_engine.has_unfinished_requests()
        after = llm.generate(as_prompts([[5, 6, 7]]), greedy_params(), use_tqdm=False)
        assert after[0].outputs[0].token_ids == before[0].outputs[0].token_ids
    llm.close()


def test_generate_from_threads_takes_turns(llm_for, spread_prompts) -> None:
    """Calls from several threads on one LLM each get their own prompts' answers."""
    llm = llm_for("llama-gqa-llama3")
    prompts = as_prompts(spread_prompts[:6])
    expected = [
        o.outputs[0].token_ids for o in llm.generate(prompts, greedy_params(), use_tqdm=False)
    ]
    results: list[list] = []

    def run() -> None:
        outputs = llm.generate(prompts, greedy_params(), use_tqdm=False)
        results.append([o.outputs[0].token_ids for o in outputs])

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert results == [expected] * 3


def test_get_tokenizer_without_one_is_vllms_value_error(llm_for) -> None:
    """vLLM's LLM.get_tokenizer under skip_tokenizer_init: a ValueError, not None."""
    llm = llm_for("llama-gqa-llama3")
    with pytest.raises(ValueError, match="Unable to get tokenizer because skip_tokenizer_init"):
        llm.get_tokenizer()
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        llm.chat([{"role": "user", "content": "Hi"}], use_tqdm=False)


def test_a_tokenizer_folder_beside_the_model_tokenizes_its_prompts(tiny_model_path, tmp_path):
    """vLLM's `tokenizer`: the model's folder has none; text prompts are tokenized by the
    named folder's (reference: transformers' AutoTokenizer of that folder)."""
    save_byte_tokenizer(str(tmp_path))
    llm = LLM(tiny_model_path("llama-gqa-llama3"), tokenizer=tmp_path, **SMALL_ENGINE)
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path)
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    (out,) = llm.generate(TextPrompt(prompt="Hi there"), params, use_tqdm=False)
    assert out.prompt_token_ids == reference.encode("Hi there")
    assert out.outputs[0].text == reference.decode(out.outputs[0].token_ids)


def test_ctrl_c_in_the_last_step_is_not_lost(llm_for) -> None:
    """A Ctrl-C held through the call's last step still ends it with KeyboardInterrupt."""
    llm = llm_for("llama-gqa-llama3")
    step = llm.llm_engine.step

    def step_then_ctrl_c() -> list:
        outputs = step()
        signal.raise_signal(signal.SIGINT)
        return outputs

    llm.llm_engine.step = step_then_ctrl_c
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.generate(as_prompts([[5, 6]]), greedy_params(1), use_tqdm=False)
    finally:
        del llm.llm_engine.step
    assert llm.generate(as_prompts([[5, 6]]), greedy_params(1), use_tqdm=False)


def test_vllms_call_options_that_ask_for_nothing_are_accepted(llm_for) -> None:
    """vLLM wrappers pass lora_request=None, priority 0 and a content format routinely;
    a nonzero priority needs scheduling_policy="priority" (vLLM's rule), an adapter
    enable_lora."""
    llm = llm_for("llama-gqa-llama3")
    prompts = as_prompts([[5, 6]])
    (out,) = llm.generate(prompts, greedy_params(2), False, lora_request=None, priority=[0])
    assert len(out.outputs[0].token_ids) == 2
    for kwargs, error, words in [
        ({"lora_request": object()}, TypeError, "lora_request must be a LoRARequest or a list"),
        ({"lora_request": LoRARequest("a", 1, "/x")}, ValueError, "LoRA is off; start the engine"),
        ({"lora_request": [None, None]}, ValueError, "got 2 lora_requests for 1 prompts"),
        ({"priority": [1]}, ValueError, "Got priority 1 but priority scheduling is not enabled"),
        ({"priority": [0, 0]}, ValueError, "got 2 priorities for 1 prompts"),
        ({"priority": 0}, TypeError, "priority must be a list of ints, one per prompt"),
    ]:
        with pytest.raises(error, match=words):
            llm.generate(prompts, greedy_params(2), False, **kwargs)
    assert not llm.llm_engine.has_unfinished_requests()


def test_priority_scheduling_keeps_transformers_greedy(tiny_model_path, hf_greedy) -> None:
    """Under scheduling_policy="priority", with a cache small enough to preempt, each
    prompt's greedy tokens are transformers' whatever its priority; the prompts are admitted
    most urgent first (the last given here)."""
    name = "llama-gqa-llama3"
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 320, (n,), generator=gen).tolist() for n in (10, 12, 14, 8)]
    llm = LLM(
        tiny_model_path(name),
        **ENGINE_KWARGS,
        num_kv_blocks=6,
        max_model_len=64,
        scheduling_policy="priority",
    )
    outputs = llm.generate(as_prompts(prompts), greedy_params(40), False, priority=[3, 2, 1, 0])
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert_matches_reference(outputs, hf_greedy(name, prompts, 40))
    starts = [o.metrics["first_scheduled_time"] for o in outputs]
    assert sorted(starts, reverse=True) == starts


def test_chat_and_encode_take_vllms_options(tmp_path, tiny_model_path) -> None:
    save_scripted_model(str(tmp_path))
    llm = LLM(str(tmp_path), num_kv_blocks=16, max_model_len=64)
    user = [{"role": "user", "content": "Weather?"}]
    params = SamplingParams(max_tokens=1)
    assert llm.chat(user, params, use_tqdm=False, chat_template_content_format="string")
    with pytest.raises(ValueError, match="chat_template_content_format 'openai'"):
        llm.chat(user, params, use_tqdm=False, chat_template_content_format="openai")
    pooling = LLM(
        tiny_model_path("llama-gqa4"), runner="pooling", **SMALL_ENGINE, skip_tokenizer_init=True
    )
    prompt = {"prompt_token_ids": [5, 6, 7, 8]}
    (cut,) = pooling.encode(prompt, use_tqdm=False, truncate_prompt_tokens=2, pooling_task="embed")
    assert cut.prompt_token_ids == [7, 8]
    with pytest.raises(
        ValueError, match="task 'classify': this model's pooling tasks are embed, score"
    ):
        pooling.encode(prompt, use_tqdm=False, pooling_task="classify")
    (embedded,) = pooling.embed(prompt, use_tqdm=False, truncate_prompt_tokens=3)
    assert embedded.prompt_token_ids == [6, 7, 8]


def stat_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    records = caplog.records
    return [r.getMessage() for r in records if r.name == "pagedllm.engine.stat_logger"]


def test_stats_lines_only_with_disable_log_stats_false(
    llm_for, tiny_model_path, spread_prompts, monkeypatch, caplog
) -> None:
    """vLLM's LLM: no periodic stats lines by default; disable_log_stats=False logs them
    (engine/stat_logger.py) between steps, every PAGEDLLM_LOG_STATS_INTERVAL seconds."""
    monkeypatch.setenv("PAGEDLLM_LOG_STATS_INTERVAL", "0.001")
    prompts = as_prompts(spread_prompts[:3])
    with caplog.at_level("INFO", logger="pagedllm"):
        llm_for("llama-gqa-llama3").generate(prompts, greedy_params(), use_tqdm=False)
        assert stat_lines(caplog) == []
        path = tiny_model_path("llama-gqa-llama3")
        with LLM(path, disable_log_stats=False, **SMALL_ENGINE, skip_tokenizer_init=True) as llm:
            llm.generate(prompts, greedy_params(), use_tqdm=False)
    lines = stat_lines(caplog)
    assert lines and all(line.startswith("Engine 000: Avg prompt throughput: ") for line in lines)
    assert any("Running: 3 reqs" in line for line in lines), lines
