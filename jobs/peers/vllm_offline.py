"""vLLM's offline `generate` over a prompt list, timed: a peer for `accelgen bench job=true`.

Runs with the python of a separate virtual environment that holds vLLM (docs/benchmarks.md, "Whole
jobs, cold and warm, against peers"); it imports nothing of this project. Engine start-up (`load_s`) is timed apart from
`generate` (`generate_s`, one entry per repeat after one untimed warm-up), and all prompts are
given to one `generate` call: vLLM schedules them itself. `--one-at-a-time` gives them one call each
instead, in turn: the batch-1 latency a peer of `accelgen bench batch_sizes=[1]` is measured at.

    python jobs/peers/vllm_offline.py --model DIR --prompts prompts.json --max-tokens 64 \
        --repeats 3 --method plain|ngram [--dtype bfloat16] [--one-at-a-time] --out result.json
"""

from __future__ import annotations

import argparse
import json
import time

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def main() -> None:
    from vllm import LLM, SamplingParams

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True, help="a JSON list of prompt texts")
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--method", choices=("plain", "ngram"), default="plain")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--one-at-a-time", action="store_true", help="one generate call per prompt, in turn")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.prompts) as f:
        prompts = json.load(f)
    started = time.perf_counter()
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        enforce_eager=True,
        speculative_config=NGRAM if args.method == "ngram" else None,
    )
    load_s = time.perf_counter() - started
    # Fixed length, greedy: comparable with a job run with generation.ignore_eos=true.
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    calls = [[p] for p in prompts] if args.one_at_a_time else [prompts]
    llm.generate(calls[0], params, use_tqdm=False)  # warm-up
    times, tokens = [], 0
    for _ in range(args.repeats):
        started = time.perf_counter()
        outputs = [o for call in calls for o in llm.generate(call, params, use_tqdm=False)]
        times.append(time.perf_counter() - started)
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    record = {"method": args.method, "dtype": args.dtype, "one_at_a_time": args.one_at_a_time}
    with open(args.out, "w") as f:
        json.dump({**record, "load_s": load_s, "generate_s": times, "tokens": tokens}, f)


if __name__ == "__main__":
    main()
