"""Writes a GGUF file of random weights in a given shape, with the tokenizer and every other
setting of a real GGUF file (`--like`): a model of a realistic size for `thicket bench
forward` / `bench engine` cost curves and for `llama-bench` on the same file, where only the
shape matters. Its output is noise; never use it for acceptance or quality.

    python3 benches/random_gguf.py --like models/smollm2-135m.gguf --out /tmp/llama-1b.gguf \
        --hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192

Qwen3-4B's shape (QK norm, heads of 128 over a residual of 2560), Q4_0 projections and a Q8_0
tied embedding, with Qwen2.5's tokenizer (the same vocabulary):

    python3 benches/random_gguf.py --like models/qwen2.5-coder-0.5b.gguf --arch qwen3 \
        --out /tmp/qwen3-4b-shape.gguf --hidden 2560 --layers 36 --heads 32 --kv-heads 8 \
        --head-dim 128 --ffn 9728 --quant q4_0 --embd-quant q8_0

Qwen3-30B-A3B's shape (a mixture of 128 experts of 768, 8 per token, in every layer; 24 of
its 48 layers), Q4_0 experts and projections, Q8_0 embedding and head:

    python3 benches/random_gguf.py --like models/qwen2.5-coder-0.5b.gguf --arch qwen3moe \
        --out /tmp/qwen3-30b-a3b-shape.gguf --hidden 2048 --layers 24 --heads 32 \
        --kv-heads 4 --head-dim 128 --ffn 6144 --experts 128 --experts-used 8 \
        --expert-ffn 768 --quant q4_0 --embd-quant q8_0 --untied

LFM2-1.2B's shape (a hybrid: ten of its sixteen layers a gated short convolution of three
positions, the others attending), Q4_0 projections, Q8_0 embedding, with SmolLM2's tokenizer:

    python3 benches/random_gguf.py --like models/smollm2-135m.gguf --arch lfm2 \
        --out /tmp/lfm2-1.2b-shape.gguf --hidden 2048 --layers 16 --heads 32 --kv-heads 8 \
        --ffn 8192 --attention-layers 2,5,8,10,12,14 --quant q4_0 --embd-quant q8_0

Quantized weights are random blocks (random quants under one small scale per block), written
without quantizing floats first, so a file of many gigabytes takes seconds per gigabyte.

Needs numpy and gguf (pip install gguf).
"""

import argparse

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

SHAPE_KEYS = {"embedding_length", "block_count", "attention.head_count",
              "attention.head_count_kv", "feed_forward_length", "rope.dimension_count",
              "vocab_size"}


def copy_fields(reader, writer, arch, new_arch):
    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name.startswith(arch + ".") and name[len(arch) + 1:] in SHAPE_KEYS:
            continue
        if name.startswith(arch + "."):
            name = new_arch + name[len(arch):]
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_key_value(name, values, kind, sub_type=sub)
        elif kind == GGUFValueType.STRING:
            writer.add_key_value(name, bytes(field.parts[field.data[0]]).decode("utf-8"), kind)
        else:
            writer.add_key_value(name, field.parts[field.data[0]].tolist()[0], kind)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--like", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=8192)
    p.add_argument("--arch", help="architecture to write (default: --like's)")
    p.add_argument("--head-dim", type=int, help="default: hidden / heads")
    p.add_argument("--quant", default="f16", choices=["f16", "q8_0", "q4_0"])
    p.add_argument("--embd-quant", default=None, choices=["f16", "q8_0", "q4_0"])
    p.add_argument("--experts", type=int, default=0, help="a mixture of this many experts")
    p.add_argument("--experts-used", type=int, default=8)
    p.add_argument("--expert-ffn", type=int, default=768)
    p.add_argument("--untied", action="store_true", help="write output.weight")
    p.add_argument("--attention-layers", help="lfm2: the layers that attend (the others convolve)")
    p.add_argument("--conv-kernel", type=int, default=3, help="lfm2: positions a convolution spans")
    args = p.parse_args()

    reader = GGUFReader(args.like)
    like_arch = bytes(reader.fields["general.architecture"].parts[-1]).decode("utf-8")
    arch = args.arch or like_arch
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    head_dim = args.head_dim or args.hidden // args.heads
    writer = GGUFWriter(args.out, arch)
    copy_fields(reader, writer, like_arch, arch)
    writer.add_uint32(f"{arch}.attention.key_length", head_dim)
    writer.add_uint32(f"{arch}.attention.value_length", head_dim)
    writer.add_uint32(f"{arch}.embedding_length", args.hidden)
    writer.add_uint32(f"{arch}.block_count", args.layers)
    writer.add_uint32(f"{arch}.attention.head_count", args.heads)
    attending = set(range(args.layers))
    if arch == "lfm2":
        attending = {int(i) for i in (args.attention_layers or "").split(",") if i}
        per_layer = [args.kv_heads if i in attending else 0 for i in range(args.layers)]
        writer.add_array(f"{arch}.attention.head_count_kv", per_layer)
        writer.add_uint32(f"{arch}.shortconv.l_cache", args.conv_kernel)
    else:
        writer.add_uint32(f"{arch}.attention.head_count_kv", args.kv_heads)
    writer.add_uint32(f"{arch}.feed_forward_length", args.ffn)
    writer.add_uint32(f"{arch}.rope.dimension_count", head_dim)
    if args.experts:
        writer.add_uint32(f"{arch}.expert_count", args.experts)
        writer.add_uint32(f"{arch}.expert_used_count", args.experts_used)
        writer.add_uint32(f"{arch}.expert_feed_forward_length", args.expert_ffn)

    rng = np.random.default_rng(0)
    kinds = {"f16": None, "q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0}

    # Bytes per block of 32 values (an f16 scale first), and the scale that gives weights of
    # about 0.02.
    blocks = {GGMLQuantizationType.Q8_0: (34, 0.02 / 64), GGMLQuantizationType.Q4_0: (18, 0.02 / 8)}

    def weight(rows, cols, quant=args.quant, stack=None):
        kind = kinds[quant]
        shape = (rows, cols) if stack is None else (stack, rows, cols)
        if kind is None:
            w = rng.standard_normal(shape, dtype=np.float32) * 0.02
            return {"tensor": w.astype(np.float16)}
        # Random quants under one scale per block, as the format lays them out.
        size, d = blocks[kind]
        raw = rng.integers(0, 256, size=shape[:-1] + (cols // 32, size), dtype=np.uint8)
        scale = np.frombuffer(np.float16(d).tobytes(), dtype=np.uint8)
        raw[..., 0:2] = scale
        return {"tensor": raw.reshape(shape[:-1] + (cols // 32 * size,)), "raw_dtype": kind}

    def add(name, w):
        writer.add_tensor(name, w["tensor"], raw_dtype=w.get("raw_dtype"))

    ones = np.ones(args.hidden, dtype=np.float32)
    add("token_embd.weight", weight(vocab, args.hidden, args.embd_quant or args.quant))
    if args.untied:
        add("output.weight", weight(vocab, args.hidden, args.embd_quant or args.quant))
    # LFM2's converter names the final norm after the embedding.
    writer.add_tensor("token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight", ones)
    kv = args.kv_heads * head_dim
    width = args.heads * head_dim
    for i in range(args.layers):
        b = f"blk.{i}"
        writer.add_tensor(f"{b}.attn_norm.weight", ones)
        writer.add_tensor(f"{b}.ffn_norm.weight", ones)
        if i not in attending:
            taps = rng.standard_normal((args.hidden, args.conv_kernel), dtype=np.float32) * 0.5
            writer.add_tensor(f"{b}.shortconv.conv.weight", taps)
            add(f"{b}.shortconv.in_proj.weight", weight(3 * args.hidden, args.hidden))
            add(f"{b}.shortconv.out_proj.weight", weight(args.hidden, args.hidden))
        else:
            if arch in ("qwen3", "qwen3moe", "gemma3", "lfm2"):
                norm = np.ones(head_dim, dtype=np.float32)
                writer.add_tensor(f"{b}.attn_q_norm.weight", norm)
                writer.add_tensor(f"{b}.attn_k_norm.weight", norm)
            add(f"{b}.attn_q.weight", weight(width, args.hidden))
            add(f"{b}.attn_k.weight", weight(kv, args.hidden))
            add(f"{b}.attn_v.weight", weight(kv, args.hidden))
            add(f"{b}.attn_output.weight", weight(args.hidden, width))
        if args.experts:
            n, e = args.experts, args.expert_ffn
            router = rng.standard_normal((n, args.hidden), dtype=np.float32) * 0.02
            writer.add_tensor(f"{b}.ffn_gate_inp.weight", router)
            add(f"{b}.ffn_gate_exps.weight", weight(e, args.hidden, stack=n))
            add(f"{b}.ffn_up_exps.weight", weight(e, args.hidden, stack=n))
            add(f"{b}.ffn_down_exps.weight", weight(args.hidden, e, stack=n))
            continue
        add(f"{b}.ffn_gate.weight", weight(args.ffn, args.hidden))
        add(f"{b}.ffn_up.weight", weight(args.ffn, args.hidden))
        add(f"{b}.ffn_down.weight", weight(args.hidden, args.ffn))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
