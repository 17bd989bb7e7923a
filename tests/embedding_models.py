"""Tiny pooling checkpoints for the embedding tests: a tiny random model's folder with a
byte-level tokenizer (its 259 ids fit the tiny vocabulary of 320), marked Matryoshka, and
transformers' pooled hidden states of it (the reference)."""

import json
import os
import shutil

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def save_byte_tokenizer(folder: str, specials: bool = False) -> None:
    """A byte-level BPE without merges: <unk>=0, <s>=1, </s>=2 (the tiny configs' BOS and
    EOS), then one id per byte. `specials`: encoding adds <s> and </s> around a text (as
    Qwen3-Embedding's appends its EOS), and a plain chat template."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {c: i + 3 for i, c in enumerate(alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    if specials:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)]
        )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    if specials:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)


def embedding_folder(
    source: str, folder: str, matryoshka: bool = True, specials: bool = False
) -> str:
    """A copy of the tiny checkpoint `source` with a tokenizer (`save_byte_tokenizer`), its
    config marked `is_matryoshka` (vLLM's flag) when asked."""
    shutil.copytree(source, folder, dirs_exist_ok=True)
    save_byte_tokenizer(folder, specials)
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["is_matryoshka"] = matryoshka
    with open(path, "w") as f:
        json.dump(config, f)
    return folder


def hf_embedding(
    model: torch.nn.Module, token_ids: list[int], pooling_type: str, normalize: bool = True
) -> torch.Tensor:
    """transformers' AutoModel: the final hidden states (after the final norm) of the
    prompt, pooled (LAST: last token, MEAN: mean over tokens, CLS: first token)."""
    with torch.no_grad():
        hidden = model(torch.tensor([token_ids])).last_hidden_state[0].float()
    pooled = {"LAST": hidden[-1], "MEAN": hidden.mean(dim=0), "CLS": hidden[0]}[pooling_type]
    return F.normalize(pooled, dim=-1) if normalize else pooled


def save_sentence_transformers_files(folder: str, pooling_mode: str, normalize: bool) -> None:
    """modules.json and 1_Pooling/config.json as sentence-transformers writes them."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    with open(os.path.join(folder, "modules.json"), "w") as f:
        json.dump(modules, f)
    os.makedirs(os.path.join(folder, "1_Pooling"), exist_ok=True)
    modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "lasttoken")
    pooling = {"word_embedding_dimension": 64}
    pooling |= {f"pooling_mode_{m}": m == pooling_mode for m in modes}
    with open(os.path.join(folder, "1_Pooling", "config.json"), "w") as f:
        json.dump(pooling, f)


def add_dense_module(
    folder: str, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None
) -> None:
    """A sentence-transformers Dense module (`2_Dense`: config.json and model.safetensors,
    as sentence-transformers saves them) between the Pooling and any Normalize module."""
    with open(os.path.join(folder, "modules.json")) as f:
        modules = json.load(f)
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    modules.insert(2, dense)
    with open(os.path.join(folder, "modules.json"), "w") as f:
        json.dump(modules, f)
    os.makedirs(os.path.join(folder, "2_Dense"), exist_ok=True)
    out_features, in_features = weight.shape
    config = {"in_features": in_features, "out_features": out_features, "bias": bias is not None}
    if activation is not None:
        config["activation_function"] = activation
    with open(os.path.join(folder, "2_Dense", "config.json"), "w") as f:
        json.dump(config, f)
    tensors = {"linear.weight": weight} | ({} if bias is None else {"linear.bias": bias})
    save_file(tensors, os.path.join(folder, "2_Dense", "model.safetensors"))
