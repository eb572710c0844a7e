"""Writes a GGUF file of random f16 weights in a given llama shape, with the tokenizer and
every other setting of a real GGUF file (`--like`): a model of a size realistic for a GPU for
`thicket bench forward` / `bench engine` cost curves, where only the shape matters. Its
output is noise; never use it for acceptance or quality.

    python3 benches/random_gguf.py --like models/smollm2-135m.gguf --out /tmp/llama-1b.gguf \
        --hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192

Needs numpy and gguf (pip install gguf).
"""

import argparse

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

SHAPE_KEYS = {"embedding_length", "block_count", "attention.head_count",
              "attention.head_count_kv", "feed_forward_length", "rope.dimension_count",
              "vocab_size"}


def copy_fields(reader, writer, arch):
    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name.startswith(arch + ".") and name[len(arch) + 1:] in SHAPE_KEYS:
            continue
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
    args = p.parse_args()

    reader = GGUFReader(args.like)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode("utf-8")
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    head_dim = args.hidden // args.heads
    writer = GGUFWriter(args.out, arch)
    copy_fields(reader, writer, arch)
    writer.add_uint32(f"{arch}.embedding_length", args.hidden)
    writer.add_uint32(f"{arch}.block_count", args.layers)
    writer.add_uint32(f"{arch}.attention.head_count", args.heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", args.kv_heads)
    writer.add_uint32(f"{arch}.feed_forward_length", args.ffn)
    writer.add_uint32(f"{arch}.rope.dimension_count", head_dim)

    rng = np.random.default_rng(0)

    def weight(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    ones = np.ones(args.hidden, dtype=np.float32)
    writer.add_tensor("token_embd.weight", weight(vocab, args.hidden))
    writer.add_tensor("output_norm.weight", ones)
    kv = args.kv_heads * head_dim
    for i in range(args.layers):
        b = f"blk.{i}"
        writer.add_tensor(f"{b}.attn_norm.weight", ones)
        writer.add_tensor(f"{b}.ffn_norm.weight", ones)
        writer.add_tensor(f"{b}.attn_q.weight", weight(args.hidden, args.hidden))
        writer.add_tensor(f"{b}.attn_k.weight", weight(kv, args.hidden))
        writer.add_tensor(f"{b}.attn_v.weight", weight(kv, args.hidden))
        writer.add_tensor(f"{b}.attn_output.weight", weight(args.hidden, args.hidden))
        writer.add_tensor(f"{b}.ffn_gate.weight", weight(args.ffn, args.hidden))
        writer.add_tensor(f"{b}.ffn_up.weight", weight(args.ffn, args.hidden))
        writer.add_tensor(f"{b}.ffn_down.weight", weight(args.hidden, args.ffn))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
