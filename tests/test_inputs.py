"""vLLM's prompt types (pagedllm/inputs.py). Reference: vLLM's TypedDicts (TextPrompt's
`prompt`; TokensPrompt's `prompt_token_ids` and optional `prompt`; both's optional
`cache_salt`, exported from the package
as `from vllm import TokensPrompt`), and transformers' greedy tokens for a TokensPrompt's ids."""

import pytest

import pagedllm
from pagedllm import LLM, SamplingParams
from pagedllm.inputs import TextPrompt, TokensPrompt, check_prompt_dict
from tests.engine.engine_helpers import LLAMA


def test_the_prompt_types_are_vllms_typed_dicts() -> None:
    assert TextPrompt(prompt="Hi") == {"prompt": "Hi"}
    assert TokensPrompt(prompt_token_ids=[1, 2]) == {"prompt_token_ids": [1, 2]}
    assert TextPrompt.__required_keys__ == {"prompt"}
    assert TokensPrompt.__required_keys__ == {"prompt_token_ids"}
    assert TextPrompt.__optional_keys__ == {"cache_salt"}
    assert TokensPrompt.__optional_keys__ == {"prompt", "cache_salt"}
    assert (pagedllm.TextPrompt, pagedllm.TokensPrompt) == (TextPrompt, TokensPrompt)


@pytest.mark.parametrize(
    "prompt, error, message",
    [
        ({"prompt_token_ids": [1], "multi_modal_data": {}}, ValueError, r"\['multi_modal_data'\]"),
        ({"prompt": "Hi", "cache_salt": ""}, ValueError, "'cache_salt' must be a non-empty str"),
        ({"prompt": "Hi", "cache_salt": 5}, ValueError, "'cache_salt' must be a non-empty str"),
        ({"prompt_ids": [1]}, ValueError, "'prompt_token_ids', 'prompt' and 'cache_salt'"),
        ({"prompt": 5}, TypeError, "'prompt' must be a str, got int"),
    ],
)
def test_a_prompt_dict_pagedllm_cannot_honour_is_refused(prompt, error, message) -> None:
    """An image or a misspelt key would otherwise be dropped without a word; a cache salt
    must be vLLM's non-empty string."""
    with pytest.raises(error, match=message):
        check_prompt_dict(prompt)
    check_prompt_dict({"prompt": "Hi", "cache_salt": "s"})


def test_generate_takes_a_tokens_prompt_as_it_is(tiny_model_path, hf_greedy) -> None:
    """Its ids go to the model (transformers' greedy tokens follow), its text is echoed and
    never tokenized (this engine has no tokenizer), and a multimodal key is refused."""
    llm = LLM(
        tiny_model_path(LLAMA),
        skip_tokenizer_init=True,
        dtype="float32",
        device="cpu",
        num_kv_blocks=16,
        max_model_len=128,
    )
    ids = [5, 6, 7]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompt = TokensPrompt(prompt_token_ids=ids, prompt="five six seven")
    (out,) = llm.generate(prompt, params, use_tqdm=False)
    assert (out.prompt, out.prompt_token_ids) == ("five six seven", ids)
    assert out.outputs[0].token_ids == hf_greedy(LLAMA, [ids], 4)[0].token_ids
    with pytest.raises(ValueError, match="multi_modal_data"):
        llm.generate({**prompt, "multi_modal_data": {"image": None}}, params, use_tqdm=False)
