#!/usr/bin/env python3
"""Writes tests/data/bert_cross_encoder_transformers.json: Hugging Face transformers'
`BertForSequenceClassification` (float32, eager attention) on the tiny random cross-encoder
of `tests/model/encoder_hf.rs` (written by its ignored test `write_the_cross_encoder_reference`
through `engine::model::testing::write_tiny_bert_hf`), for a set of text pairs: the ids and
token types the checkpoint's own `tokenizer.json` gives each pair (through the `tokenizers`
package), transformers' logit, and the last layer's state of every token.

The file of record was produced on the CPU with Python 3.11 and

    pip install torch==2.15.0 transformers==5.23.0

(the script installs nothing). Run it from the repository root:

    python3 scripts/bert-reference.py
"""

import json
import os
import pathlib
import subprocess
import tempfile

import tokenizers
import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "bert_cross_encoder_transformers.json"
PAIRS = [
    ("what is the cat", "the cat sat on the mat ."),
    ("where is the dog ?", "the dog is in the garden"),
    ("who sleeps", "a big red house"),
    ("Unable, unkindness", "the small blue cats are playing and running"),
    ("the", "a"),
]


def main():
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            ["cargo", "test", "--release", "--test", "tests",
             "model::encoder_hf::write_the_cross_encoder_reference", "--", "--ignored",
             "--exact"],
            cwd=ROOT, check=True, env={**os.environ, "THICKET_REFERENCE_HF": tmp})
        tok = tokenizers.Tokenizer.from_file(os.path.join(tmp, "tokenizer.json"))
        model, info = transformers.BertForSequenceClassification.from_pretrained(
            tmp, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
        assert not any(info.values()), info
        model.eval()
        records = []
        for first, second in PAIRS:
            enc = tok.encode(first, second)
            ids = torch.tensor([enc.ids])
            types = torch.tensor([enc.type_ids])
            with torch.no_grad():
                out = model(input_ids=ids, token_type_ids=types, output_hidden_states=True)
            records.append({
                "first": first,
                "second": second,
                "ids": enc.ids,
                "types": enc.type_ids,
                "logit": out.logits[0, 0].item(),
                "states": out.hidden_states[-1][0].flatten().tolist(),
            })
    OUT.write_text(json.dumps({
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "pairs": records,
    }) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
