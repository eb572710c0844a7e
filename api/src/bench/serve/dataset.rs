//! Prompts for load benchmarks: ShareGPT conversations (the first human turn), Spec-Bench
//! questions (the first turn) or JSON lines with a `prompt` (or `messages`), sampled in a
//! seeded order.

use std::path::Path;

use anyhow::{bail, Context};
use clap::ValueEnum;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::Value;

/// How a dataset file is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DatasetFormat {
    /// A JSON array of `{"conversations": [{"from": "human", "value": ...}, ...]}`.
    Sharegpt,
    /// JSON lines of `{"question_id", "category", "turns": [...]}`.
    SpecBench,
    /// JSON lines of `{"prompt": "..."}` or `{"messages": [...]}`.
    Jsonl,
}

impl DatasetFormat {
    /// The format a file name suggests.
    pub fn guess(path: &Path) -> Self {
        let name = path.to_string_lossy().to_lowercase();
        if name.contains("sharegpt") {
            DatasetFormat::Sharegpt
        } else if name.contains("spec_bench") || name.contains("spec-bench") {
            DatasetFormat::SpecBench
        } else {
            DatasetFormat::Jsonl
        }
    }
}

/// One benchmark prompt: chat messages (a user turn, unless the file gave messages).
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// OpenAI chat messages.
    pub messages: Value,
    /// The text of the prompt (the last message's content), for `/v1/completions`.
    pub text: String,
}

impl Prompt {
    fn user(text: &str) -> Self {
        Self {
            messages: serde_json::json!([{"role": "user", "content": text}]),
            text: text.to_string(),
        }
    }
}

/// Reads every usable prompt of `path`.
pub fn load(path: &Path, format: DatasetFormat) -> anyhow::Result<Vec<Prompt>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let prompts = parse(&text, format).with_context(|| format!("parsing {}", path.display()))?;
    if prompts.is_empty() {
        bail!("{} holds no usable prompt", path.display());
    }
    Ok(prompts)
}

/// Parses a dataset's text.
pub fn parse(text: &str, format: DatasetFormat) -> anyhow::Result<Vec<Prompt>> {
    let non_empty = |s: &str| !s.trim().is_empty();
    Ok(match format {
        DatasetFormat::Sharegpt => {
            let items: Vec<Value> = serde_json::from_str(text).context("not a JSON array")?;
            items
                .iter()
                .filter_map(|item| {
                    let first = item["conversations"].as_array()?.first()?;
                    let value = first["value"].as_str()?;
                    (first["from"] == "human" && non_empty(value)).then(|| Prompt::user(value))
                })
                .collect()
        }
        DatasetFormat::SpecBench | DatasetFormat::Jsonl => {
            let mut prompts = Vec::new();
            for (i, line) in text.lines().enumerate().filter(|(_, l)| non_empty(l)) {
                let item: Value = serde_json::from_str(line)
                    .with_context(|| format!("line {} is not JSON", i + 1))?;
                let prompt = if let Some(turn) = item["turns"][0].as_str() {
                    Some(Prompt::user(turn))
                } else if let Some(prompt) = item["prompt"].as_str() {
                    Some(Prompt::user(prompt))
                } else if let Some(messages) = item["messages"].as_array() {
                    let last = messages
                        .last()
                        .and_then(|m| m["content"].as_str())
                        .unwrap_or_default();
                    Some(Prompt {
                        messages: Value::Array(messages.clone()),
                        text: last.to_string(),
                    })
                } else {
                    None
                };
                match prompt {
                    Some(p) if non_empty(&p.text) => prompts.push(p),
                    Some(_) => {}
                    None => bail!("line {} has no turns, prompt or messages", i + 1),
                }
            }
            prompts
        }
    })
}

/// `n` prompts in an order drawn from `seed` (the list repeats when `n` is larger).
pub fn sample(prompts: &[Prompt], n: usize, seed: u64) -> Vec<Prompt> {
    let mut order: Vec<usize> = (0..prompts.len()).collect();
    order.shuffle(&mut StdRng::seed_from_u64(seed));
    order
        .iter()
        .cycle()
        .take(n)
        .map(|&i| prompts[i].clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_yields_user_prompts() {
        let sharegpt = r#"[{"id": "a", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
                           {"id": "b", "conversations": [{"from": "gpt", "value": "skipped"}]},
                           {"id": "c", "conversations": []}]"#;
        let p = parse(sharegpt, DatasetFormat::Sharegpt).unwrap();
        assert_eq!(p, vec![Prompt::user("Hi")]);
        let spec = "{\"question_id\": 1, \"category\": \"x\", \"turns\": [\"Q1\", \"Q2\"]}\n\n";
        assert_eq!(
            parse(spec, DatasetFormat::SpecBench).unwrap(),
            vec![Prompt::user("Q1")]
        );
        let jsonl =
            "{\"prompt\": \"P\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"M\"}]}";
        let p = parse(jsonl, DatasetFormat::Jsonl).unwrap();
        assert_eq!(p[0], Prompt::user("P"));
        assert_eq!(p[1].text, "M");
        assert!(parse("{\"other\": 1}", DatasetFormat::Jsonl).is_err());
        assert!(parse("[1", DatasetFormat::Sharegpt).is_err());
    }

    #[test]
    fn sampling_is_seeded_and_cycles() {
        let prompts: Vec<Prompt> = (0..5).map(|i| Prompt::user(&i.to_string())).collect();
        let a = sample(&prompts, 12, 1);
        assert_eq!(a, sample(&prompts, 12, 1));
        assert_eq!(a.len(), 12);
        assert_eq!(a[0], a[5], "the order repeats after every prompt was used");
        let mut first: Vec<String> = a[..5].iter().map(|p| p.text.clone()).collect();
        first.sort();
        assert_eq!(first, ["0", "1", "2", "3", "4"]);
        assert_eq!(
            DatasetFormat::guess(Path::new("d/sharegpt_dev.json")),
            DatasetFormat::Sharegpt
        );
        assert_eq!(
            DatasetFormat::guess(Path::new("spec_bench_dev.jsonl")),
            DatasetFormat::SpecBench
        );
    }
}
