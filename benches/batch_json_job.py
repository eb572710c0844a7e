"""Writes a `thicket batch` job of many documents through one JSON schema: the 80
summarization and RAG questions of benches/data/spec_bench_dev.jsonl (news articles and
retrieved passages, about 3,000 characters each), each asked for the same JSON record
(`response_format: json_schema`, strict). Every line shares the instruction and the schema,
and the answers share their shape, which is what a global suffix index learns from a job's
earlier lines.

Usage: python3 benches/batch_json_job.py > job.jsonl
       thicket batch --speculation none --max-in-flight 4 --input job.jsonl --output out.jsonl   (and suffix, auto)
"""

import json
import pathlib

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


def main():
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
        print(json.dumps({"custom_id": f"doc-{question['question_id']}", "method": "POST",
                          "url": "/v1/chat/completions", "body": body}))


if __name__ == "__main__":
    main()
