"""A GGUF file (llama.cpp's format) read as a Hugging Face checkpoint: its config, its tensors
under HF names and layouts, and its tokenizer, so a GGUF model loads like a safetensors one.

Supported architectures: those of hf_config.py (a llama file with experts is Mixtral).

reader.py parses the file; hf_config.py, tensor_names.py and tokenizer.py translate what it
holds into transformers' terms. Nothing here imports the rest of pagedllm, so the config, the
loader and the engine can all build on it.
"""
