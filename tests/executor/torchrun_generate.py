"""Run under torchrun: every rank builds the LLM; rank 0 generates and prints token ids,
the other ranks serve as its workers and exit inside LLM(). Arguments: model, prompt ids
(JSON), tensor_parallel_size, pipeline_parallel_size."""

import json
import sys

from pagedllm import LLM, SamplingParams

if __name__ == "__main__":
    model, prompt = sys.argv[1], json.loads(sys.argv[2])
    tp, pp = int(sys.argv[3]), int(sys.argv[4])
    llm = LLM(
        model,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        skip_tokenizer_init=True,
        num_kv_blocks=256,
        dtype="float32",
    )
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    output = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    print("TOKENS", json.dumps(output.outputs[0].token_ids))
    llm.close()
