"""A tiny Llama whose greedy answer is a fixed chain of words, with a word-level tokenizer
(output words mark a leading space with "▁", as SentencePiece does: a decoder llguidance
reads, so structured outputs run on it) and a chat template: a model made to think and to
call tools, so the server's reasoning and tool parsers run on real engine output.

The weights make the model a bigram table: the embedding is one-hot, attention and MLP
write nothing (o_proj and down_proj are zero), so the final hidden state is the last
token's one-hot vector and `lm_head` maps it to the next word of `NEXT`.
"""

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from tests.models.tiny_models import COMMON

CALL = ['{"name":', '▁"get_weather",', '▁"arguments":', '▁{"city":', '▁"Paris"}}']
# After the generation prompt's last word, the answer is the chain of NEXT to </s>.
NEXT = {
    "assistant": "<think>",
    "<think>": "hmm",
    "hmm": "</think>",
    "</think>": "<tool_call>",
    "<tool_call>": CALL[0],
    **dict(zip(CALL, CALL[1:])),
    CALL[-1]: "</tool_call>",
    "</tool_call>": "</s>",
    "answer": "It",
    "It": "▁is",
    "▁is": "▁sunny",
    "▁sunny": "</s>",
}
# The vocabulary: the special tokens first (ids 0, 1, 2), the words of the tests' messages,
# and the chain's.
WORDS = ["<unk>", "<s>", "</s>", "user", "tool", "tools", "call", "get_weather", "Paris", "sunny"]
WORDS += ["call_1", "Weather?", *NEXT, *NEXT.values()]
ANSWER_REASONING = "hmm"
ANSWER_CALL = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
# One token (never the greedy choice) that is the only answer WEATHER allows: structured
# outputs force it where they apply.
WEATHER = {
    "type": "object",
    "properties": {"weather": {"enum": ["sunny"]}},
    "required": ["weather"],
    "additionalProperties": False,
}
ANSWER_JSON = '{"weather": "sunny"}'
WORDS.append(ANSWER_JSON)
# Likewise the only reply of the generic tool format (generic_tools.py) the words allow,
# in two tokens: its alternatives' common start `{"` is forced, so it must be one.
GENERIC_REPLY = ['{"', 'response": "It is sunny"}']
ANSWER_GENERIC_REPLY = "".join(GENERIC_REPLY)
WORDS += GENERIC_REPLY
NEXT[GENERIC_REPLY[0]] = GENERIC_REPLY[1]

# Words separated by spaces. A tool result's turn ends with "answer", any other with
# "assistant"; enable_thinking=false closes an empty think part (Qwen3's way) and
# think_in_prompt opens one (DeepSeek-R1-Distill's way).
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}"
    "{% if m.tool_call_id %} {{ m.tool_call_id }}{% endif %}"
    "{% for c in m.tool_calls or [] %} call {{ c.function.name }} "
    "{{ c.function.arguments.city }}{% endfor %}"
    " {{ m.content }} {% endfor %}"
    "{% if tools %}tools{% for t in tools %} {{ t.function.name }}{% endfor %} {% endif %}"
    "{% if add_generation_prompt %}"
    "{% if messages[-1].role == 'tool' %}answer{% else %}assistant{% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %} <think> </think>{% endif %}"
    "{% if think_in_prompt %} <think>{% endif %}"
    "{% endif %}"
)


def save_scripted_model(folder: str) -> None:
    vocab = {word: i for i, word in enumerate(dict.fromkeys(WORDS))}
    size = len(vocab)
    assert (vocab["<s>"], vocab["</s>"]) == (COMMON["bos_token_id"], COMMON["eos_token_id"])
    hidden = size + size % 2  # RoPE needs an even head size; the extra dim stays 0
    sizes = dict(vocab_size=size, hidden_size=hidden, intermediate_size=8, num_hidden_layers=1)
    heads = dict(num_attention_heads=1, num_key_value_heads=1)
    config = transformers.LlamaConfig(**COMMON | sizes | heads, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(size, hidden))
        model.model.norm.weight.fill_(1.0)
        model.model.layers[0].input_layernorm.weight.fill_(1.0)
        model.model.layers[0].post_attention_layernorm.weight.fill_(1.0)
        for word, i in vocab.items():
            model.lm_head.weight[vocab[NEXT.get(word, "</s>")], i] = 10.0
    model.save_pretrained(folder)
    save_tokenizer(vocab, folder)


def save_tokenizer(vocab: dict[str, int], folder: str) -> None:
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    space = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(space)
    backend.add_tokens([ANSWER_JSON])  # one token, spaces and all, as llguidance tokenizes it
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
