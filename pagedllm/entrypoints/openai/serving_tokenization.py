"""POST /tokenize and /detokenize (vLLM's extras): the server's tokenizer, no generation."""

from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.protocol import (
    DetokenizeRequest,
    TokenizeRequest,
)
from pagedllm.entrypoints.openai.responses import (
    DetokenizeResponse,
    TokenizeResponse,
)
from pagedllm.entrypoints.openai.serving_engine import OpenAIServing


class OpenAIServingTokenization(OpenAIServing):
    async def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        self.check_model(request.model)
        if (request.prompt is None) == (request.messages is None):
            raise OpenAIError("give exactly one of prompt and messages", param="prompt")
        if request.messages is not None:
            tokens = await self.chat_prompt_ids(request, request.add_special_tokens is True)
        else:
            tokens = await self.encode(request.prompt, request.add_special_tokens is not False)
        strs = await self.async_tokenizer.token_strs(tokens) if request.return_token_strs else None
        return TokenizeResponse(
            count=len(tokens), max_model_len=self.max_model_len, tokens=tokens, token_strs=strs
        )

    async def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        self.check_model(request.model)
        tokens = self.check_token_ids(request.tokens, "tokens")
        return DetokenizeResponse(prompt=await self.async_tokenizer.decode(tokens))
