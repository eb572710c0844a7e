"""The baseline users know, on the same GPU and weights as `thicket bench`: Hugging Face
transformers' `generate` on a GGUF file (dequantized by transformers to `--dtype`), greedy,
every request a fixed `--max-tokens` long (EOS ignored, as `thicket bench engine` does).
Prints one JSON line per measurement: plain decoding at batch 1, prompt-lookup assisted
generation at batch 1, and plain decoding of `--batch` prompts in one padded `generate`.

    python3 benches/hf_baseline.py --gguf models/smollm2-135m.gguf

Needs torch, transformers and gguf (pip install gguf) and a CUDA GPU.
"""

import argparse
import json
import os
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def prompts(path, count):
    out = []
    with open(path) as f:
        for line in f:
            out.append(json.loads(line)["turns"][0])
            if len(out) == count:
                break
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gguf", required=True)
    p.add_argument("--data", default="benches/data/spec_bench_dev.jsonl")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--solo", type=int, default=8, help="prompts run one at a time")
    p.add_argument("--batch", type=int, default=64, help="prompts in the batched run")
    p.add_argument("--dtype", default="float16")
    args = p.parse_args()

    directory, name = os.path.split(os.path.abspath(args.gguf))
    dtype = getattr(torch, args.dtype)
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=dtype)
    model = model.to("cuda").eval()
    texts = [
        tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                add_generation_prompt=True)
        for t in prompts(args.data, max(args.solo, args.batch))
    ]
    fixed = dict(max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens,
                 do_sample=False, pad_token_id=tok.pad_token_id)

    def timed(batch, **extra):
        enc = tok(batch, return_tensors="pt", padding=True).to("cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**enc, **fixed, **extra)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        return (out.shape[1] - enc["input_ids"].shape[1]) * len(batch), seconds

    timed(texts[:1])  # warm-up: kernels, allocator
    gpu = torch.cuda.get_device_name(0)
    for label, extra in [("plain", {}), ("prompt_lookup", {"prompt_lookup_num_tokens": 10})]:
        tokens = seconds = 0.0
        for text in texts[: args.solo]:
            n, s = timed([text], **extra)
            tokens += n
            seconds += s
        print(json.dumps({"gpu": gpu, "run": f"batch 1, {label}", "dtype": args.dtype,
                          "tokens": tokens, "seconds": round(seconds, 3),
                          "tokens_per_s": round(tokens / seconds, 1)}), flush=True)
    n, s = timed(texts[: args.batch])
    print(json.dumps({"gpu": gpu, "run": f"batch {args.batch}, plain", "dtype": args.dtype,
                      "tokens": n, "seconds": round(s, 3),
                      "tokens_per_s": round(n / s, 1)}), flush=True)


if __name__ == "__main__":
    main()
