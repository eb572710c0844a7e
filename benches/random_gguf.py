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

Qwen3.6-35B-A3B's shape (Qwen3.5's hybrid: three Gated DeltaNet layers to one of gated
attention, `full_attention_interval` 4, and in every layer a mixture of 256 experts of 512, 8
per token, beside a shared expert of 512; 8 of its 40 layers, so layers 3 and 7 attend), Q4_0
experts and projections, Q8_0 embedding and untied head. Attention: 16 query heads (each with
its output gate) and 2 KV heads of 256, RoPE on the first 64 of them (partial_rotary_factor
0.25) with theta 1e7 and sections 11,11,10,0; DeltaNet: 16 key heads and 32 value heads of 128,
a convolution of 4 positions; RMS eps 1e-6. The real vocabulary is 248,320 tokens; with
`--like` Qwen2.5 the tokenizer, and so the embedding and head, is Qwen2.5's 151,936 tokens
(about 0.42 GB less at Q8_0). About 4.5 GB (dense Qwen3.5 is `--arch qwen35` with `--ffn`):

    python3 benches/random_gguf.py --like models/qwen2.5-coder-0.5b.gguf --arch qwen35moe \
        --out /tmp/qwen3.6-35b-a3b-shape.gguf --hidden 2048 --layers 8 --heads 16 \
        --kv-heads 2 --head-dim 256 --rotary-dim 64 --rope-theta 1e7 --rope-sections 11,11,10,0 \
        --rms-eps 1e-6 --full-attention-interval 4 --linear-key-heads 16 \
        --linear-value-heads 32 --linear-head-dim 128 --conv-kernel 4 --experts 256 \
        --experts-used 8 --expert-ffn 512 --shared-expert-ffn 512 --quant q4_0 \
        --embd-quant q8_0 --untied

gpt-oss-20b's shape (24 layers over a residual of 2880, 64 query and 8 KV heads of 64, every
other layer windowed at 128 tokens, a sink per query head, biases on q/k/v/o, a biased router
over 32 biased experts of 2880, 4 per token, YaRN by 32 from 4096), MXFP4 experts as the
released files keep them, Q8_0 attention, embedding and head (the released GGUFs' own mix is
close to this), with Qwen2.5's tokenizer for o200k's (201,088 tokens; the embedding and head
are about 0.1 GB smaller). About 12.5 GB for 24 layers; `--layers 6` keeps a quarter:

    python3 benches/random_gguf.py --like models/qwen2.5-coder-0.5b.gguf --arch gpt-oss \
        --out /tmp/gpt-oss-20b-shape.gguf --hidden 2880 --layers 24 --heads 64 --kv-heads 8 \
        --head-dim 64 --experts 32 --experts-used 4 --expert-ffn 2880 --rope-theta 150000 \
        --rms-eps 1e-5 --quant q8_0 --expert-quant mxfp4 --untied

Gemma 4 E4B's shape (42 layers over a residual of 2560; five layers windowed at 512 tokens
to one global; 8 query heads, 2 KV heads of 256 in the windowed layers and of 512 in the
global ones, whose RoPE turns a quarter of the pairs; the last 18 layers reading the keys and
values of the last two that keep them; per-layer embeddings of 256; MLPs of 10240; a final
soft-cap of 30), Q4_0 projections, Q8_0 embedding (tied) and per-layer table, with Gemma 3's
tokenizer (the same 262,144-token size). About 5.5 GB:

    python3 benches/random_gguf.py --like models/gemma3-270m.gguf --arch gemma4 \
        --out /tmp/gemma4-e4b-shape.gguf --hidden 2560 --layers 42 --heads 8 --kv-heads 2 \
        --head-dim 256 --global-head-dim 512 --sliding-window 512 --window-period 6 \
        --shared-kv-layers 18 --per-layer-width 256 --ffn 10240 --quant q4_0 \
        --embd-quant q8_0

Gemma 4 26B-A4B's shape (30 layers over 2816; 16 query heads, 8 KV heads of 256 windowed at
1024 and 2 of 512 global, whose values are their keys' projection; a dense MLP of 2112 beside
128 experts of 704, 8 per token, in every layer) takes `--global-kv-heads 2 --keys-as-values
--experts 128 --experts-used 8 --expert-ffn 704 --ffn 2112 --per-layer-width 0
--shared-kv-layers 0 --sliding-window 1024`.

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


QWEN35 = ("qwen35", "qwen35moe")


def copy_fields(reader, writer, arch, new_arch, skip=SHAPE_KEYS):
    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name.startswith(arch + ".") and name[len(arch) + 1:] in skip:
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
    p.add_argument("--expert-quant", default=None, choices=["f16", "q8_0", "q4_0", "mxfp4"],
                   help="the experts' type (default --quant)")
    p.add_argument("--sliding-window", type=int, default=128,
                   help="gpt-oss, gemma4: the windowed layers' window")
    p.add_argument("--window-period", type=int, default=6,
                   help="gemma4: every this-many-th layer is global, the others windowed")
    p.add_argument("--global-head-dim", type=int, default=512,
                   help="gemma4: the global layers' head width")
    p.add_argument("--global-kv-heads", type=int, help="gemma4: their KV heads (default --kv-heads)")
    p.add_argument("--keys-as-values", action="store_true",
                   help="gemma4: the global layers read their keys' projection as values")
    p.add_argument("--shared-kv-layers", type=int, default=0,
                   help="gemma4: the last layers reading earlier layers' keys and values")
    p.add_argument("--per-layer-width", type=int, default=0,
                   help="gemma4: per-layer embeddings of this width (0: none)")
    p.add_argument("--experts", type=int, default=0, help="a mixture of this many experts")
    p.add_argument("--experts-used", type=int, default=8)
    p.add_argument("--expert-ffn", type=int, default=768)
    p.add_argument("--untied", action="store_true", help="write output.weight")
    p.add_argument("--attention-layers", help="lfm2: the layers that attend (the others convolve)")
    p.add_argument("--conv-kernel", type=int,
                   help="lfm2, qwen35: positions a convolution spans (default 3, qwen35 4)")
    p.add_argument("--rotary-dim", type=int, help="RoPE on this many of a head's dims (default all)")
    p.add_argument("--rope-theta", type=float, help="default: --like's")
    p.add_argument("--rms-eps", type=float, help="default: --like's")
    p.add_argument("--rope-sections", help="qwen35: four multimodal RoPE sections, summing to "
                   "rotary dim / 2 (default all in the first: text positions are the same in "
                   "each, so the split does not change the result)")
    p.add_argument("--full-attention-interval", type=int, default=4,
                   help="qwen35: every this-many-th layer attends, the others are Gated DeltaNet")
    p.add_argument("--linear-key-heads", type=int, default=16, help="qwen35: DeltaNet key heads")
    p.add_argument("--linear-value-heads", type=int, default=32,
                   help="qwen35: DeltaNet value heads")
    p.add_argument("--linear-head-dim", type=int, default=128,
                   help="qwen35: DeltaNet key and value head width (llama.cpp needs them equal)")
    p.add_argument("--shared-expert-ffn", type=int,
                   help="qwen35moe: the shared expert's width (default --expert-ffn)")
    args = p.parse_args()

    reader = GGUFReader(args.like)
    like_arch = bytes(reader.fields["general.architecture"].parts[-1]).decode("utf-8")
    arch = args.arch or like_arch
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    head_dim = args.head_dim or args.hidden // args.heads
    rotary_dim = args.rotary_dim or head_dim
    qwen35 = arch in QWEN35
    if qwen35 and (arch == "qwen35moe") != bool(args.experts):
        p.error("qwen35moe needs --experts, qwen35 takes none")
    if qwen35 and args.linear_value_heads % args.linear_key_heads:
        p.error("--linear-value-heads must be a multiple of --linear-key-heads")
    if rotary_dim % 2 or rotary_dim > head_dim:
        p.error("--rotary-dim must be even and at most the head dim")
    conv_kernel = args.conv_kernel or (4 if qwen35 else 3)
    skip = set(SHAPE_KEYS)
    if args.rope_theta is not None:
        skip.add("rope.freq_base")
    if args.rms_eps is not None:
        skip.add("attention.layer_norm_rms_epsilon")
    if arch == "gpt-oss":
        skip.add("context_length")
    if arch == "gemma4":
        # Every key of the family is written below.
        skip |= {f.name[len(like_arch) + 1:] for f in reader.fields.values()
                 if f.name.startswith(like_arch + ".")}
    writer = GGUFWriter(args.out, arch)
    copy_fields(reader, writer, like_arch, arch, skip)
    if arch == "gemma4":
        gemma4_keys(writer, args, head_dim)
    else:
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
        writer.add_uint32(f"{arch}.shortconv.l_cache", conv_kernel)
    elif arch != "gemma4":
        writer.add_uint32(f"{arch}.attention.head_count_kv", args.kv_heads)
    if qwen35:
        every = args.full_attention_interval
        attending = {i for i in range(args.layers) if (i + 1) % every == 0}
        writer.add_uint32(f"{arch}.full_attention_interval", every)
        half = rotary_dim // 2
        sections = [int(x) for x in (args.rope_sections or f"{half},0,0,0").split(",")]
        if len(sections) != 4 or sum(sections) != half:
            p.error(f"--rope-sections must be four numbers summing to {half}")
        writer.add_array(f"{arch}.rope.dimension_sections", sections)
        # llama.cpp's names: state_size is a key head's width, group_count the key heads,
        # time_step_rank the value heads, inner_size all the value heads' width.
        writer.add_uint32(f"{arch}.ssm.conv_kernel", conv_kernel)
        writer.add_uint32(f"{arch}.ssm.state_size", args.linear_head_dim)
        writer.add_uint32(f"{arch}.ssm.group_count", args.linear_key_heads)
        writer.add_uint32(f"{arch}.ssm.time_step_rank", args.linear_value_heads)
        writer.add_uint32(f"{arch}.ssm.inner_size", args.linear_value_heads * args.linear_head_dim)
    if arch != "qwen35moe":
        writer.add_uint32(f"{arch}.feed_forward_length", args.ffn)
    if arch != "gemma4":
        writer.add_uint32(f"{arch}.rope.dimension_count", rotary_dim)
    if args.rope_theta is not None:
        writer.add_float32(f"{arch}.rope.freq_base", args.rope_theta)
    if args.rms_eps is not None:
        writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", args.rms_eps)
    shared_ffn = (args.shared_expert_ffn or args.expert_ffn) if arch == "qwen35moe" else 0
    if args.experts:
        writer.add_uint32(f"{arch}.expert_count", args.experts)
        writer.add_uint32(f"{arch}.expert_used_count", args.experts_used)
        writer.add_uint32(f"{arch}.expert_feed_forward_length", args.expert_ffn)
    if shared_ffn:
        writer.add_uint32(f"{arch}.expert_shared_feed_forward_length", shared_ffn)
    gptoss = arch == "gpt-oss"
    if gptoss:
        if not args.experts:
            p.error("gpt-oss needs --experts")
        writer.add_uint32(f"{arch}.attention.sliding_window", args.sliding_window)
        writer.add_string(f"{arch}.rope.scaling.type", "yarn")
        writer.add_float32(f"{arch}.rope.scaling.factor", 32.0)
        writer.add_uint32(f"{arch}.rope.scaling.original_context_length", 4096)
        writer.add_uint32(f"{arch}.context_length", 131072)

    rng = np.random.default_rng(0)
    kinds = {"f16": None, "q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0,
             "mxfp4": GGMLQuantizationType.MXFP4}

    # Bytes per block of 32 values (its scale first), and the scale's bytes that give weights
    # of about 0.02: an f16 scale, or MXFP4's power-of-two exponent (E8M0, 2^(e - 127), over
    # E2M1 values up to 6).
    def f16(d):
        return np.frombuffer(np.float16(d).tobytes(), dtype=np.uint8)

    blocks = {GGMLQuantizationType.Q8_0: (34, f16(0.02 / 64)),
              GGMLQuantizationType.Q4_0: (18, f16(0.02 / 8)),
              GGMLQuantizationType.MXFP4: (17, np.array([127 - 8], dtype=np.uint8))}

    def weight(rows, cols, quant=args.quant, stack=None):
        kind = kinds[quant]
        shape = (rows, cols) if stack is None else (stack, rows, cols)
        if kind is None:
            w = rng.standard_normal(shape, dtype=np.float32) * 0.02
            return {"tensor": w.astype(np.float16)}
        # Random quants under one scale per block, as the format lays them out.
        size, scale = blocks[kind]
        raw = rng.integers(0, 256, size=shape[:-1] + (cols // 32, size), dtype=np.uint8)
        raw[..., 0:len(scale)] = scale
        return {"tensor": raw.reshape(shape[:-1] + (cols // 32 * size,)), "raw_dtype": kind}

    def bias(*shape):
        return rng.standard_normal(shape, dtype=np.float32) * 0.02

    def add(name, w):
        writer.add_tensor(name, w["tensor"], raw_dtype=w.get("raw_dtype"))

    ones = np.ones(args.hidden, dtype=np.float32)
    add("token_embd.weight", weight(vocab, args.hidden, args.embd_quant or args.quant))
    if arch == "gemma4":
        gemma4_tensors(writer, args, vocab, head_dim, weight, add, rng)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return
    if args.untied:
        add("output.weight", weight(vocab, args.hidden, args.embd_quant or args.quant))
    # LFM2's converter names the final norm after the embedding.
    writer.add_tensor("token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight", ones)
    kv = args.kv_heads * head_dim
    width = args.heads * head_dim
    # Qwen3.5's DeltaNet layers: key heads of q and k, value heads of v (and of the gate z).
    key_width = args.linear_key_heads * args.linear_head_dim
    value_width = args.linear_value_heads * args.linear_head_dim
    value_heads = args.linear_value_heads
    for i in range(args.layers):
        b = f"blk.{i}"
        writer.add_tensor(f"{b}.attn_norm.weight", ones)
        # Qwen3.5's and gpt-oss's converters name the norm before the MLP after the attention.
        writer.add_tensor(f"{b}.post_attention_norm.weight" if qwen35 or gptoss
                          else f"{b}.ffn_norm.weight", ones)
        if i not in attending and qwen35:
            # Gated DeltaNet: one projection to q, k and v (convolved together), one to the
            # output gate z, per value head a step (alpha, with dt's bias and the decay a < 0)
            # and a write strength (beta), a norm over each value head, and the output.
            add(f"{b}.attn_qkv.weight", weight(2 * key_width + value_width, args.hidden))
            add(f"{b}.attn_gate.weight", weight(value_width, args.hidden))
            taps = rng.standard_normal((2 * key_width + value_width, conv_kernel),
                                       dtype=np.float32) * 0.5
            writer.add_tensor(f"{b}.ssm_conv1d.weight", taps)
            writer.add_tensor(f"{b}.ssm_dt.bias",
                              rng.uniform(-1, 1, value_heads).astype(np.float32))
            # llama.cpp names it without `.weight`; -exp(A_log), so always negative.
            writer.add_tensor(f"{b}.ssm_a",
                              -np.exp(rng.uniform(-1, 1, value_heads)).astype(np.float32))
            add(f"{b}.ssm_beta.weight", weight(value_heads, args.hidden))
            add(f"{b}.ssm_alpha.weight", weight(value_heads, args.hidden))
            writer.add_tensor(f"{b}.ssm_norm.weight",
                              np.ones(args.linear_head_dim, dtype=np.float32))
            add(f"{b}.ssm_out.weight", weight(args.hidden, value_width))
        elif i not in attending:
            taps = rng.standard_normal((args.hidden, conv_kernel), dtype=np.float32) * 0.5
            writer.add_tensor(f"{b}.shortconv.conv.weight", taps)
            add(f"{b}.shortconv.in_proj.weight", weight(3 * args.hidden, args.hidden))
            add(f"{b}.shortconv.out_proj.weight", weight(args.hidden, args.hidden))
        else:
            if arch in ("qwen3", "qwen3moe", "gemma3", "lfm2") + QWEN35:
                norm = np.ones(head_dim, dtype=np.float32)
                writer.add_tensor(f"{b}.attn_q_norm.weight", norm)
                writer.add_tensor(f"{b}.attn_k_norm.weight", norm)
            # Qwen3.5's query projection gives each head's query, then that head's output gate.
            add(f"{b}.attn_q.weight", weight(2 * width if qwen35 else width, args.hidden))
            add(f"{b}.attn_k.weight", weight(kv, args.hidden))
            add(f"{b}.attn_v.weight", weight(kv, args.hidden))
            add(f"{b}.attn_output.weight", weight(args.hidden, width))
            if gptoss:
                for name, size in (("q", width), ("k", kv), ("v", kv), ("output", args.hidden)):
                    writer.add_tensor(f"{b}.attn_{name}.bias", bias(size))
                writer.add_tensor(f"{b}.attn_sinks.weight", bias(args.heads) * 50)
        if args.experts:
            n, e = args.experts, args.expert_ffn
            quant = args.expert_quant or args.quant
            router = rng.standard_normal((n, args.hidden), dtype=np.float32) * 0.02
            writer.add_tensor(f"{b}.ffn_gate_inp.weight", router)
            add(f"{b}.ffn_gate_exps.weight", weight(e, args.hidden, quant, stack=n))
            add(f"{b}.ffn_up_exps.weight", weight(e, args.hidden, quant, stack=n))
            add(f"{b}.ffn_down_exps.weight", weight(args.hidden, e, quant, stack=n))
            if gptoss:
                writer.add_tensor(f"{b}.ffn_gate_inp.bias", bias(n))
                writer.add_tensor(f"{b}.ffn_gate_exps.bias", bias(n, e))
                writer.add_tensor(f"{b}.ffn_up_exps.bias", bias(n, e))
                writer.add_tensor(f"{b}.ffn_down_exps.bias", bias(n, args.hidden))
            if shared_ffn:
                # The shared expert, scaled by the sigmoid of its own one-output gate.
                gate = rng.standard_normal(args.hidden, dtype=np.float32) * 0.02
                writer.add_tensor(f"{b}.ffn_gate_inp_shexp.weight", gate)
                add(f"{b}.ffn_gate_shexp.weight", weight(shared_ffn, args.hidden))
                add(f"{b}.ffn_up_shexp.weight", weight(shared_ffn, args.hidden))
                add(f"{b}.ffn_down_shexp.weight", weight(args.hidden, shared_ffn))
            continue
        add(f"{b}.ffn_gate.weight", weight(args.ffn, args.hidden))
        add(f"{b}.ffn_up.weight", weight(args.ffn, args.hidden))
        add(f"{b}.ffn_down.weight", weight(args.hidden, args.ffn))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gemma4_windowed(args):
    """Per layer, whether it is windowed (every `--window-period`-th is global)."""
    return [(i + 1) % args.window_period != 0 for i in range(args.layers)]


def gemma4_keys(writer, args, head_dim):
    """Gemma 4's keys, as llama.cpp's converter writes them."""
    a = "gemma4"
    windowed = gemma4_windowed(args)
    global_kv = args.global_kv_heads or args.kv_heads
    writer.add_uint32(f"{a}.context_length", 131072)
    writer.add_uint32(f"{a}.attention.key_length", args.global_head_dim)
    writer.add_uint32(f"{a}.attention.value_length", args.global_head_dim)
    writer.add_uint32(f"{a}.attention.key_length_swa", head_dim)
    writer.add_uint32(f"{a}.attention.value_length_swa", head_dim)
    writer.add_uint32(f"{a}.rope.dimension_count", args.global_head_dim)
    writer.add_uint32(f"{a}.rope.dimension_count_swa", head_dim)
    writer.add_float32(f"{a}.rope.freq_base", 1e6)
    writer.add_float32(f"{a}.rope.freq_base_swa", 1e4)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_uint32(f"{a}.attention.sliding_window", args.sliding_window)
    writer.add_array(f"{a}.attention.sliding_window_pattern", windowed)
    writer.add_uint32(f"{a}.attention.shared_kv_layers", args.shared_kv_layers)
    writer.add_uint32(f"{a}.embedding_length_per_layer_input", args.per_layer_width)
    writer.add_float32(f"{a}.final_logit_softcapping", 30.0)
    if global_kv != args.kv_heads:
        writer.add_array(f"{a}.attention.head_count_kv",
                         [args.kv_heads if w else global_kv for w in windowed])
    else:
        writer.add_uint32(f"{a}.attention.head_count_kv", args.kv_heads)


def gemma4_tensors(writer, args, vocab, head_dim, weight, add, rng):
    """Gemma 4's tensors after the embedding, by llama.cpp's names."""
    h, n = args.hidden, args.layers
    windowed = gemma4_windowed(args)
    first_shared = n - args.shared_kv_layers
    global_kv = args.global_kv_heads or args.kv_heads
    ple = args.per_layer_width
    ones = np.ones(h, dtype=np.float32)
    writer.add_tensor("output_norm.weight", ones)
    pairs = args.global_head_dim // 2
    turning = pairs // 4
    writer.add_tensor("rope_freqs.weight",
                      np.array([1.0] * turning + [1e30] * (pairs - turning), dtype=np.float32))
    if ple:
        add("per_layer_token_embd.weight", weight(vocab, n * ple, args.embd_quant or args.quant))
        add("per_layer_model_proj.weight", weight(n * ple, h))
        writer.add_tensor("per_layer_proj_norm.weight", np.ones(ple, dtype=np.float32))
    for i in range(n):
        b = f"blk.{i}"
        hd = head_dim if windowed[i] else args.global_head_dim
        kv = args.kv_heads if windowed[i] else global_kv
        for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            writer.add_tensor(f"{b}.{name}.weight", ones)
        add(f"{b}.attn_q.weight", weight(args.heads * hd, h))
        writer.add_tensor(f"{b}.attn_q_norm.weight", np.ones(hd, dtype=np.float32))
        if i < first_shared:
            add(f"{b}.attn_k.weight", weight(kv * hd, h))
            writer.add_tensor(f"{b}.attn_k_norm.weight", np.ones(hd, dtype=np.float32))
            if windowed[i] or not args.keys_as_values:
                add(f"{b}.attn_v.weight", weight(kv * hd, h))
        add(f"{b}.attn_output.weight", weight(h, args.heads * hd))
        add(f"{b}.ffn_gate.weight", weight(args.ffn, h))
        add(f"{b}.ffn_up.weight", weight(args.ffn, h))
        add(f"{b}.ffn_down.weight", weight(h, args.ffn))
        if args.experts:
            e, f = args.experts, args.expert_ffn
            quant = args.expert_quant or args.quant
            router = rng.standard_normal((e, h), dtype=np.float32) * 0.02
            writer.add_tensor(f"{b}.ffn_gate_inp.weight", router)
            writer.add_tensor(f"{b}.ffn_gate_inp.scale", ones)
            add(f"{b}.ffn_gate_up_exps.weight", weight(2 * f, h, quant, stack=e))
            add(f"{b}.ffn_down_exps.weight", weight(h, f, quant, stack=e))
            writer.add_tensor(f"{b}.ffn_down_exps.scale", np.ones(e, dtype=np.float32))
            for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                writer.add_tensor(f"{b}.{name}.weight", ones)
        if ple:
            add(f"{b}.inp_gate.weight", weight(ple, h))
            add(f"{b}.proj.weight", weight(h, ple))
            writer.add_tensor(f"{b}.post_norm.weight", ones)
        writer.add_tensor(f"{b}.layer_output_scale.weight", np.ones(1, dtype=np.float32))


if __name__ == "__main__":
    main()
