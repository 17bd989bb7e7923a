"""LoRA adapters served beside the base model (vLLM's multi-LoRA): docs/lora.md."""
