"""pagedllm/lora/peft_adapter.py: adapter folders written by PEFT's save_pretrained.
Reference: the PeftModel that wrote the folder (its lora_A, lora_B and scaling["default"]
per module); every folder pagedllm cannot serve is refused with a ValueError naming why."""

import json
import os
import shutil
from collections.abc import Callable

import pytest
import torch
from peft.tuners.lora.config import BdLoraConfig, KasaConfig
from safetensors.torch import load_file, save_file

from pagedllm.lora import peft_adapter
from pagedllm.lora.peft_adapter import load_lora_weights, read_peft_adapter
from pagedllm.models.gemma2 import Gemma3ForCausalLM
from pagedllm.models.llama import LlamaForCausalLM
from pagedllm.models.qwen3_moe import Qwen3MoeForCausalLM
from tests.lora.peft_folders import PREFIX, peft_modules, save_adapter
from tests.models.tiny_models import save_tiny_gemma3_multimodal, tiny_configs

MODEL = "llama-gqa4"
SHAPES = LlamaForCausalLM.lora_target_shapes(tiny_configs()[MODEL])
SAFETENSORS = "adapter_model.safetensors"
Q_PROJ = "model.layers.0.self_attn.q_proj"


@pytest.fixture(scope="module")
def plain_adapter(
    tiny_model_path: Callable[[str], str], tmp_path_factory: pytest.TempPathFactory
) -> str:
    """A rank-4 adapter on every q/k/v/o and gate/up/down of the tiny Llama."""
    folder = str(tmp_path_factory.mktemp("plain-adapter"))
    save_adapter(tiny_model_path(MODEL), folder, r=4, lora_alpha=16)
    return folder


@pytest.fixture
def adapter_copy(plain_adapter: str, tmp_path) -> str:
    folder = str(tmp_path / "adapter")
    shutil.copytree(plain_adapter, folder)
    return folder


def edit_config(folder: str, **changes: object) -> None:
    file = os.path.join(folder, "adapter_config.json")
    with open(file) as f:
        config = json.load(f)
    with open(file, "w") as f:
        json.dump({**config, **changes}, f)


def edit_tensors(folder: str, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    file = os.path.join(folder, SAFETENSORS)
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file)


def assert_refused(folder: str, match: str, shapes: dict = SHAPES, max_rank: int = 16) -> None:
    with pytest.raises(ValueError, match=match):
        read_peft_adapter(folder, shapes, max_rank)


def test_the_plain_adapter_is_read(plain_adapter: str) -> None:
    adapter = read_peft_adapter(plain_adapter, SHAPES, 4)
    assert set(adapter.ranks) == set(SHAPES) and adapter.rank == 4
    assert adapter.weights_file == os.path.join(plain_adapter, SAFETENSORS)


def test_a_path_that_is_not_a_folder_is_refused(plain_adapter: str, tmp_path) -> None:
    assert_refused(str(tmp_path / "missing"), "is neither a PEFT adapter folder")
    assert_refused(os.path.join(plain_adapter, SAFETENSORS), "is neither a PEFT adapter folder")


def test_a_folder_without_adapter_config_is_refused(adapter_copy: str) -> None:
    os.remove(os.path.join(adapter_copy, "adapter_config.json"))
    assert_refused(adapter_copy, "has no adapter_config.json")


@pytest.mark.parametrize(
    "text, match",
    [
        ("{not json", "is not readable JSON"),
        ("[1, 2]", "must hold a JSON object"),
        ("[" * 100_000 + "]" * 100_000, "is not readable JSON: RecursionError"),
    ],
)
def test_an_adapter_config_that_is_not_a_json_object_is_refused(
    adapter_copy: str, text: str, match: str
) -> None:
    with open(os.path.join(adapter_copy, "adapter_config.json"), "w") as f:
        f.write(text)
    assert_refused(adapter_copy, match)


def test_a_pattern_key_that_takes_too_long_to_match_is_refused(
    adapter_copy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys are matched on the engine's thread with a time limit (here cut to a microsecond,
    which an expression that backtracks over every split of the name overruns)."""
    monkeypatch.setattr(peft_adapter, "PATTERN_TIMEOUT_S", 1e-6)
    edit_config(adapter_copy, rank_pattern={"(.|..)*(.|..)*(.|..)*Z": 4})
    assert_refused(adapter_copy, "takes over 1e-06 s to match")


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"peft_type": "IA3"}, "is a 'IA3' adapter; pagedllm serves LORA adapters"),
        ({"use_dora": True}, r"DoRA adapters \(use_dora\)"),
        ({"modules_to_save": ["lm_head"]}, "uses modules_to_save"),
        ({"bias": "all"}, "trains biases \\(bias='all'\\)"),
        ({"bias": "lora_only"}, "trains biases \\(bias='lora_only'\\)"),
        ({"fan_in_fan_out": True}, "fan_in_fan_out"),
        ({"target_parameters": ["experts.gate_up_proj"]}, "target_parameters"),
        ({"arrow_config": {"top_k": 3}}, r"Arrow routing between adapters \(arrow_config\)"),
        ({"rank_pattern": {"q_proj(": 2}}, "'q_proj\\(' is not a regular expression"),
        ({"alpha_pattern": ["q_proj"]}, r"alpha_pattern must be a JSON object, got \['q_proj'\]"),
        ({"r": 8}, r"model\.layers\.\d\.\S+ has rank 4 in its weights but r=8 in adapter_config"),
        ({"lora_alpha": "16"}, "lora_alpha '16' for .* is not a number"),
    ],
)
def test_config_options_pagedllm_does_not_serve_are_named(
    adapter_copy: str, changes: dict, match: str
) -> None:
    edit_config(adapter_copy, **changes)
    assert_refused(adapter_copy, match)


@pytest.mark.parametrize(
    "lora_kwargs, match",
    [
        ({"use_dora": True}, "DoRA"),
        ({"bias": "all"}, "bias='all'"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"kasa_config": KasaConfig()}, r"KaSA \(kasa_config"),
        (
            {"use_bdlora": BdLoraConfig(["q_proj"], ["o_proj"], 2, match_strict=False)},
            r"block-diagonal LoRA \(use_bdlora\)",
        ),
        ({"target_modules": ["embed_tokens"]}, "embedding LoRA and other PEFT parts"),
        ({"target_modules": ["lm_head"]}, "tensor 'base_model.model.lm_head.base_layer.weight'"),
    ],
)
def test_adapters_peft_writes_with_unserved_parts_are_refused(
    lora_kwargs: dict, match: str, tiny_model_path: Callable[[str], str], tmp_path
) -> None:
    save_adapter(tiny_model_path(MODEL), str(tmp_path), r=4, **lora_kwargs)
    assert_refused(str(tmp_path), match)


def test_moe_expert_and_router_targets_are_refused_on_qwen3_moe(
    tiny_model_path: Callable[[str], str], tmp_path
) -> None:
    """Layer 0 of the tiny Qwen3-MoE is sparse (experts and a router), layer 1 dense. Under
    transformers 5, PEFT turns gate_proj/up_proj targets into target_parameters on the fused
    experts; per-expert module names are those of older adapters."""
    shapes = Qwen3MoeForCausalLM.lora_target_shapes(tiny_configs()["qwen3-moe"])
    folder = str(tmp_path)
    save_adapter(tiny_model_path("qwen3-moe"), folder, r=4, target_modules=["gate_proj", "up_proj"])
    assert_refused(folder, "uses target_parameters", shapes)
    save_adapter(tiny_model_path("qwen3-moe"), folder, r=4, target_modules=["q_proj"])
    dense = "model.layers.1.mlp.gate_proj"
    edit_tensors(folder, lambda t: t.update(lora_pair(dense, 64, 96)))
    assert read_peft_adapter(folder, shapes, 4).ranks[dense] == 4
    for module, match in [
        ("model.layers.0.mlp.experts.3.up_proj", r"experts.3.up_proj.*\(not to MoE experts\)"),
        ("model.layers.0.mlp.gate_proj", r"targets model.layers.0.mlp.gate_proj, which this"),
        ("model.layers.0.mlp.gate", r"mlp.gate, .* \(not to embeddings or the LM head\)"),
    ]:
        edit_tensors(folder, lambda t, m=module: t.update(lora_pair(m, 64, 96)))
        assert_refused(folder, match, shapes)
        edit_tensors(folder, lambda t, m=module: [t.pop(k) for k in list(t) if f".{m}.lora" in k])


def lora_pair(module: str, in_features: int, out_features: int) -> dict[str, torch.Tensor]:
    return {
        f"{PREFIX}{module}.lora_A.weight": torch.zeros(4, in_features),
        f"{PREFIX}{module}.lora_B.weight": torch.zeros(out_features, 4),
    }


def test_an_lm_head_pair_is_refused_by_name(adapter_copy: str) -> None:
    edit_tensors(adapter_copy, lambda t: t.update(lora_pair("lm_head", 64, 320)))
    assert_refused(adapter_copy, r"targets lm_head, .* \(not to embeddings or the LM head\)")


@pytest.mark.parametrize("which, shape", [("A", [4, 63]), ("B", [65, 4]), ("A", [0, 64])])
def test_a_weight_of_the_wrong_shape_is_named(adapter_copy: str, which: str, shape: list) -> None:
    name = f"{PREFIX}{Q_PROJ}.lora_{which}.weight"
    edit_tensors(adapter_copy, lambda t: t.update({name: torch.zeros(shape)}))
    assert_refused(adapter_copy, f"{Q_PROJ} has lora_A .* this model's {Q_PROJ} needs")


def test_a_rank_over_max_lora_rank_is_refused(plain_adapter: str) -> None:
    assert_refused(plain_adapter, "has rank 4 .* over max_lora_rank 3", max_rank=3)


@pytest.mark.parametrize("which", ["A", "B"])
def test_a_lone_half_is_named(adapter_copy: str, which: str) -> None:
    other = "B" if which == "A" else "A"
    edit_tensors(adapter_copy, lambda t: t.pop(f"{PREFIX}{Q_PROJ}.lora_{other}.weight"))
    assert_refused(adapter_copy, f"{Q_PROJ} has no lora_{other}.weight")


@pytest.mark.parametrize(
    "name, shape",
    [(f"{PREFIX}{Q_PROJ}.lora_magnitude_vector", [64]), ("model.layers.0.x.lora_A.weight", [4, 4])],
)
def test_a_tensor_that_is_not_a_lora_weight_is_named(
    adapter_copy: str, name: str, shape: list
) -> None:
    edit_tensors(adapter_copy, lambda t: t.update({name: torch.zeros(shape)}))
    assert_refused(adapter_copy, f"tensor '{name}' .* is not a LoRA weight")


def test_a_weights_file_without_tensors_is_refused(adapter_copy: str) -> None:
    save_file({}, os.path.join(adapter_copy, SAFETENSORS))
    assert_refused(adapter_copy, "holds no LoRA weights")


def test_a_folder_without_weights_is_refused(adapter_copy: str) -> None:
    os.remove(os.path.join(adapter_copy, SAFETENSORS))
    assert_refused(adapter_copy, "has neither adapter_model.safetensors nor adapter_model.bin")


@pytest.mark.parametrize("cut", [0, 7, 100, -1])
def test_a_corrupt_safetensors_file_is_refused(adapter_copy: str, cut: int) -> None:
    """A file cut short after `cut` bytes (-1: one byte short), or garbage (0)."""
    file = os.path.join(adapter_copy, SAFETENSORS)
    with open(file, "rb") as f:
        data = f.read()
    with open(file, "wb") as f:
        f.write(data[:cut] if cut else b"\x13not a safetensors file at all")
    assert_refused(adapter_copy, "is not a readable safetensors file")


@pytest.mark.parametrize("content", [b"garbage", None])
def test_a_corrupt_bin_file_is_refused(adapter_copy: str, content: bytes | None) -> None:
    """Not a torch file, or a torch file of something else than a dict of tensors (None)."""
    os.remove(os.path.join(adapter_copy, SAFETENSORS))
    file = os.path.join(adapter_copy, "adapter_model.bin")
    if content is None:
        torch.save([torch.zeros(2)], file)
        assert_refused(adapter_copy, "must hold a dict of tensors")
    else:
        with open(file, "wb") as f:
            f.write(content)
        assert_refused(adapter_copy, "is not a readable torch file")


def assert_reads_as_peft(folder: str, model: object, max_rank: int = 16) -> None:
    """Every adapted module's A, B * scaling and scaling are PEFT's own."""
    adapter = read_peft_adapter(folder, SHAPES, max_rank)
    expected = peft_modules(model)
    assert adapter.scalings == pytest.approx({m: p.scaling for m, p in expected.items()})
    assert adapter.ranks == {m: p.a.shape[0] for m, p in expected.items()}
    weights = load_lora_weights(adapter)
    assert set(weights) == set(expected)
    for module, (a, b) in weights.items():
        torch.testing.assert_close(a, expected[module].a, rtol=0, atol=0)
        torch.testing.assert_close(b, expected[module].b * expected[module].scaling)


@pytest.mark.parametrize(
    "lora_kwargs",
    [
        {"r": 4, "lora_alpha": 16},
        {"r": 4, "lora_alpha": 12, "use_rslora": True},
        {
            "r": 4,
            "lora_alpha": 8,
            "rank_pattern": {"q_proj": 2, "layers.1.mlp.down_proj": 6},
            "alpha_pattern": {"v_proj": 3, r"layers\.0\.mlp\.(up|gate)_proj": 20},
        },
        {"r": 6, "lora_alpha": 5, "use_rslora": True, "rank_pattern": {"o_proj": 3}},
    ],
    ids=["plain", "rslora", "patterns", "rslora-patterns"],
)
def test_weights_and_scalings_equal_peft_s(
    lora_kwargs: dict, tiny_model_path: Callable[[str], str], tmp_path
) -> None:
    model = save_adapter(tiny_model_path(MODEL), str(tmp_path), **lora_kwargs)
    assert_reads_as_peft(str(tmp_path), model)


def test_a_bin_adapter_reads_as_the_safetensors_one(
    tiny_model_path: Callable[[str], str], tmp_path
) -> None:
    """PEFT's save_pretrained(safe_serialization=False) writes adapter_model.bin."""
    kwargs = {"r": 4, "lora_alpha": 8, "rank_pattern": {"k_proj": 2}}
    safe, binary = str(tmp_path / "safe"), str(tmp_path / "bin")
    model = save_adapter(tiny_model_path(MODEL), safe, **kwargs)
    save_adapter(tiny_model_path(MODEL), binary, safe_serialization=False, **kwargs)
    assert sorted(os.listdir(binary)) == ["README.md", "adapter_config.json", "adapter_model.bin"]
    assert_reads_as_peft(binary, model)
    from_bin = load_lora_weights(read_peft_adapter(binary, SHAPES, 16))
    from_safe = load_lora_weights(read_peft_adapter(safe, SHAPES, 16))
    for module, (a, b) in from_bin.items():
        torch.testing.assert_close((a, b), from_safe[module], rtol=0, atol=0)


GEMMA3_SHAPES = Gemma3ForCausalLM.lora_target_shapes(tiny_configs()["gemma3"])
OLDER_NAMES = {
    f"{PREFIX}model.language_model.": f"{PREFIX}language_model.model.",
    f"{PREFIX}model.vision_tower.": f"{PREFIX}vision_tower.",
}
"""PEFT's names of an image-and-text Gemma 3's modules on transformers' older layout (PEFT
writes the newer one, `model.language_model.`)."""


@pytest.fixture(scope="module")
def gemma3_multimodal(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = str(tmp_path_factory.mktemp("gemma3-mm"))
    save_tiny_gemma3_multimodal(folder)
    return folder


@pytest.mark.parametrize("layout", ["newer", "older"])
def test_a_multimodal_gemma3_adapter_reads_as_peft_on_the_language_model(
    layout: str, gemma3_multimodal: str, tmp_path
) -> None:
    """An adapter trained on Gemma3ForConditionalGeneration names its modules under
    `language_model` (and, targeting q_proj and fc1 by name, the vision tower's too): its
    language model's modules read as PEFT holds them under the model's names, with patterns
    matched on the adapter's own names; the vision tower's are ignored, as vLLM does."""
    model = save_adapter(
        gemma3_multimodal,
        str(tmp_path),
        r=4,
        lora_alpha=8,
        target_modules=r".*language_model.*\.(k_proj|down_proj)|.*\.q_proj|.*\.fc1",
        alpha_pattern={r"language_model\.layers\.0\.self_attn\.q_proj": 24},
    )
    if layout == "older":  # as PEFT writes it for transformers' older model
        edit_tensors(str(tmp_path), lambda t: t.update(_renamed(t, OLDER_NAMES)))
        older_q = r"language_model\.model\.layers\.0\.self_attn\.q_proj"
        edit_config(str(tmp_path), alpha_pattern={older_q: 24})
    adapter = read_peft_adapter(
        str(tmp_path), GEMMA3_SHAPES, 16, Gemma3ForCausalLM.hf_to_pagedllm_mapper
    )
    expected = {
        m.replace("model.language_model.", "model."): p
        for m, p in peft_modules(model).items()
        if "language_model" in m
    }
    assert len(expected) == 6 and expected[Q_PROJ].scaling == 6.0
    assert adapter.scalings == pytest.approx({m: p.scaling for m, p in expected.items()})
    weights = load_lora_weights(adapter)
    assert set(weights) == set(expected)
    for module, (a, b) in weights.items():
        torch.testing.assert_close(a, expected[module].a, rtol=0, atol=0)
        torch.testing.assert_close(b, expected[module].b * expected[module].scaling)


def _renamed(tensors: dict[str, torch.Tensor], renames: dict[str, str]) -> dict:
    """`tensors` under the names `renames` gives them (the old ones removed)."""
    out = {}
    for name in list(tensors):
        old = next((p for p in renames if name.startswith(p)), None)
        if old is not None:
            out[renames[old] + name[len(old) :]] = tensors.pop(name)
    return out


def test_a_multimodal_gemma3_adapter_of_the_vision_tower_alone_is_refused(
    gemma3_multimodal: str, tmp_path
) -> None:
    save_adapter(gemma3_multimodal, str(tmp_path), r=4, target_modules=r".*vision_tower.*\.fc1")
    with pytest.raises(ValueError, match="adapts only modules outside the language model"):
        read_peft_adapter(str(tmp_path), GEMMA3_SHAPES, 16, Gemma3ForCausalLM.hf_to_pagedllm_mapper)
