"""pagedllm/models/ernie4_5.py beyond the shared comparison with transformers
(test_models_vs_transformers.py): the checkpoints Baidu released for their own modeling code
name `Ernie4_5_ForCausalLM` with an `auto_map` (model_type `ernie4_5`, the fields
transformers' Ernie4_5Config reads), which vLLM runs as its Ernie 4.5; so does pagedllm, with
the same logits as transformers' Ernie4_5ForCausalLM on the same weights."""

import json
import shutil
from pathlib import Path

import torch
import transformers

from pagedllm.config import ModelConfig
from pagedllm.model_loader.loader import get_model
from tests.models.test_models_vs_transformers import paged_greedy

RELEASED = {
    "architectures": ["Ernie4_5_ForCausalLM"],
    "auto_map": {
        "AutoConfig": "configuration_ernie4_5.Ernie4_5_Config",
        "AutoModel": "modeling_ernie4_5.Ernie4_5_Model",
        "AutoModelForCausalLM": "modeling_ernie4_5.Ernie4_5_ForCausalLM",
    },
}


def test_the_released_remote_code_name_runs_as_ernie_4_5(tiny_model_path, tmp_path) -> None:
    native = tiny_model_path("ernie4_5")
    released = shutil.copytree(native, tmp_path / "released")
    config = Path(released) / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | RELEASED))
    model = get_model(ModelConfig.create(str(released), dtype="float32"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(native, dtype=torch.float32).eval()
    prompt = [5, 17, 60, 3, 33, 42, 7]
    seqs, logits = paged_greedy(model, [prompt])
    with torch.no_grad():
        ref = hf(torch.tensor([seqs[0][:-1]])).logits[0]
    torch.testing.assert_close(logits[0], ref, atol=1e-4, rtol=0)
