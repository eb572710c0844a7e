#!/usr/bin/env python3
"""Writes tests/data/gemma3_270m_llamacpp_ids.json: the token ids llama.cpp's
`llama-tokenize` gives for a fixed set of texts on the Gemma 3 270M GGUF (alias
`gemma3-270m`), the reference the tokenizer test compares thicket's encoding with.

The ids of record were produced with llama.cpp commit 0c1e570 (the copy vendored in
llama-cpp-python 0.3.36, `llama-tokenize --version`: "0.5.0-dev (build 1, commit
0c1e570)"), built for the CPU:

    cmake --build build --target llama-tokenize
    scripts/gemma3-tokenizer-reference.py \
        --llama-tokenize build/bin/llama-tokenize \
        --model models/gemma3-270m.gguf

Each text is given on stdin with `--ids --no-escape` (llama-tokenize's defaults otherwise:
BOS added as the file asks, special tokens in the text parsed), so the ids are exactly what
llama.cpp feeds the model for that text. The version string of the binary that ran is
written into the file.

The texts are tokenized a second time on a copy of the file's metadata (no tensors) with
`tokenizer.ggml.add_space_prefix` set to true, the Llama 2 way, in which a space is put
before the text and after every token matched whole: `space_prefix_cases`. That copy is
written with the `gguf` Python package (llama.cpp's gguf-py, 0.19.0 here).
"""

import argparse
import hashlib
import json
import pathlib
import subprocess
import sys
import tempfile

MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

TEXTS = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "   three leading spaces",
    "trailing space ",
    "multiple   spaces   between  words",
    " ",
    "\n",
    "\n\n\n",
    "line one\nline two\n\nparagraph two\n",
    "windows\r\nline\r\nendings\r\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n"
    "    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "fn main() {\n\tlet x = 1;\n\t\tprintln!(\"{x}\");\n}\n",
    "\t \t  \n \n\t\t\tindented",
    "x" + " " * 40 + "y",
    "1234567890",
    "3.14159265358979 and 2.71828",
    "The year 2024 had 366 days; 1,000,000 > 999,999.",
    "I love \U0001F980 and \U0001F389\U0001F680!",
    "family: \U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002",
    "\u4e2d\u6587\u6d4b\u8bd5\uff1a\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m, \u00c7a va? \u00dcber Stra\u00dfe",
    "decomposed: cafe\u0301",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u2211x\u00b2 + \u221ay \u2248 \u221e",
    "rare: \U00013000 and a bell \x07 here",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos> and <unused0>",
    "<table><tr><td>cell</td></tr></table> <b>bold</b> and </s>",
    "https://example.com/path?query=1&b=2#frag",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "# Title\n\n- item one\n- item two\n\n**bold** _italic_ `code`",
    "antidisestablishmentarianism supercalifragilisticexpialidocious",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!!!!!! ............ ????",
    "Mixed CASE and camelCaseIdentifiers_with_snake_case",
    "<0x41> written out is text, not the byte token",
    # SentencePiece writes a space as U+2581, so a U+2581 in the text becomes the space's
    # piece and decodes as a space (in llama.cpp too): this text cannot round-trip.
    "U+2581 in the text: a\u2581b \u2581",
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-tokenize", required=True, help="the llama-tokenize binary")
    parser.add_argument("--model", required=True, help="the gemma3-270m GGUF")
    parser.add_argument(
        "--out",
        default=str(
            pathlib.Path(__file__).resolve().parent.parent
            / "tests/data/gemma3_270m_llamacpp_ids.json"
        ),
    )
    args = parser.parse_args()

    digest = hashlib.sha256()
    with open(args.model, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != MODEL_SHA256:
        sys.exit(f"{args.model}: sha256 {digest.hexdigest()}, expected {MODEL_SHA256}")

    version = subprocess.run(
        [args.llama_tokenize, "--version"], capture_output=True, text=True, check=True
    )
    version = " ".join(
        line.strip()
        for line in (version.stdout + version.stderr).splitlines()
        if line.startswith("version:")
    )

    cases = tokenize_all(args.llama_tokenize, args.model)
    with tempfile.TemporaryDirectory() as tmp:
        prefixed = pathlib.Path(tmp) / "space-prefix.gguf"
        metadata_with_space_prefix(args.model, prefixed)
        space_prefix_cases = tokenize_all(args.llama_tokenize, str(prefixed))

    data = {
        "comment": (
            "Token ids from llama.cpp's llama-tokenize on the gemma3-270m GGUF, BOS "
            "included, special tokens in the text parsed; written by "
            "scripts/gemma3-tokenizer-reference.py. Every text decodes back to itself "
            "except the one holding U+2581 (SentencePiece's stand-in for a space): it is "
            "encoded as a space is and decodes with spaces in its place, in llama.cpp too. "
            "space_prefix_cases: the same texts with tokenizer.ggml.add_space_prefix set "
            "to true (a space put before the text and after every token matched whole, so "
            "those texts do not decode back to themselves)."
        ),
        "llama_cpp": version,
        "model_sha256": MODEL_SHA256,
    }
    # One case a line, so a change to one shows as one line.
    head = json.dumps(data, ensure_ascii=False, indent=1)
    lists = ",\n".join(
        f' "{name}": [\n'
        + ",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in items)
        + "\n ]"
        for name, items in [("cases", cases), ("space_prefix_cases", space_prefix_cases)]
    )
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(head[:-2] + ",\n" + lists + "\n}\n")
    print(f"{len(cases)} texts, twice -> {args.out}")


def tokenize_all(llama_tokenize, model):
    """llama-tokenize's ids for every text of TEXTS on `model`."""
    cases = []
    for text in TEXTS:
        out = subprocess.run(
            [llama_tokenize, "-m", model, "--stdin", "--ids", "--no-escape", "--log-disable"],
            input=text.encode("utf-8"),
            capture_output=True,
            check=True,
        )
        ids = json.loads(out.stdout.decode("utf-8").strip().splitlines()[-1])
        cases.append({"text": text, "ids": ids})
    return cases


def metadata_with_space_prefix(model, out):
    """Writes the metadata of `model` (no tensors) to `out`, add_space_prefix set to true."""
    import gguf

    reader = gguf.GGUFReader(model)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out), arch=arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if key == "tokenizer.ggml.add_space_prefix":
            value = True
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, value, kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
