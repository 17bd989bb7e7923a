"""pagedllm/gguf/tensor_names.py against transformers' own GGUF loading of the default model
(SmolLM2-135M-Instruct Q4_1), and against tiny HF models written to GGUF with llama.cpp's
conventions (gguf's tensor-name map, convert_hf_to_gguf.py's q/k permutation)."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.initialization import no_init_weights
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from pagedllm.gguf import tensor_names
from pagedllm.gguf.hf_config import load_gguf_config
from pagedllm.gguf.tensor_names import iterate_gguf_weights
from tests.gguf.tiny_gguf import TINY


@pytest.fixture(scope="module")
def reference(gguf_path: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """transformers' GGUF load: its config dict and its dequantized state dict.

    This is what `AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)` runs for llama
    (GgufHfQuantizer.get_state_dict); called directly because from_pretrained insists on the
    `accelerate` package for GGUF, and to parse the file once. The meta model only supplies
    the parameter names it maps to.
    """
    with torch.device("meta"):
        names_model = AutoModelForCausalLM.from_config(load_gguf_config(gguf_path))
    parsed = load_gguf_checkpoint(
        gguf_path, return_tensors=True, model_to_load=names_model, torch_dtype=torch.float32
    )
    return parsed["config"], parsed["tensors"]


def test_weights_equal_transformers_gguf_state_dict(gguf_path: str, reference: tuple) -> None:
    _, expected = reference
    seen = set()
    for name, tensor in iterate_gguf_weights(gguf_path, torch.float32):
        assert tensor.dtype == torch.float32
        assert tensor.shape == expected[name].shape, name
        assert (tensor - expected[name]).abs().max().item() <= 1e-6, name
        seen.add(name)
    # the file has no output.weight: lm_head is tied, and neither side yields it
    assert seen == set(expected)
    assert "lm_head.weight" not in seen


def test_weights_cast_to_requested_dtype(gguf_path: str) -> None:
    _, tensor = next(iterate_gguf_weights(gguf_path, torch.bfloat16))
    assert tensor.dtype == torch.bfloat16


def test_transformers_on_these_weights_says_paris(reference: tuple, tokenizer) -> None:
    """Validates the file itself: transformers' Llama on the GGUF weights, greedy, 8 tokens."""
    config_dict, tensors = reference
    with no_init_weights():  # every weight is loaded next
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config_dict))
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    assert missing == ["lm_head.weight"] and not unexpected
    model.tie_weights()
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])


@pytest.mark.parametrize("arch", list(TINY))
def test_tiny_round_trip_weights(arch: str, tiny_files: dict) -> None:
    path, _, expected = tiny_files[arch]
    loaded = dict(iterate_gguf_weights(path, torch.float32))
    assert set(loaded) == set(expected)
    for name, tensor in loaded.items():  # a Gemma norm comes in float64 (gguf/gemma.py)
        assert torch.equal(tensor, expected[name].to(tensor.dtype)), name


@pytest.mark.parametrize("arch", list(TINY))
def test_keep_skips_tensors_before_reading_them(arch: str, tiny_files: dict, monkeypatch) -> None:
    """Another pipeline stage's tensors (rejected by `keep`) are never read from the file."""
    path, _, expected = tiny_files[arch]
    read = []
    original = tensor_names.read_tensor
    monkeypatch.setattr(
        tensor_names,
        "read_tensor",
        lambda gguf, info: (read.append(info.name), original(gguf, info))[1],
    )
    keep = lambda name: name.startswith("model.layers.1.")  # noqa: E731
    loaded = dict(iterate_gguf_weights(path, torch.float32, keep=keep))
    assert set(loaded) == {name for name in expected if keep(name)} != set()
    assert read and all(name.startswith("blk.1.") for name in read)


@pytest.mark.parametrize("experts, runs", [([2], [1]), ([0, 1, 3], [2, 1]), ([1, 2], [2])])
def test_keep_reads_only_the_kept_experts_rows(
    experts: list[int], runs: list[int], tiny_files: dict, monkeypatch
) -> None:
    """Of each stacked expert tensor (4 experts) only the kept experts' rows are read, one
    read per run of consecutive experts, and they are the checkpoint's experts exactly."""
    path, _, expected = tiny_files["qwen3moe"]
    reads = []
    original = tensor_names.read_tensor
    monkeypatch.setattr(
        tensor_names,
        "read_tensor",
        lambda gguf, info: (reads.append(info), original(gguf, info))[1],
    )
    keep = lambda name: ".experts." not in name or int(name.split(".")[5]) in experts  # noqa: E731
    loaded = dict(iterate_gguf_weights(path, torch.float32, keep=keep))
    assert set(loaded) == {name for name in expected if keep(name)}
    for name, tensor in loaded.items():
        assert torch.equal(tensor, expected[name]), name
    stacked = [info.shape[0] for info in reads if info.name.endswith("_exps.weight")]
    assert stacked == runs * 2 * 3  # per run, in each of 2 layers' gate, up and down
