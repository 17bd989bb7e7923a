"""Quantized HF checkpoints (GPTQ, AWQ, compressed-tensors, fp8) end to end, against the
float32 checkpoint of the weights they dequantize to (tests/quantized_checkpoints.py):
dequantized at load (quantization="none") they are that checkpoint, to float32 rounding;
run as stored, their layers are GGUF blocks and the model follows the reference within the
noise of 8-bit activations, as a GGUF file does. Each format for Llama's separate q/k/v and
gate/up layers and for Phi-3's, which the tools quantize fused (qkv_proj, gate_up_proj)."""

from collections.abc import Callable

import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q

from pagedllm import LLM, SamplingParams
from pagedllm.config import ModelConfig
from pagedllm.entrypoints.inspect import inspect_model
from pagedllm.model_loader.loader import get_model, weight_bytes
from tests import quantized_checkpoints as qc
from tests.models.tiny_models import COMMON, save_tiny_model, tiny_configs

ENGINE = dict(skip_tokenizer_init=True, num_kv_blocks=64, max_logprobs=20, dtype="float32")
PROMPTS = [
    {"prompt_token_ids": [1, 17, 250, 33, 9, 120, 64, 5, 301, 77]},
    {"prompt_token_ids": [1, 4, 99, 180, 3, 42]},
]

FORMATS: dict[str, tuple[Callable[..., tuple[str, str]], dict, object]] = {
    # name: (writer, its arguments, the GGUF type of q_proj run as stored; None: float)
    "gptq-4bit-sym": (qc.save_gptq, {}, Q.Q4_0),
    "gptq-4bit-asym": (qc.save_gptq, {"symmetric": False}, Q.Q4_1),
    "gptq-4bit-per-channel": (qc.save_gptq, {"group": -1}, Q.Q4_0),
    "gptq-8bit": (qc.save_gptq, {"bits": 8}, Q.Q8_0),
    "gptq-v2-asym": (qc.save_gptq, {"symmetric": False, "v2": True}, Q.Q4_1),
    "gptq-act-order": (qc.save_gptq, {"act_order": True}, None),
    "gptq-2bit": (qc.save_gptq, {"bits": 2}, None),
    "awq": (qc.save_awq, {}, Q.Q4_1),
    "ct-w4a16": (qc.save_compressed_tensors, {}, Q.Q4_0),
    "ct-w4a16-asym": (qc.save_compressed_tensors, {"symmetric": False}, Q.Q4_1),
    "ct-w8-channel": (qc.save_compressed_tensors, {"bits": 8, "group": None}, Q.Q8_0),
    "fp8-block": (qc.save_fp8, {}, None),
    "fp8-tensor": (qc.save_fp8, {"block": None}, None),
}


@pytest.fixture(scope="module")
def checkpoint(
    tiny_model_path: Callable[[str], str], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, str], tuple[str, str]]:
    """(format, tiny model) -> (quantized folder, reference float32 folder), written once."""
    folders: dict[tuple[str, str], tuple[str, str]] = {}

    def get(fmt: str, name: str) -> tuple[str, str]:
        if (fmt, name) not in folders:
            writer, kwargs, _ = FORMATS[fmt]
            out = tmp_path_factory.mktemp(f"{fmt}-{name}") / "model"
            folders[fmt, name] = writer(tiny_model_path(name), str(out), **kwargs)
        return folders[fmt, name]

    return get


def greedy(path: str, quantization: str | None = None, **engine: object) -> list:
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=0)
    with LLM(path, quantization=quantization, **{**ENGINE, **engine}) as llm:
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    result = []
    for output in outputs:
        c = output.outputs[0]
        result.append((c.token_ids, [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]))
    return result


def prompt_logprobs(path: str, quantization: str | None = None, **engine: object) -> torch.Tensor:
    """Each prompt token's logprob given the ones before it: the model on fixed input, so a
    near tie that quantization noise flips does not send the runs down different paths."""
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    with LLM(path, quantization=quantization, **{**ENGINE, **engine}) as llm:
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    return torch.tensor(
        [
            lp[token].logprob
            for output in outputs
            for lp, token in zip(output.prompt_logprobs[1:], output.prompt_token_ids[1:])
        ]
    )


def assert_follows(got: list, want: list, atol: float) -> None:
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(got, want, strict=True):
        assert tokens == ref_tokens
        torch.testing.assert_close(
            torch.tensor(logprobs), torch.tensor(ref_logprobs), atol=atol, rtol=0
        )


FUSED = ["llama-gqa-llama3", "phi3"]
"""A model whose checkpoint stores q/k/v and gate/up apart, and one that stores them fused."""


@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantized_at_load_is_the_reference_checkpoint(fmt: str, name: str, checkpoint) -> None:
    quantized, reference = checkpoint(fmt, name)
    assert_follows(greedy(quantized, "none"), greedy(reference), atol=1e-5)


@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("fmt", FORMATS)
def test_run_as_stored_follows_the_reference(fmt: str, name: str, checkpoint) -> None:
    """Blocks hold the checkpoint's weights (Q4_1's m rounded to fp16); the kernels' 8-bit
    activations move a tiny random model's logprobs by a few hundredths, as for int8."""
    quantized, reference = checkpoint(fmt, name)
    atol = 1e-5 if FORMATS[fmt][2] is None else 0.06
    got, want = prompt_logprobs(quantized), prompt_logprobs(reference)
    torch.testing.assert_close(got, want, atol=atol, rtol=0)


@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("fmt", FORMATS)
def test_layers_run_in_the_block_type_their_layout_maps_to(fmt: str, name: str, checkpoint) -> None:
    quantized, _ = checkpoint(fmt, name)
    config = ModelConfig.create(quantized, "float32")
    assert config.quantization == fmt.split("-")[0].replace("ct", "compressed-tensors")
    model = get_model(config)
    layer = model.model.layers[0]
    qtype = FORMATS[fmt][2]
    attention, mlp = layer.self_attn, layer.mlp
    for module in (attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj):
        if qtype is None:
            assert module.weight.dtype == torch.float32
        else:
            assert module.weight.dtype == torch.uint8
            assert set(module.quant_method.shard_types) == {qtype}
    assert model.model.embed_tokens.weight.dtype == torch.float32  # not quantized by the tools
    assert model.lm_head.weight.dtype == torch.float32


@pytest.mark.parametrize(
    "name", ["llama-biases", "llama-tied-mqa", "mistral", "qwen2", "qwen3", "granitemoe"]
)
def test_every_family_runs_gptq(name: str, checkpoint) -> None:
    quantized, reference = checkpoint("gptq-4bit-sym", name)
    assert_follows(greedy(quantized, "none"), greedy(reference), atol=1e-5)
    torch.testing.assert_close(
        prompt_logprobs(quantized), prompt_logprobs(reference), atol=0.06, rtol=0
    )


@pytest.mark.parametrize("name", ["qwen3-moe", "mixtral"])  # mixtral: block_sparse_moe.*.w1
@pytest.mark.parametrize("fmt", ["gptq-4bit-asym", "ct-w4a16", "fp8-block"])
def test_moe_experts_run_as_stored(fmt: str, name: str, checkpoint) -> None:
    quantized, reference = checkpoint(fmt, name)
    atol = 1e-5 if FORMATS[fmt][2] is None else 0.06
    got, want = prompt_logprobs(quantized), prompt_logprobs(reference)
    torch.testing.assert_close(got, want, atol=atol, rtol=0)
    model = get_model(ModelConfig.create(quantized, "float32"))
    experts = model.model.layers[0].mlp.experts
    want = torch.float32 if FORMATS[fmt][2] is None else torch.uint8
    assert experts.w13_weight.dtype == experts.w2_weight.dtype == want
    assert model.model.layers[0].mlp.gate.weight.dtype == torch.float32  # the router


def test_4bit_weights_take_about_a_fifth_of_float32(checkpoint) -> None:
    quantized, reference = checkpoint("awq", "qwen3")
    packed = weight_bytes(get_model(ModelConfig.create(quantized, "float32")))
    full = weight_bytes(get_model(ModelConfig.create(reference, "float32")))
    linear = weight_bytes(get_model(ModelConfig.create(reference, "float32")), buffers=False)
    assert packed < full
    # the tiny model's float embedding and LM head stay; its linear layers shrink 128 -> 20 bytes
    assert full - packed > 0.5 * (linear - 2 * 320 * 64 * 4)


def test_bf16_runs_as_stored(checkpoint) -> None:
    quantized, reference = checkpoint("gptq-4bit-sym", "llama-gqa-llama3")
    got = prompt_logprobs(quantized, dtype="bfloat16")
    want = prompt_logprobs(reference, dtype="float32")
    torch.testing.assert_close(got, want, atol=0.1, rtol=0)


@pytest.mark.parametrize("name", FUSED)
def test_tensor_parallel_follows_one_rank(name: str, tmp_path) -> None:
    """2 ranks split every quantized layer on block boundaries (intermediate 128: down_proj's
    64 input columns a rank are 2 blocks); Phi-3's fused layers are cut into their parts,
    whole rows of blocks, before the ranks take their rows of each."""
    config = tiny_configs()[name]
    config.intermediate_size = 128
    save_tiny_model(config, str(tmp_path / "float"))
    quantized, _ = qc.save_gptq(str(tmp_path / "float"), str(tmp_path / "gptq"))
    one = prompt_logprobs(quantized)
    torch.testing.assert_close(
        prompt_logprobs(quantized, tensor_parallel_size=2), one, atol=0.3, rtol=0
    )


def test_a_quantized_checkpoint_refuses_other_quantizations(checkpoint) -> None:
    quantized, reference = checkpoint("gptq-4bit-sym", "llama-gqa-llama3")
    with pytest.raises(ValueError, match="already quantized with 'gptq'"):
        ModelConfig.create(quantized, "float32", quantization="int8")
    with pytest.raises(ValueError, match="already quantized with 'gptq'"):
        ModelConfig.create(quantized, "float32", quantization="awq")
    with pytest.raises(ValueError, match="has no quantization_config"):
        ModelConfig.create(reference, "float32", quantization="gptq")
    with pytest.raises(ValueError, match="pass quantization 'none'"):
        ModelConfig.create(quantized, "float32", load_format="dummy")
    assert ModelConfig.create(quantized, "float32", quantization="gptq").quantization == "gptq"
    dummy = ModelConfig.create(quantized, "float32", quantization="none", load_format="dummy")
    assert dummy.quantization is None


def test_zero_points_that_contradict_the_config_are_an_error(checkpoint, tmp_path) -> None:
    """A config saying sym over asymmetric zeros would run the wrong weights as Q4_0."""
    quantized, _ = checkpoint("gptq-4bit-asym", "llama-gqa-llama3")
    import json
    import shutil

    folder = tmp_path / "lying"
    shutil.copytree(quantized, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["sym"] = True
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="zero points are all 8; this layer's are not"):
        get_model(ModelConfig.create(str(folder), "float32"))


@pytest.mark.parametrize("name", ["qwen3-moe", "phi3", "mixtral"])
@pytest.mark.parametrize("fmt", ["gptq-4bit-sym", "gptq-act-order", "awq", "ct-w8-channel"])
def test_inspect_sizes_the_layers_as_the_loader_runs_them(fmt: str, name: str, checkpoint) -> None:
    """From the weight files' headers; from the config alone, the tools' default (every
    linear layer quantized), which act-order layers (dequantized at load) do not follow.
    Blocks packed for the CPU kernels take a little more than the file's bytes (here, with
    rows of one block, 0.5% more in all); a tied LM head's copy packed for the CPU matmul
    counts as the loader holds it."""
    quantized, _ = checkpoint(fmt, name)
    config = ModelConfig.create(quantized, "float32")
    model = get_model(config)
    loaded = weight_bytes(model, buffers=False)
    report = inspect_model(config)
    assert report["quantization"] == config.quantization
    assert report["bytes_per_rank"] == pytest.approx(loaded, rel=0.01)
    from_config = inspect_model(ModelConfig.create(f"{quantized}/config.json", "float32"))
    same = from_config["bytes_per_rank"] == report["bytes_per_rank"]
    assert same == (fmt != "gptq-act-order")


@pytest.mark.parametrize(
    ("fmt", "file"), [("gptq-4bit-sym", "quantize_config.json"), ("awq", "quant_config.json")]
)
def test_settings_in_an_older_tools_own_file(fmt: str, file: str, checkpoint, tmp_path) -> None:
    """AutoGPTQ's quantize_config.json and AutoAWQ's quant_config.json (without quant_method,
    in AutoAWQ's field names), read as vLLM reads them."""
    import json
    import shutil

    quantized, reference = checkpoint(fmt, "llama-gqa-llama3")
    folder = tmp_path / "older"
    shutil.copytree(quantized, folder)
    config = json.loads((folder / "config.json").read_text())
    settings = config.pop("quantization_config")
    settings.pop("quant_method")
    if fmt == "awq":
        settings = {
            "w_bit": 4,
            "q_group_size": settings["group_size"],
            "zero_point": True,
            "version": "GEMM",
        }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / file).write_text(json.dumps(settings))
    assert ModelConfig.create(str(folder), "float32").quantization == fmt.split("-")[0]
    torch.testing.assert_close(
        prompt_logprobs(str(folder)), prompt_logprobs(reference), atol=0.06, rtol=0
    )


def _edited(folder: str, out, edit: Callable[[dict], None]) -> str:
    """A copy of checkpoint folder with its tensors changed by edit (a dict, in place)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, out)
    tensors = load_file(f"{out}/model.safetensors")
    edit(tensors)
    save_file(tensors, f"{out}/model.safetensors")
    return str(out)


Q_PROJ = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize(
    ("fmt", "edit", "match"),
    [
        (
            "gptq-4bit-sym",
            lambda t: t.pop(f"{Q_PROJ}.qzeros"),
            f"no tensor '{Q_PROJ}.qzeros', a part of layer",
        ),
        (
            "gptq-4bit-sym",
            lambda t: t.update({f"{Q_PROJ}.qweight": t[f"{Q_PROJ}.qweight"].float()}),
            "packed codes are 2-D int32 words, got torch.float32",
        ),
        (
            "gptq-act-order",
            lambda t: t[f"{Q_PROJ}.g_idx"].__setitem__(0, 5),
            f"{Q_PROJ}: g_idx of shape \\(64,\\) with groups 0 .. 5 for 64 columns in 2",
        ),
        (
            "ct-w4a16",
            lambda t: t.pop(f"{Q_PROJ}.weight_shape"),
            f"no tensor '{Q_PROJ}.weight_shape'",
        ),
        (
            "ct-w8-channel",
            lambda t: t.pop(f"{Q_PROJ}.weight_scale"),
            f"'{Q_PROJ}.weight' is torch.int8: quantized values, but the checkpoint has no scale",
        ),
        (
            "fp8-block",
            lambda t: t.pop(f"{Q_PROJ}.weight_scale_inv"),
            "is torch.float8_e4m3fn: quantized values, but the checkpoint has no scale",
        ),
    ],
)
def test_a_malformed_layer_is_an_error_naming_it(fmt, edit, match, checkpoint, tmp_path) -> None:
    quantized, _ = checkpoint(fmt, "llama-gqa-llama3")
    folder = _edited(quantized, tmp_path / "bad", edit)
    with pytest.raises(ValueError, match=match):
        get_model(ModelConfig.create(folder, "float32"))


def test_autogptq_zero_biases_of_layers_without_one_are_skipped(checkpoint, tmp_path) -> None:
    """AutoGPTQ writes a bias of zeros for every quantized layer; vLLM skips them. A nonzero
    one for a layer without a bias is still an error."""
    quantized, reference = checkpoint("gptq-4bit-sym", "llama-gqa-llama3")
    zero = _edited(
        quantized, tmp_path / "zero", lambda t: t.update({f"{Q_PROJ}.bias": torch.zeros(64)})
    )
    assert_follows(greedy(zero, "none"), greedy(reference), atol=1e-5)
    ones = _edited(
        quantized, tmp_path / "ones", lambda t: t.update({f"{Q_PROJ}.bias": torch.ones(64)})
    )
    with pytest.raises(ValueError, match=f"'{Q_PROJ}.bias' matches no parameter"):
        get_model(ModelConfig.create(ones, "float32"))


def test_a_tensor_parallel_split_that_cuts_blocks_names_the_layer(checkpoint) -> None:
    quantized, _ = checkpoint("gptq-4bit-sym", "llama-gqa-llama3")  # down_proj: 96 columns
    with pytest.raises(ValueError, match="model.layers.0.mlp.down_proj: 48 columns are not whole"):
        LLM(quantized, tensor_parallel_size=2, **ENGINE)


def test_inspect_of_a_config_sizes_layers_no_target_names_as_float(tmp_path) -> None:
    config = transformers.LlamaConfig(
        **COMMON, num_key_value_heads=2, architectures=["LlamaForCausalLM"]
    )
    config.quantization_config = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "mlp": {
                "targets": [r"re:.*mlp\..*"],
                "format": "pack-quantized",
                "weights": {"num_bits": 4, "strategy": "group", "group_size": 32},
            }
        },
    }
    config.save_pretrained(tmp_path)
    report = inspect_model(ModelConfig.create(str(tmp_path / "config.json"), "float32"))
    assert set(report["bytes_per_rank_by_type"]) == {"F32", "Q4_0"}
