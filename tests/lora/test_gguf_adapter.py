"""pagedllm/lora/gguf_adapter.py: a PEFT adapter written as convert_lora_to_gguf.py writes it
(tests/lora/gguf_adapters.py) loads as its PEFT folder. References: the folder's weights as
peft_adapter.py loads them (rounded to the file's type), and peft's PeftModel on transformers'
float32 model, whose logits pagedllm's match within 1e-4 with either form of the adapter, on
a llama base (q/k rows permuted by the converter) and a qwen2 base, each as an HF folder, and
the llama one as a GGUF file too. Files that are no adapter of the served model are refused
by name."""

from collections.abc import Callable

import gguf
import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.lora.registry import LoRARegistry, make_lora_registry
from pagedllm.lora.request import LoRARequest
from tests.gguf.tiny_gguf import gguf_tensors, tiny_model, write_gguf, write_tiny
from tests.lora.gguf_adapters import F16, F32, stored, write_gguf_adapter
from tests.lora.peft_folders import peft_model, save_adapter
from tests.models.tiny_models import tiny_configs

# tiny model (tests/models/tiny_models.py) -> the TINY architecture of tests/gguf/tiny_gguf.py
BASES = {"llama-gqa4": "llama", "qwen2": "qwen2"}
LORA = dict(r=4, lora_alpha=8)
ENGINE = dict(skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=64)
PROMPT = [5, 17, 39, 3, 50, 41, 8, 27]  # within every tiny vocabulary (64, 320)
QTYPES = [F32, F16, gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.Q8_0]


def engine_args(path: str, **kwargs: object) -> EngineArgs:
    return EngineArgs(model=path, enable_lora=True, max_lora_rank=8, **ENGINE, **kwargs)


def registry_of(path: str) -> LoRARegistry:
    """The registry the engine of the model at `path` builds."""
    return make_lora_registry(engine_args(path).create_engine_config())


@pytest.fixture(scope="module")
def adapters(
    tiny_model_path: Callable[[str], str], tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., tuple[str, str]]:
    """(tiny model name, GGUF type) -> (PEFT folder, its GGUF file), one folder per model."""
    folders: dict[str, str] = {}

    def get(name: str, qtype: gguf.GGMLQuantizationType = F32) -> tuple[str, str]:
        if name not in folders:
            folders[name] = str(tmp_path_factory.mktemp(f"{name}-peft"))
            save_adapter(tiny_model_path(name), folders[name], **LORA)
        path = str(tmp_path_factory.mktemp(f"{name}-gguf") / f"adapter-{qtype.name}.gguf")
        write_gguf_adapter(folders[name], path, BASES[name], tiny_configs()[name], qtype)
        return folders[name], path

    return get


@pytest.mark.parametrize("name", list(BASES))
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda qtype: qtype.name)
def test_a_gguf_adapter_holds_its_peft_folders_weights(
    name: str, qtype: gguf.GGMLQuantizationType, tiny_model_path, adapters
) -> None:
    """Every module's (A, B * alpha / r) equals the folder's, each tensor rounded to the
    file's type (Q8_0 dequantized; llama: lora_b's q/k rows back in HF's order); F32 gives
    the same weights, hence the same key (KV blocks shared with the folder's requests)."""
    folder, path = adapters(name, qtype)
    registry = registry_of(tiny_model_path(name))
    from_folder = registry.check(LoRARequest("peft", 1, folder))
    from_file = registry.check(LoRARequest("gguf", 2, path))
    assert sorted(from_file.weights) == sorted(from_folder.weights)
    for module, (a, b) in from_folder.weights.items():
        file_a, file_b = from_file.weights[module]
        torch.testing.assert_close(file_a, stored(a, qtype), rtol=0, atol=0)
        scaled = stored(b / 2, qtype) * 2  # alpha / r = 2: a power of two, exact in any type
        torch.testing.assert_close(file_b, scaled, rtol=0, atol=0)
    if qtype == F32:
        assert from_file.key == from_folder.key


def all_logprobs(llm: LLM, loras: list[LoRARequest | None]) -> list[torch.Tensor]:
    """Each request's log-softmax over the whole vocabulary at every prompt position after
    the first: [len(PROMPT) - 1, vocab] per entry of `loras`."""
    vocab = llm.llm_engine.config.model_config.hf_config.vocab_size
    params = SamplingParams(max_tokens=1, prompt_logprobs=vocab, temperature=0)
    outputs = llm.generate(
        [{"prompt_token_ids": PROMPT}] * len(loras), params, use_tqdm=False, lora_request=loras
    )
    return [
        torch.tensor([[row[t].logprob for t in range(vocab)] for row in out.prompt_logprobs[1:]])
        for out in outputs
    ]


def peft_logprobs(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0, :-1]
    return logits.float().log_softmax(-1)


def assert_same_logits_as_peft(base: str, folder: str, path: str, reference: torch.Tensor) -> None:
    """pagedllm on `base` with the GGUF adapter and with its PEFT folder, in one batch."""
    vocab = tiny_configs()["llama-gqa4"].vocab_size
    with LLM(base, enable_lora=True, max_lora_rank=8, max_logprobs=vocab, **ENGINE) as llm:
        loras = [LoRARequest("gguf", 1, path), LoRARequest("peft", 2, folder)]
        from_file, from_folder = all_logprobs(llm, loras)
    torch.testing.assert_close(from_file, reference, rtol=0, atol=1e-4)
    torch.testing.assert_close(from_folder, reference, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", list(BASES))
def test_a_gguf_adapter_gives_peft_models_logits_on_an_hf_folder(
    name: str, tiny_model_path, adapters
) -> None:
    """The base model an HF folder: PeftModel's logits with the folder's adapter."""
    folder, path = adapters(name)
    reference = peft_logprobs(peft_model(tiny_model_path(name), **LORA).eval())
    assert_same_logits_as_peft(tiny_model_path(name), folder, path, reference)


def test_a_gguf_adapter_gives_peft_models_logits_on_a_gguf_model(tmp_path) -> None:
    """The base model a llama GGUF file (q/k permuted in the model and in the adapter):
    PeftModel's logits on the HF model the file was written from."""
    model = tiny_model("llama")
    hf_folder, base = str(tmp_path / "hf"), str(tmp_path / "base.gguf")
    model.save_pretrained(hf_folder)
    write_gguf(base, "llama", model.config, gguf_tensors("llama", model.config, model.state_dict()))
    folder = str(tmp_path / "peft")
    peft = save_adapter(hf_folder, folder, **LORA).eval()
    path = write_gguf_adapter(folder, str(tmp_path / "adapter.gguf"), "llama", model.config)
    assert_same_logits_as_peft(base, folder, path, peft_logprobs(peft))


def broken(adapters, tmp_path, name: str = "llama-gqa4", **edits: object) -> str:
    """The llama adapter written with write_gguf_adapter's `edits`."""
    folder, _ = adapters(name)
    path = str(tmp_path / "broken.gguf")
    return write_gguf_adapter(folder, path, BASES[name], tiny_configs()[name], **edits)


def refused(registry: LoRARegistry, path: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        registry.check(LoRARequest("bad", 1, path))


def test_files_that_are_no_adapter_of_the_served_model_are_refused_by_name(
    tiny_model_path, adapters, tmp_path
) -> None:
    """llama.cpp's own checks (general.type, adapter.type, the architecture, both halves of
    each pair, names it knows) and pagedllm's (a GGUF file at all, a numeric alpha, a module
    it serves LoRA on), each a ValueError naming the problem."""
    registry = registry_of(tiny_model_path("llama-gqa4"))
    _, qwen2_adapter = adapters("qwen2")
    refused(registry, qwen2_adapter, r"is for 'qwen2' models .* \(LlamaForCausalLM\) is 'llama'")
    model = {"general.type": ("model", gguf.GGUFValueType.STRING)}  # convert_hf_to_gguf.py's
    refused(registry, write_tiny(str(tmp_path / "model.gguf"), **model), "general.type 'model'")
    not_gguf = tmp_path / "text.gguf"
    not_gguf.write_text("not a gguf")
    refused(registry, str(not_gguf), "is not a GGUF file")
    refused(registry, str(tmp_path / "missing.gguf"), "does not exist")
    cvec = {gguf.Keys.Adapter.TYPE: ("control_vector", gguf.GGUFValueType.STRING)}
    refused(registry, broken(adapters, tmp_path, metadata=cvec), "adapter.type 'control_vector'")
    alpha = {gguf.Keys.Adapter.LORA_ALPHA: ("8", gguf.GGUFValueType.STRING)}
    refused(registry, broken(adapters, tmp_path, metadata=alpha), "adapter.lora.alpha '8'")
    lone = {"blk.0.attn_q.weight.lora_b": None}
    refused(registry, broken(adapters, tmp_path, tensors=lone), "has no blk.0.attn_q.weight.lora_b")
    stray = {"blk.0.attn_q.bias": torch.zeros(4)}
    refused(registry, broken(adapters, tmp_path, tensors=stray), "'blk.0.attn_q.bias' is not a")
    embedding = {
        "token_embd.weight.lora_a": torch.zeros(4, 320),
        "token_embd.weight.lora_b": torch.zeros(64, 4),
    }
    refused(registry, broken(adapters, tmp_path, tensors=embedding), "not to embeddings")


def test_an_engine_refuses_a_gguf_adapter_of_another_architecture(
    tiny_model_path, adapters
) -> None:
    """Through LLM: the request fails with the architecture named, the engine runs on."""
    _, qwen2_adapter = adapters("qwen2")
    with LLM(tiny_model_path("llama-gqa4"), enable_lora=True, max_lora_rank=8, **ENGINE) as llm:
        with pytest.raises(ValueError, match="is for 'qwen2' models"):
            llm.generate(
                {"prompt_token_ids": PROMPT},
                SamplingParams(max_tokens=1),
                use_tqdm=False,
                lora_request=LoRARequest("qwen2", 1, qwen2_adapter),
            )
        (out,) = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(max_tokens=1))
        assert len(out.outputs[0].token_ids) == 1
