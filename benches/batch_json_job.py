"""Writes a `thicket batch` job of many documents through one JSON schema: the 80
summarization and RAG questions of benches/data/spec_bench_dev.jsonl (news articles and
retrieved passages, about 3,000 characters each), each asked for the same JSON record
(`response_format: json_schema`, strict). Every line shares the instruction and the schema,
and the answers share their shape, which is what a global suffix index learns from a job's
earlier lines.

Usage: python3 benches/batch_json_job.py > job.jsonl
       thicket batch --speculation none --max-in-flight 4 --input job.jsonl --output out.jsonl   (and suffix, auto)

The job's ceiling for any drafter: `--predict-from out.jsonl` (a finished job's results) gives
every line its own earlier answer as its prediction (`prediction: {"type": "content"}`), so
under greedy decoding every drafted token of the prediction is right:
       python3 benches/batch_json_job.py --predict-from out.jsonl > perfect.jsonl
       thicket batch --speculation auto --max-in-flight 4 --input perfect.jsonl --output p.jsonl
"""

import argparse
import json
import pathlib
import sys

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "summary": {"type": "string"},
        "people": {"type": "array", "items": {"type": "string"}},
        "places": {"type": "array", "items": {"type": "string"}},
        "topic": {"type": "string", "enum": ["politics", "business", "science", "sport",
                                              "culture", "health", "other"]},
    },
    "required": ["title", "summary", "people", "places", "topic"],
    "additionalProperties": False,
}

INSTRUCTION = ("Read the document below and describe it as a JSON record with its title, "
               "a one-sentence summary, the people and places it names, and its topic.\n\n")


def answers(path):
    """Each line's answer in a `thicket batch` results file, by `custom_id`."""
    found = {}
    for line in pathlib.Path(path).read_text().splitlines():
        result = json.loads(line)
        response = result.get("response") or {}
        if response.get("status_code") != 200:
            continue
        choice = response["body"]["choices"][0]
        found[result["custom_id"]] = choice["message"]["content"]
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--predict-from", metavar="RESULTS",
                        help="a finished job's results: each line predicts its own answer")
    args = parser.parse_args()
    predicted = answers(args.predict_from) if args.predict_from else None
    data = pathlib.Path(__file__).parent / "data" / "spec_bench_dev.jsonl"
    for line in data.read_text().splitlines():
        question = json.loads(line)
        if question["category"] not in ("summarization", "rag"):
            continue
        body = {
            "messages": [{"role": "user",
                          "content": INSTRUCTION + question["turns"][0]}],
            "max_tokens": 128,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "record", "schema": SCHEMA, "strict": True}},
        }
        custom_id = f"doc-{question['question_id']}"
        if predicted is not None:
            if custom_id not in predicted:
                sys.exit(f"{args.predict_from} has no answer for {custom_id}")
            body["prediction"] = {"type": "content", "content": predicted[custom_id]}
        print(json.dumps({"custom_id": custom_id, "method": "POST",
                          "url": "/v1/chat/completions", "body": body}))


if __name__ == "__main__":
    main()
