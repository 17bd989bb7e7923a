"""pagedllm/models/phi3.py beyond the shared comparison with transformers
(test_models_vs_transformers.py, whose tiny Phi-3 never passes its original length):
LongRoPE's factors chosen by max_model_len, and fused checkpoint tensors cut into their
parts."""

import pytest
import torch
import transformers

from pagedllm.config import ModelConfig
from pagedllm.model_loader.loader import get_model
from tests.models.checkpoints import empty_model, load, read_checkpoint
from tests.models.test_models_vs_transformers import paged_greedy
from tests.models.tiny_models import save_tiny_model, tiny_configs


@pytest.fixture(scope="module")
def long_context_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny Phi-3 pretrained on 16 positions, extended to 128 by LongRoPE."""
    config = tiny_configs()["phi3"]
    config.original_max_position_embeddings = 16
    config.rope_parameters["original_max_position_embeddings"] = 16
    folder = str(tmp_path_factory.mktemp("phi3-long"))
    save_tiny_model(config, folder)
    return folder


@pytest.mark.parametrize(("max_model_len", "prompt_lens"), [(128, (17, 30)), (16, (3, 7))])
def test_longrope_factors_follow_max_model_len(
    long_context_folder: str, max_model_len: int, prompt_lens: tuple[int, ...]
) -> None:
    """Past the original length the long factors rotate every position, as transformers
    rotates a sequence longer than that; within it the short ones, as transformers rotates a
    shorter one. Reference: transformers' logits of each whole sequence (float32, 1e-4) and
    its greedy tokens."""
    model = get_model(
        ModelConfig.create(long_context_folder, dtype="float32", max_model_len=max_model_len)
    )
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        long_context_folder, dtype=torch.float32
    ).eval()
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 320, (n,), generator=gen).tolist() for n in prompt_lens]
    seqs, logits = paged_greedy(model, prompts)
    for seq, ours in zip(seqs, logits):
        assert (len(seq) - 1 > 16) == (max_model_len > 16)
        with torch.no_grad():
            ref = hf(torch.tensor([seq[:-1]])).logits[0]
        torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)
        assert seq[-9:] == ref[-9:].argmax(-1).tolist()


def test_fused_tensors_load_as_their_parts(tiny_model_path) -> None:
    """Reference: the checkpoint's fused tensors are our fused parameters as they are."""
    folder = tiny_model_path("phi3")
    checkpoint = read_checkpoint(folder)
    model = load(empty_model(folder), checkpoint)
    params = dict(model.named_parameters())
    for name in ("self_attn.qkv_proj", "mlp.gate_up_proj"):
        key = f"model.layers.1.{name}.weight"
        assert torch.equal(params[key], checkpoint[key])


def test_a_fused_tensor_of_the_wrong_size_is_refused(tiny_model_path) -> None:
    folder = tiny_model_path("phi3")
    checkpoint = read_checkpoint(folder)
    name = "model.layers.0.self_attn.qkv_proj.weight"
    checkpoint[name] = checkpoint[name][:-1]
    with pytest.raises(ValueError, match=r"qkv_proj.weight' has 127 rows; qkv_proj fuses q_proj"):
        load(empty_model(folder), checkpoint)
