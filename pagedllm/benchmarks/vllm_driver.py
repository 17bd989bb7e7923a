"""Runs one `pagedllm bench` job through vLLM's offline API. It is executed as a script by the
python of vLLM's own virtualenv, where pagedllm is not installed, so it imports only vllm and
the standard library.

    VLLM_PYTHON vllm_driver.py JOB.json RESULT.json

JOB:    {"mode": "throughput" | "latency", "llm": keyword arguments of vllm.LLM(...),
         throughput: "temperature": float, "requests": [[prompt token ids, output len], ...],
         latency: "batches": [[[prompt token ids, output len], ...], ...]}
RESULT: {"vllm_version": str, "dtype": the dtype vLLM resolved (e.g. "bfloat16"),
         "startup_s": seconds of `import vllm` and `LLM(...)`,
         throughput: "elapsed_s": seconds of `LLM.generate` over all requests,
                     "prompt_tokens", "output_tokens": [one count per request, in order],
         latency: "batches": [{"first_token_s": [...], "finish_s": [...]}, ...], one entry per
                  request, in seconds since the batch's requests started being added}

Every request runs to its output length (ignore_eos). Latency steps vLLM's `LLMEngine` (the
loop `LLM.generate` runs) with delta outputs, as pagedllm's latency benchmark steps its own:
a request's first token is its first non-empty delta, its finish the output marked finished.
"""

import json
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm import LLM, LLMEngine


def main(job_path: str, result_path: str) -> None:
    start = time.perf_counter()
    with open(job_path) as f:
        job = json.load(f)
    import vllm

    llm = vllm.LLM(**job["llm"])
    result = {
        "vllm_version": vllm.__version__,
        "dtype": str(llm.llm_engine.model_config.dtype).removeprefix("torch."),
        "startup_s": time.perf_counter() - start,
    }
    result |= run_throughput(llm, job) if job["mode"] == "throughput" else run_latency(llm, job)
    with open(result_path, "w") as f:
        json.dump(result, f)


def run_throughput(llm: "LLM", job: dict) -> dict:
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": ids} for ids, _ in job["requests"]]
    params = [
        SamplingParams(temperature=job["temperature"], max_tokens=n, ignore_eos=True)
        for _, n in job["requests"]
    ]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return {
        "elapsed_s": elapsed,
        "prompt_tokens": [len(o.prompt_token_ids) for o in outputs],
        "output_tokens": [sum(len(c.token_ids) for c in o.outputs) for o in outputs],
    }


def run_latency(llm: "LLM", job: dict) -> dict:
    engine = llm.llm_engine
    batches = [
        latency_batch(engine, batch, f"latency-{i}") for i, batch in enumerate(job["batches"])
    ]
    return {"batches": batches}


def latency_batch(engine: "LLMEngine", batch: list, tag: str) -> dict:
    """Add the batch's requests (greedy), step the engine until all are done."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    start = time.perf_counter()
    ids = [f"{tag}-{i}" for i in range(len(batch))]
    for request_id, (prompt, output_len) in zip(ids, batch):
        params = SamplingParams(
            temperature=0.0,
            max_tokens=output_len,
            ignore_eos=True,
            output_kind=RequestOutputKind.DELTA,
        )
        engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
    first, finish = {}, {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            now = time.perf_counter() - start
            if output.outputs and output.outputs[0].token_ids:
                first.setdefault(output.request_id, now)
            if output.finished:
                finish[output.request_id] = now
    return {"first_token_s": [first[i] for i in ids], "finish_s": [finish[i] for i in ids]}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} JOB.json RESULT.json")
    main(sys.argv[1], sys.argv[2])
