"""LoRA adapters end to end (lora/, the scheduler's max_loras, step_plan's chunk adapters,
the model runner's slots). Reference: peft's PeftModel on transformers' float32 model, run
greedily prompt by prompt: the same tokens and each token's logprob within 1e-4, for every
adapter of a batch that mixes adapters and the base model. And the engine's own rule: a
request's logprobs do not depend on its batch, the prefix cache or prefill chunks."""

import asyncio
import os
import shutil
import threading

import peft
import pytest
import torch
import transformers

from pagedllm import LLM, SamplingParams
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.executor.cpu_graph import CpuGraphRunner
from pagedllm.lora.request import LoRARequest
from tests.conftest import Generation
from tests.hf_reference import hf_generate
from tests.models.tiny_models import save_tiny_gemma3_multimodal, save_tiny_mistral3

ENGINE = dict(skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=256)
ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def adapters(tiny_model_path, tmp_path_factory):
    """(model name, adapter index) -> (folder, PeftModel): adapter 0 on every projection
    at rank 8, adapter 1 on q and v at rank 4 with alpha_pattern, adapter 2 rank 2
    use_rslora on o and down; each with random A and B (init_lora_weights=False). On
    qwen3-moe, each on the attention's projections only; on starcoder2, c_fc and c_proj
    stand for its MLP's projections."""
    specs = [
        dict(r=8, lora_alpha=16, target_modules=ALL_TARGETS),
        dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], alpha_pattern={"v_proj": 2}),
        dict(r=2, lora_alpha=4, target_modules=["o_proj", "down_proj"], use_rslora=True),
    ]
    made = {}

    def get(name: str, index: int) -> tuple[str, torch.nn.Module]:
        if (name, index) not in made:
            torch.manual_seed(100 + index)
            base = transformers.AutoModelForCausalLM.from_pretrained(
                tiny_model_path(name), dtype=torch.float32
            )
            spec = dict(specs[index])
            if name == "qwen3-moe":  # peft targets its experts' parameters, served by none
                spec["target_modules"] = ["q_proj", "k_proj", "v_proj", "o_proj"]
            if name == "starcoder2":
                mlp = {"gate_proj": "c_fc", "up_proj": "c_fc", "down_proj": "c_proj"}
                spec["target_modules"] = sorted({mlp.get(m, m) for m in spec["target_modules"]})
            config = peft.LoraConfig(init_lora_weights=False, **spec)
            model = peft.get_peft_model(base, config).eval()
            folder = str(tmp_path_factory.mktemp(f"{name}-lora{index}"))
            model.save_pretrained(folder)
            made[name, index] = folder, model
        return made[name, index]

    return get


def peft_greedy(model: torch.nn.Module, prompt: list[int]) -> Generation:
    with torch.no_grad():
        out = hf_generate(model, prompt, MAX_TOKENS, output_logits=True)
    tokens = out.sequences[0, len(prompt) :].tolist()
    logprobs = [lg[0].log_softmax(-1)[t].item() for lg, t in zip(out.logits, tokens)]
    return Generation(tokens, logprobs)


def greedy(n: int = 1) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0, n=n)


def prompts_of(lengths: list[int], seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 320, (n,), generator=gen).tolist() for n in lengths]


def as_token_prompts(prompts: list[list[int]]) -> list[dict]:
    return [{"prompt_token_ids": p} for p in prompts]


def logprobs_of(output) -> list[float]:  # noqa: ANN001 - a RequestOutput
    completion = output.outputs[0]
    return [lp[t].logprob for lp, t in zip(completion.logprobs, completion.token_ids)]


@pytest.mark.parametrize(
    "name", ["llama-gqa-llama3", "qwen2", "qwen3", "qwen3-moe", "glm4", "starcoder2"]
)
def test_a_batch_mixing_adapters_gives_each_peft_models_greedy(
    name, tiny_model_path, hf_model, adapters
) -> None:
    """Base rows and two adapters' rows in the same steps (max_loras=2), each as its own
    PeftModel (qwen2: biased q/k/v, tied embeddings; qwen3: q/k norms; qwen3-moe: its
    attention, since PEFT adapts its MLPs as expert parameters, which pagedllm refuses;
    glm4: the attention and down_proj, beside its fused gate_up_proj; starcoder2: c_fc and
    c_proj)."""
    llm = LLM(tiny_model_path(name), enable_lora=True, max_loras=2, max_lora_rank=8, **ENGINE)
    loras = [
        None,
        LoRARequest("all", 1, adapters(name, 0)[0]),
        LoRARequest("qv", 2, adapters(name, 1)[0]),
    ]
    models = [hf_model(name), adapters(name, 0)[1], adapters(name, 1)[1]]
    prompts = prompts_of([1, 9, 40])
    batch = [(p, lora, model) for p in prompts for lora, model in zip(loras, models)]
    outputs = llm.generate(
        as_token_prompts([p for p, _, _ in batch]),
        greedy(),
        use_tqdm=False,
        lora_request=[lora for _, lora, _ in batch],
    )
    for output, (prompt, _, model) in zip(outputs, batch, strict=True):
        peft_greedy(model, prompt).assert_matches(output.outputs[0])


def test_an_adapters_answer_does_not_depend_on_its_batch_the_cache_or_chunks(
    tiny_model_path, adapters
) -> None:
    """One LoRA request's logprobs, bit for bit: alone; beside base and other-adapter rows;
    again with its prompt in the prefix cache; and with its prefill in 16-token chunks."""
    name = "llama-gqa-llama3"
    path = tiny_model_path(name)
    lora = LoRARequest("all", 1, adapters(name, 0)[0])
    other = LoRARequest("rs", 3, adapters(name, 2)[0])
    (prompt,) = prompts_of([70], seed=5)
    llm = LLM(path, enable_lora=True, max_loras=2, max_lora_rank=8, **ENGINE)
    (alone,) = llm.generate(as_token_prompts([prompt]), greedy(), False, lora_request=lora)
    crowd = as_token_prompts([prompt[:30], prompt, prompt[:50] + [7] * 9])
    batch = llm.generate(crowd, greedy(), False, lora_request=[None, lora, other])
    (cached,) = llm.generate(as_token_prompts([prompt]), greedy(), False, lora_request=lora)
    assert cached.num_cached_tokens > 0
    chunked_llm = LLM(path, enable_lora=True, max_lora_rank=8, max_num_batched_tokens=16, **ENGINE)
    (chunked,) = chunked_llm.generate(
        as_token_prompts([prompt]), greedy(), False, lora_request=lora
    )
    for output in (batch[1], cached, chunked):
        assert output.outputs[0].token_ids == alone.outputs[0].token_ids
        assert logprobs_of(output) == logprobs_of(alone)


def test_the_prefix_cache_keeps_each_adapters_blocks_to_itself(tiny_model_path, adapters) -> None:
    """The same prompt under the base model, adapter 1, then adapter 1 again: only the
    last reads cached blocks (KV an adapter computed is that adapter's), and it still
    gives the adapter's tokens."""
    name = "llama-gqa-llama3"
    llm = LLM(tiny_model_path(name), enable_lora=True, max_lora_rank=8, **ENGINE)
    lora = LoRARequest("all", 1, adapters(name, 0)[0])
    (prompt,) = prompts_of([48], seed=2)
    runs = []
    for request in (None, lora, lora):
        (out,) = llm.generate(as_token_prompts([prompt]), greedy(), False, lora_request=request)
        runs.append(out)
    assert [r.num_cached_tokens for r in runs[:2]] == [0, 0]
    assert runs[2].num_cached_tokens == 32
    peft_greedy(adapters(name, 0)[1], prompt).assert_matches(runs[2].outputs[0])


def test_more_adapters_than_slots_take_turns(tiny_model_path, hf_model, adapters) -> None:
    """Three adapters and base rows with max_loras=1 and max_cpu_loras=1: the scheduler
    runs one adapter's requests at a time (never two in a step), the slot and the host
    cache reload as they change, and each request still gets its PeftModel's tokens."""
    name = "llama-gqa-llama3"
    llm = LLM(
        tiny_model_path(name),
        enable_lora=True,
        max_loras=1,
        max_cpu_loras=1,
        max_lora_rank=8,
        **ENGINE,
    )
    engine = llm.llm_engine
    seen, schedule = [], engine.scheduler.schedule

    def recording():  # noqa: ANN202
        out = schedule()
        seen.append({s.seq.lora_key for s in out.scheduled} - {None})
        return out

    engine.scheduler.schedule = recording
    loras = [LoRARequest(f"a{i}", i + 1, adapters(name, i)[0]) for i in range(3)]
    models = [adapters(name, i)[1] for i in range(3)]
    prompts = prompts_of([5, 12, 20, 8, 30, 3])
    order = [0, 1, None, 2, 0, 1]
    outputs = llm.generate(
        as_token_prompts(prompts),
        greedy(),
        False,
        lora_request=[None if i is None else loras[i] for i in order],
    )
    assert max(len(s) for s in seen) == 1
    for output, prompt, i in zip(outputs, prompts, order, strict=True):
        model = hf_model(name) if i is None else models[i]
        peft_greedy(model, prompt).assert_matches(output.outputs[0])


def test_forked_completions_and_speculation_keep_the_adapter(tiny_model_path, adapters) -> None:
    """n=2 (the second completion forks at the first token) and n-gram speculative
    decoding (verification rows) run with the request's adapter: the PeftModel's tokens."""
    name = "llama-gqa-llama3"
    path = tiny_model_path(name)
    lora = LoRARequest("all", 1, adapters(name, 0)[0])
    prompt = [5, 9, 13, 17, 21] * 6
    expected = peft_greedy(adapters(name, 0)[1], prompt)
    llm = LLM(path, enable_lora=True, max_lora_rank=8, **ENGINE)
    (out,) = llm.generate(as_token_prompts([prompt]), greedy(n=2), False, lora_request=lora)
    for completion in out.outputs:
        expected.assert_matches(completion)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2}
    llm = LLM(path, enable_lora=True, max_lora_rank=8, speculative_config=spec, **ENGINE)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    (out,) = llm.generate(as_token_prompts([prompt]), params, False, lora_request=lora)
    assert out.outputs[0].token_ids == expected.token_ids


def test_tensor_parallel_ranks_share_each_adapter(tiny_model_path, adapters) -> None:
    """TP=2 (gloo): each rank holds its shard of the adapter's A or B, as of the base
    weight (q/k/v and gate/up by output rows, o and down by input columns summed by the
    all-reduce): the PeftModel's tokens, logprobs within 1e-4."""
    name = "llama-gqa4"
    lora = LoRARequest("all", 1, adapters(name, 0)[0])
    prompts = prompts_of([6, 33])
    with LLM(
        tiny_model_path(name), enable_lora=True, max_lora_rank=8, tensor_parallel_size=2, **ENGINE
    ) as llm:
        outputs = llm.generate(as_token_prompts(prompts), greedy(), False, lora_request=lora)
    for output, prompt in zip(outputs, prompts, strict=True):
        peft_greedy(adapters(name, 0)[1], prompt).assert_matches(output.outputs[0])


def test_beam_search_runs_each_prompt_with_its_adapter(tiny_model_path, adapters) -> None:
    """LLM.beam_search with one adapter per prompt: each prompt's beams are those of a
    search run on its adapter alone."""
    from pagedllm import BeamSearchParams

    name = "llama-gqa-llama3"
    llm = LLM(tiny_model_path(name), enable_lora=True, max_lora_rank=8, max_loras=2, **ENGINE)
    loras = [LoRARequest("all", 1, adapters(name, 0)[0]), None]
    prompts = as_token_prompts(prompts_of([4, 7], seed=9))
    params = BeamSearchParams(beam_width=2, max_tokens=4)
    together = llm.beam_search(prompts, params, lora_request=loras)
    for prompt, lora, output in zip(prompts, loras, together, strict=True):
        (alone,) = llm.beam_search([prompt], params, lora_request=lora)
        assert [b.tokens for b in output.sequences] == [b.tokens for b in alone.sequences]


def test_async_llm_adds_lists_and_removes_adapters(tiny_model_path, adapters) -> None:
    """AsyncLLM's add_lora / list_loras / remove_lora (vLLM's), a bad adapter's ValueError
    from add_lora, and a generate with an adapter giving the PeftModel's tokens."""
    name = "llama-gqa-llama3"
    folder, model = adapters(name, 0)
    args = EngineArgs(tiny_model_path(name), enable_lora=True, max_lora_rank=8, **ENGINE)
    lora = LoRARequest("all", 1, folder)

    async def run() -> None:
        engine = AsyncLLM(LLMEngine.from_engine_args(args))
        engine.start()
        try:
            assert await engine.add_lora(lora)
            assert await engine.list_loras() == {1}
            with pytest.raises(ValueError, match="is neither a PEFT adapter folder"):
                await engine.add_lora(LoRARequest("bad", 2, os.path.join(folder, "nope")))
            async for out in engine.generate(
                {"prompt_token_ids": [5, 6, 7]}, greedy(), "r", lora_request=lora
            ):
                last = out
            peft_greedy(model, [5, 6, 7]).assert_matches(last.outputs[0])
            assert await engine.remove_lora(1)
            assert not await engine.remove_lora(1)
            assert await engine.list_loras() == set()
        finally:
            await engine.shutdown()

    asyncio.run(run())


def test_stats_name_the_adapters_running_and_waiting(tiny_model_path, adapters) -> None:
    """EngineStats.lora (vLLM's lora_requests_info): with max_loras=1, the first adapter's
    request runs and the second's waits; none without enable_lora."""
    name = "llama-gqa-llama3"
    path = tiny_model_path(name)
    engine = LLMEngine.from_engine_args(
        EngineArgs(path, enable_lora=True, max_loras=1, max_lora_rank=8, **ENGINE)
    )
    for i in range(2):
        lora = LoRARequest(f"a{i}", i + 1, adapters(name, i)[0])
        engine.add_request(f"r{i}", {"prompt_token_ids": [5, 6]}, greedy(), lora_request=lora)
    engine.step()
    stats = engine.get_stats().lora
    assert (stats.max_lora, stats.running, stats.waiting) == (1, ["a0"], ["a1"])
    assert LLMEngine.from_engine_args(EngineArgs(path, **ENGINE)).get_stats().lora is None


def test_data_parallel_replicas_run_each_requests_adapter(tiny_model_path, adapters) -> None:
    """data_parallel_size=2: the parent checks an adapter (a bad one fails at once), the
    replicas run it (the PeftModel's tokens), and remove_lora reaches them all."""
    name = "llama-gqa-llama3"
    folder, model = adapters(name, 0)
    lora = LoRARequest("all", 1, folder)
    prompts = prompts_of([4, 9, 15, 6], seed=4)
    with LLM(
        tiny_model_path(name), enable_lora=True, max_lora_rank=8, data_parallel_size=2, **ENGINE
    ) as llm:
        outputs = llm.generate(as_token_prompts(prompts), greedy(), False, lora_request=lora)
        with pytest.raises(ValueError, match="is neither a PEFT adapter folder"):
            llm.generate(
                as_token_prompts(prompts[:1]),
                greedy(),
                False,
                lora_request=LoRARequest("bad", 2, folder + "-missing"),
            )
        engine = llm.llm_engine
        assert engine.list_loras() == {1}
        assert engine.remove_lora(1) and engine.list_loras() == set()
        (again,) = llm.generate(as_token_prompts(prompts[:1]), greedy(), False, lora_request=lora)
    for output, prompt in zip([*outputs, again], [*prompts, prompts[0]], strict=True):
        peft_greedy(model, prompt).assert_matches(output.outputs[0])


def test_pipeline_stages_apply_their_layers_adapter_weights(tiny_model_path, adapters) -> None:
    """pipeline_parallel_size=2: each stage's slots hold its own layers' share of the
    adapter: the PeftModel's tokens and logprobs."""
    name = "llama-gqa-llama3"
    folder, model = adapters(name, 0)
    lora = LoRARequest("all", 1, folder)
    prompts = prompts_of([5, 21], seed=6)
    with LLM(
        tiny_model_path(name), enable_lora=True, max_lora_rank=8, pipeline_parallel_size=2, **ENGINE
    ) as llm:
        outputs = llm.generate(as_token_prompts(prompts), greedy(), False, lora_request=lora)
    for output, prompt in zip(outputs, prompts, strict=True):
        peft_greedy(model, prompt).assert_matches(output.outputs[0])


def test_decodes_replay_captured_steps_with_and_without_adapter_rows(
    tiny_model_path, adapters, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With enable_lora, decode steps without adapter rows replay the CPU graphs captured
    with no adapter applied, and give the tokens and logprobs of an engine without LoRA;
    decode steps with adapter rows (two adapters and base rows mixed) replay the captures
    made with every slot, and give those of an eager engine (enforce_eager); bit for bit,
    and PeftModel's within 1e-4."""
    name = "llama-gqa-llama3"
    path = tiny_model_path(name)
    calls = []
    run = CpuGraphRunner.run

    def spy(self: CpuGraphRunner, batch, placeholders=None):  # noqa: ANN001, ANN202
        hidden = run(self, batch, placeholders)
        calls.append(hidden is not None)
        return hidden

    monkeypatch.setattr(CpuGraphRunner, "run", spy)
    prompts = as_token_prompts(prompts_of([6, 11]))
    plain = LLM(path, **ENGINE).generate(prompts, greedy(), False)
    llm = LLM(path, enable_lora=True, max_lora_rank=8, max_loras=2, **ENGINE)
    calls.clear()
    base = llm.generate(prompts, greedy(), False)
    assert sum(calls) >= MAX_TOKENS - 1
    for got, expected in zip(base, plain, strict=True):
        assert logprobs_of(got) == logprobs_of(expected)
    (folder_a, model_a), (folder_b, model_b) = adapters(name, 0), adapters(name, 1)
    loras = [LoRARequest("a", 1, folder_a), None, LoRARequest("b", 2, folder_b)]
    mixed = as_token_prompts(prompts_of([6, 11, 4], seed=9))
    calls.clear()
    replayed = llm.generate(mixed, greedy(), False, lora_request=loras)
    assert sum(calls) >= MAX_TOKENS - 1
    assert llm.llm_engine.executor.runner.graph_runner.graphs[(4, (0, 1))] is not None
    eager = LLM(path, enable_lora=True, max_lora_rank=8, max_loras=2, enforce_eager=True, **ENGINE)
    expected = eager.generate(mixed, greedy(), False, lora_request=loras)
    for got, want in zip(replayed, expected, strict=True):
        assert logprobs_of(got) == logprobs_of(want)
    for output, prompt, model in zip(replayed, mixed, [model_a, None, model_b], strict=True):
        if model is not None:
            peft_greedy(model, prompt["prompt_token_ids"]).assert_matches(output.outputs[0])


def test_two_engines_stepping_in_two_threads_keep_their_own_rows(tiny_model_path, adapters) -> None:
    """Two LoRA engines in one process, generating at once from two threads (as two
    AsyncLLMs): each gives its answers alone, the step's LoRA mapping and forward context
    being per thread."""
    name = "llama-gqa-llama3"
    folder, model = adapters(name, 0)
    lora = LoRARequest("a", 1, folder)
    engines = [
        LLM(tiny_model_path(name), enable_lora=True, max_lora_rank=8, **ENGINE) for _ in "ab"
    ]
    prompts = [
        as_token_prompts(prompts_of([7, 9, 11], seed=1)),
        as_token_prompts(prompts_of([5, 13], seed=2)),
    ]
    loras = [lora, None]
    alone = [
        llm.generate(p, greedy(), False, lora_request=r)
        for llm, p, r in zip(engines, prompts, loras)
    ]
    together: dict[int, list] = {}

    def run(i: int) -> None:
        together[i] = [
            engines[i].generate(prompts[i], greedy(), False, lora_request=loras[i])
            for _ in range(3)
        ]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(2):
        for outputs in together[i]:
            assert [logprobs_of(o) for o in outputs] == [logprobs_of(o) for o in alone[i]]
    for output, prompt in zip(alone[0], prompts[0], strict=True):
        peft_greedy(model, prompt["prompt_token_ids"]).assert_matches(output.outputs[0])


def test_an_adapter_folder_gone_fails_only_the_requests_naming_it_again(
    tiny_model_path, adapters, tmp_path
) -> None:
    """A request holds its adapter's weights from when it was added: deleting the folder
    meanwhile changes nothing for it, nor for the others in flight. Once the engine holds
    the weights no more (max_cpu_loras=1, another adapter named since), a new request
    naming the adapter fails alone, when it is added."""
    name = "llama-gqa-llama3"
    folder = shutil.copytree(adapters(name, 0)[0], f"{tmp_path}/victim")
    engine = LLMEngine.from_engine_args(
        EngineArgs(
            tiny_model_path(name), enable_lora=True, max_lora_rank=8, max_cpu_loras=1, **ENGINE
        )
    )
    victim = LoRARequest("victim", 1, folder)
    engine.add_request("held", {"prompt_token_ids": [5, 6, 7]}, greedy(), lora_request=victim)
    engine.add_request("base", {"prompt_token_ids": [8, 9]}, greedy())
    engine.step()
    engine.add_lora(LoRARequest("other", 2, adapters(name, 1)[0]))  # the victim's weights go
    shutil.rmtree(folder)
    with pytest.raises(ValueError, match="is neither a PEFT adapter folder"):
        engine.add_request("late", {"prompt_token_ids": [5, 6, 7]}, greedy(), lora_request=victim)
    outputs = {}
    while engine.has_unfinished_requests():
        outputs.update({o.request_id: o for o in engine.step() if o.finished})
    assert set(outputs) == {"held", "base"}
    peft_greedy(adapters(name, 0)[1], [5, 6, 7]).assert_matches(outputs["held"].outputs[0])


def test_a_folder_whose_files_changed_is_another_adapter(
    tiny_model_path, adapters, tmp_path
) -> None:
    """Unload an adapter, replace its folder's files, load it again under the same name,
    id and path: its requests read none of the old weights' prefix-cache blocks and get the
    new weights' tokens."""
    name = "llama-gqa-llama3"
    folder = shutil.copytree(adapters(name, 0)[0], f"{tmp_path}/changing")
    llm = LLM(tiny_model_path(name), enable_lora=True, max_lora_rank=8, **ENGINE)
    lora = LoRARequest("changing", 1, folder)
    (prompt,) = prompts_of([40], seed=8)
    (old,) = llm.generate(as_token_prompts([prompt]), greedy(), False, lora_request=lora)
    assert llm.llm_engine.remove_lora(1)
    shutil.rmtree(folder)
    shutil.copytree(adapters(name, 1)[0], folder)
    (new,) = llm.generate(as_token_prompts([prompt]), greedy(), False, lora_request=lora)
    assert new.num_cached_tokens == 0
    peft_greedy(adapters(name, 0)[1], prompt).assert_matches(old.outputs[0])
    peft_greedy(adapters(name, 1)[1], prompt).assert_matches(new.outputs[0])


def test_a_refused_request_registers_no_adapter(tiny_model_path, adapters) -> None:
    """A request refused for its prompt or its params (after its adapter was read) leaves
    the adapter's id and name free, as add_request promises to change nothing."""
    name = "llama-gqa-llama3"
    folder = adapters(name, 0)[0]
    engine = LLMEngine.from_engine_args(
        EngineArgs(tiny_model_path(name), enable_lora=True, max_lora_rank=8, **ENGINE)
    )
    too_long = {"prompt_token_ids": [5] * 300}
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request("r", too_long, greedy(), lora_request=LoRARequest("z", 50, folder))
    with pytest.raises(ValueError, match="logprobs"):
        params = SamplingParams(max_tokens=2, logprobs=100)
        engine.add_request(
            "r", {"prompt_token_ids": [5]}, params, lora_request=LoRARequest("z", 60, folder)
        )
    assert engine.list_loras() == set()
    engine.add_request(
        "r", {"prompt_token_ids": [5]}, greedy(), lora_request=LoRARequest("z", 51, folder)
    )
    assert engine.list_loras() == {51}


def test_data_parallel_replicas_run_the_weights_add_lora_read(
    tiny_model_path, adapters, tmp_path
) -> None:
    """add_lora loads the adapter on every replica: files changed or removed afterwards
    change nothing, on whichever replica a request runs (as on one engine)."""
    name = "llama-gqa-llama3"
    folder = shutil.copytree(adapters(name, 0)[0], f"{tmp_path}/moving")
    lora = LoRARequest("moving", 1, folder)
    prompts = prompts_of([4, 9, 15, 6], seed=10)
    with LLM(
        tiny_model_path(name), enable_lora=True, max_lora_rank=8, data_parallel_size=2, **ENGINE
    ) as llm:
        assert llm.llm_engine.add_lora(lora)
        shutil.rmtree(folder)
        outputs = llm.generate(as_token_prompts(prompts), greedy(), False, lora_request=lora)
    for output, prompt in zip(outputs, prompts, strict=True):
        peft_greedy(adapters(name, 0)[1], prompt).assert_matches(output.outputs[0])


MULTIMODAL = {
    "gemma3": save_tiny_gemma3_multimodal,
    "mistral3": lambda folder: save_tiny_mistral3(folder, "ministral3"),
}
"""Image-and-text checkpoints whose language model runs alone, by a writer of a tiny one."""


@pytest.mark.parametrize("family", list(MULTIMODAL))
def test_adapters_of_a_multimodal_model_give_peft_models_greedy(family: str, tmp_path) -> None:
    """Adapters trained on Gemma3ForConditionalGeneration or Mistral3ForConditionalGeneration
    (modules under `language_model`, one also on the vision tower's q_proj, down_proj and
    fc1 where it has them, and a copy of it named as on transformers' older layout) on its
    language model run text-only: each request gets its PeftModel's tokens on the same text."""
    model_folder = str(tmp_path / f"{family}-mm")
    MULTIMODAL[family](model_folder)
    specs = {
        "language": dict(r=4, lora_alpha=8, target_modules=r".*language_model.*_proj"),
        "with-vision": dict(r=8, lora_alpha=16, target_modules=["q_proj", "down_proj", "fc1"]),
    }
    folders, models = {}, {}
    for name, spec in specs.items():
        base = transformers.AutoModelForImageTextToText.from_pretrained(
            model_folder, dtype=torch.float32
        )
        torch.manual_seed(len(folders))
        models[name] = peft.get_peft_model(base, peft.LoraConfig(init_lora_weights=False, **spec))
        folders[name] = str(tmp_path / name)
        models[name].eval().save_pretrained(folders[name])
    folders["older"] = str(tmp_path / "older")
    shutil.copytree(folders["with-vision"], folders["older"])
    _rename_to_older_layout(os.path.join(folders["older"], "adapter_model.safetensors"))
    models["older"] = models["with-vision"]
    llm = LLM(model_folder, enable_lora=True, max_loras=3, max_lora_rank=8, **ENGINE)
    loras = [LoRARequest(name, i + 1, folder) for i, (name, folder) in enumerate(folders.items())]
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, 300, (n,), generator=gen).tolist() for n in (4, 17, 30)
    ]  # no image tokens (300 ..)
    batch = [(p, lora) for p in prompts for lora in loras]
    outputs = llm.generate(
        as_token_prompts([p for p, _ in batch]),
        greedy(),
        use_tqdm=False,
        lora_request=[lora for _, lora in batch],
    )
    for output, (prompt, lora) in zip(outputs, batch, strict=True):
        peft_greedy(models[lora.lora_name], prompt).assert_matches(output.outputs[0])


def _rename_to_older_layout(file: str) -> None:
    """PEFT's names `...model.language_model.` / `...model.vision_tower.` as on transformers'
    older image-and-text models: `...language_model.model.` / `...vision_tower.`."""
    from safetensors.torch import load_file, save_file

    renames = {
        "base_model.model.model.language_model.": "base_model.model.language_model.model.",
        "base_model.model.model.vision_tower.": "base_model.model.vision_tower.",
    }
    tensors = {}
    for name, tensor in load_file(file).items():
        old = next(p for p in renames if name.startswith(p))
        tensors[renames[old] + name[len(old) :]] = tensor
    save_file(tensors, file)
