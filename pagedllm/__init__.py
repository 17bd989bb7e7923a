"""pagedllm: an LLM inference engine with a paged KV cache."""
