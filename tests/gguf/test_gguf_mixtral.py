"""Mixtral GGUF files as llama.cpp writes them: architecture `llama` with
`llama.expert_count` / `llama.expert_used_count`, each layer's router `blk.N.ffn_gate_inp`
and its experts stacked in `blk.N.ffn_{gate,up,down}_exps` (convert_hf_to_gguf.py's
LlamaModel), or, in older files, one tensor per expert `blk.N.ffn_gate.E` (which llama.cpp
still loads). References: transformers' MixtralForCausalLM on the weights the file was
written from (fp32 logits within 1e-4, TORCH_SDPA), and the checkpoint tensors themselves;
what cannot be mapped is refused by name. The stacked form's config and logits are also in
test_hf_config.py's tiny tests, its quantized experts in tests/layers/quantization/test_gguf.py.
"""

import re

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as VT
from gguf.quants import quantize

from pagedllm.gguf import tensor_names
from pagedllm.gguf.hf_config import load_gguf_config
from pagedllm.gguf.reader import read_gguf
from pagedllm.gguf.tensor_names import hf_tensor_types, iterate_gguf_weights
from tests.gguf.test_gguf_phi3 import logits_match_transformers
from tests.gguf.tiny_gguf import (
    checkpoint_tensors,
    gguf_tensors,
    tiny_model,
    write_gguf,
    write_tiny,
)

STACK = re.compile(r"blk\.(\d+)\.(ffn_gate|ffn_up|ffn_down)_exps\.weight")
PROMPT = [5, 17, 60, 3, 33, 42, 7, 12, 9, 50]
PARTS = ("gate", "up", "down")


def per_expert(stored: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The file's stacked experts as older llama files store them, one tensor each."""
    out = {}
    for name, array in stored.items():
        match = STACK.fullmatch(name)
        if match is None:
            out[name] = array
            continue
        layer, part = match.groups()
        for e, expert in enumerate(array):
            out[f"blk.{layer}.{part}.{e}.weight"] = np.ascontiguousarray(expert)
    return out


def write_per_expert(path: str, **overrides: object) -> str:
    model = tiny_model("mixtral", **overrides)
    stored = per_expert(gguf_tensors("mixtral", model.config, model.state_dict()))
    write_gguf(path, "mixtral", model.config, stored)
    return path


def test_the_file_is_llama_with_stacked_experts(tiny_files: dict) -> None:
    path, _, _ = tiny_files["mixtral"]
    gguf = read_gguf(path)
    assert gguf.metadata["general.architecture"] == "llama"
    assert (gguf.metadata["llama.expert_count"], gguf.metadata["llama.expert_used_count"]) == (4, 2)
    assert gguf.tensors["blk.1.ffn_up_exps.weight"].shape == (4, 16, 32)
    assert gguf.tensors["blk.1.ffn_gate_inp.weight"].shape == (4, 32)
    assert load_gguf_config(path).architectures == ["MixtralForCausalLM"]


def test_a_dense_llama_stays_llama(tiny_files: dict) -> None:
    assert load_gguf_config(tiny_files["llama"][0]).architectures == ["LlamaForCausalLM"]


def test_one_tensor_per_expert_reads_as_the_stacked_file(tmp_path) -> None:
    """The same weights under the same names, and transformers' logits."""
    path = write_per_expert(str(tmp_path / "split.gguf"))
    assert "blk.0.ffn_down.3.weight" in read_gguf(path).tensors
    expected = checkpoint_tensors(tiny_model("mixtral"))
    loaded = dict(iterate_gguf_weights(path, torch.float32))
    assert loaded.keys() == expected.keys()
    for name, tensor in loaded.items():
        assert torch.equal(tensor, expected[name]), name
    logits_match_transformers(path, tiny_model("mixtral"), PROMPT, max_model_len=256)


def test_one_tensor_per_expert_reads_only_kept_experts(tmp_path, monkeypatch) -> None:
    """An expert-parallel rank's filter: the other experts' tensors are never read."""
    path = write_per_expert(str(tmp_path / "split.gguf"))
    read = []
    original = tensor_names.read_tensor
    monkeypatch.setattr(
        tensor_names, "read_tensor", lambda g, info: (read.append(info.name), original(g, info))[1]
    )
    keep = lambda name: ".experts." not in name or ".experts.2." in name  # noqa: E731
    loaded = dict(iterate_gguf_weights(path, torch.float32, keep=keep))
    experts_read = {name for name in read if re.fullmatch(r"blk\.\d\.ffn_\w+\.\d\.weight", name)}
    assert experts_read == {f"blk.{i}.ffn_{p}.2.weight" for i in (0, 1) for p in PARTS}
    assert len([name for name in loaded if ".experts." in name]) == 2 * 3


def test_experts_of_one_layer_in_two_types_are_refused(tmp_path) -> None:
    """llama.cpp stacks one tensor per expert into one tensor of expert 0's type."""
    model = tiny_model("mixtral")
    stored = per_expert(gguf_tensors("mixtral", model.config, model.state_dict()))
    stored = {name: (array, Q.F32) for name, array in stored.items()}
    gate = stored["blk.1.ffn_gate.2.weight"][0]
    stored["blk.1.ffn_gate.2.weight"] = (quantize(gate, Q.Q8_0), Q.Q8_0)
    path = str(tmp_path / "mixed.gguf")
    write_gguf(path, "mixtral", model.config, stored)
    with pytest.raises(ValueError, match=r"blk.1.ffn_gate.2.weight is Q8_0, but an earlier .* F32"):
        hf_tensor_types(path)


def test_a_wrong_expert_shape_is_named(tmp_path) -> None:
    model = tiny_model("mixtral")
    stored = per_expert(gguf_tensors("mixtral", model.config, model.state_dict()))
    stored["blk.0.ffn_gate.1.weight"] = np.zeros((12, 32), np.float32)
    path = str(tmp_path / "bad.gguf")
    write_gguf(path, "mixtral", model.config, stored)
    with pytest.raises(
        ValueError, match=r"blk.0.ffn_gate.1.weight has shape \[12, 32\].*\[16, 32\]"
    ):
        load_gguf_config(path)


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"llama.expert_count": ()}, "llama file with experts .* must state llama.expert_count"),
        ({"llama.expert_used_count": (5, VT.UINT32)}, "expert_used_count 5 exceeds .* 4"),
        ({"llama.expert_used_count": ()}, "no metadata key 'llama.expert_used_count'"),
        ({"llama.feed_forward_length": ()}, "no metadata key 'llama.feed_forward_length'"),
    ],
)
def test_unmappable_metadata_is_refused(tmp_path, metadata: dict, message: str) -> None:
    path = write_tiny(str(tmp_path / "bad.gguf"), "mixtral", **metadata)
    with pytest.raises(ValueError, match=f"bad.gguf.*{message}"):
        load_gguf_config(path)
