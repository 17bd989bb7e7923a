"""Tiny tokenizers trained on tests/fixtures/perplexity.txt, saved as Hugging Face folders and
written with a tiny llama into GGUF files as llama.cpp's convert_hf_to_gguf.py writes them
(gguf.vocab's readers, gguf.SpecialVocab):

- `byte_level`: Llama 3's shape, a byte-level BPE (GGUF kind `gpt2`, pre-type `llama-bpe`)
  whose vocabulary has no `<|endoftext|>`;
- `sentencepiece`: Llama 2's shape, a byte-fallback BPE over "▁"-spelled text (GGUF kind
  `llama`), the normalizer of its tokenizer.json prepending "▁" and replacing spaces.
"""

import pathlib

import gguf
from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tests.gguf.tiny_gguf import GEMMAS, gguf_tensors, tiny_model, write_gguf

TEXT = (pathlib.Path(__file__).parents[1] / "fixtures" / "perplexity.txt").read_text().splitlines()
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def byte_level(folder: pathlib.Path) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TEXT, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
    )
    return _save(folder, tokenizer, bos_token=special[0], eos_token=special[1])


def sentencepiece(folder: pathlib.Path) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=900, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens], show_progress=False
    )
    tokenizer.train_from_iterator(["▁" + line.replace(" ", "▁") for line in TEXT], trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    return _save(folder, tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _save(folder: pathlib.Path, tokenizer: Tokenizer, **special: str) -> PreTrainedTokenizerFast:
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def write_tokenizer_gguf(path: str, folder: pathlib.Path, kind: str, arch: str = "llama") -> None:
    """A tiny model of `arch` with the folder's tokenizer, `kind` "gpt2" (byte_level) or
    "llama" (sentencepiece), its embedding one row per token. A Gemma's sentencepiece
    vocabulary has no space prefix (convert_hf_to_gguf.py's GemmaModel.set_vocab)."""
    hf = AutoTokenizer.from_pretrained(folder)
    model = tiny_model(arch, vocab_size=len(hf))
    tensors = gguf_tensors(arch, model.config, model.state_dict())

    def edit(writer: gguf.GGUFWriter) -> None:
        _add_vocab(writer, folder, kind, hf)
        if arch in GEMMAS:
            writer.add_add_space_prefix(False)

    write_gguf(path, arch, model.config, tensors, edit=edit)


def _add_vocab(writer: gguf.GGUFWriter, folder: pathlib.Path, kind: str, hf) -> None:
    if kind == "llama":
        tokens, scores, types = zip(*gguf.vocab.LlamaHfVocab(folder).all_tokens())
        writer.add_token_scores(list(scores))
        writer.add_tokenizer_pre("default")
    else:  # convert_hf_to_gguf.py get_vocab_base: added tokens are control or user-defined
        by_id = {i: token for token, i in hf.get_vocab().items()}
        tokens = [by_id[i] for i in range(len(hf))]
        added = hf.added_tokens_decoder
        types = [
            gguf.TokenType.CONTROL if i in added and added[i].special else gguf.TokenType.NORMAL
            for i in range(len(hf))
        ]
        writer.add_tokenizer_pre("llama-bpe")
    writer.add_tokenizer_model(kind)
    writer.add_token_list(list(tokens))
    writer.add_token_types(list(types))
    gguf.SpecialVocab(folder, load_merges=kind == "gpt2", n_vocab=len(tokens)).add_to_gguf(writer)
