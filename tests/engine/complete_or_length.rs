//! A constrained answer is complete or says `length`, for every kind of constraint (a JSON
//! schema, any JSON object, a regular expression, a choice, a Lark grammar, the
//! `required`-call grammar of every tool-call format, and a schema after a thinking phase):
//! a scripted model that writes a complete
//! answer but tries to end at each position in turn (with an end token, or with a stop token
//! of the request's), its answers carrying stop strings that also occur inside them where the
//! format is not complete, with speculation off and on (prompt lookup drafting the answer
//! and junk past its end). Every answer must be exactly the script (an end tried where the
//! format cannot end is masked, so the model writes its next choice), or the script cut where
//! it was already complete; nothing stops inside a string. One engine counts an ordinary text
//! token as an end too, first among its ends (as Qwen's tokenizer did with `</s>`), so that
//! token's bytes fit inside strings; the end must still wait for a complete answer. The
//! tool-call formats run on Qwen's tokenizer too, whose markers are one token each. Then a
//! model with random rankings that tries to end often, sampled: every answer that says it is
//! done is valid, every other one used its whole token budget. Each answer is checked by
//! code that is not the engine's grammar: `serde_json` and `jsonschema`, the `regex` crate,
//! and the server's own readers of each tool-call format.

use std::sync::Arc;

use api::server::tools::format::{as_text, Markers};
use api::server::tools::{parse_calls, tool_format, ToolRequest};
use engine::backend::RankedTokens;
use engine::constraint::{ConstraintSpec, ThinkingSpec};
use engine::handle::EngineHandle;
use engine::{
    CostCurve, EngineConfig, FinishReason, ManagerConfig, MockBackend, ModelTokenizer, Request,
    SamplingParams, SchedulerConfig, SpecMethod, SpecRequest, SpeculationConfig, StopConditions,
};
use serde_json::{json, Value};

use crate::support::fixtures::smollm2;

/// The stop string every request carries; the scripts hold it where they are not complete.
const STOP: &str = "STOP";

/// Whether an answer is complete and valid (why not, when it is not).
type Check = Box<dyn Fn(&str) -> Result<(), String>>;

/// One constraint, an answer complete under it, and an independent check of answers.
struct Case {
    name: &'static str,
    spec: ConstraintSpec,
    /// A thinking phase before the answer the format holds.
    thinking: Option<ThinkingSpec>,
    script: String,
    check: Check,
}

fn write_file() -> Value {
    json!([{"type": "function", "function": {"name": "write_file", "description": "Write a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"], "additionalProperties": false}}}])
}

fn schema() -> Value {
    write_file()[0]["function"]["parameters"].clone()
}

/// `text` is a JSON value valid against `schema`.
fn valid_json(text: &str, schema: &Value) -> Result<(), String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("{e}: {text:?}"))?;
    let validator = jsonschema::validator_for(schema).map_err(|e| e.to_string())?;
    let first = validator.iter_errors(&value).next().map(|e| e.to_string());
    match first {
        Some(e) => Err(format!("{e}: {text:?}")),
        None => Ok(()),
    }
}

/// The `required` call grammar of `format` for `write_file`, with its check: the answer is
/// calls only, each valid against the schema.
fn tool_case(format: &'static str, script: &str) -> Case {
    let tools = write_file();
    let request = ToolRequest::parse(Some(&tools), Some(&json!("required")), Some(false))
        .unwrap()
        .unwrap();
    let tool_format = tool_format(format).unwrap();
    let spec = request
        .constraint(tool_format.as_ref(), &Markers::new(&as_text))
        .unwrap();
    let calls = request.calls(tool_format);
    Case {
        name: format,
        spec,
        thinking: None,
        script: script.to_string(),
        check: Box::new(move |text| {
            let (content, found) =
                parse_calls(text, &calls).ok_or_else(|| format!("no call in {text:?}"))?;
            if content.is_some() || found.len() != 1 {
                return Err(format!(
                    "content {content:?}, {} calls: {text:?}",
                    found.len()
                ));
            }
            valid_json(&found[0].function.arguments, &schema())
        }),
    }
}

fn regex_case(name: &'static str, spec: ConstraintSpec, pattern: &str, script: &str) -> Case {
    let re = regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
    Case {
        name,
        spec,
        thinking: None,
        script: script.to_string(),
        check: Box::new(move |text| {
            re.is_match(text)
                .then_some(())
                .ok_or_else(|| format!("{text:?} does not match"))
        }),
    }
}

fn cases() -> Vec<Case> {
    let content = r#"{"path": "a.py", "content": "x = 1 STOP\n</tool_call> y"}"#;
    vec![
        tool_case(
            "hermes",
            &format!("<tool_call>\n{{\"name\": \"write_file\", \"arguments\": {content}}}\n</tool_call>"),
        ),
        tool_case(
            "llama3_json",
            r#"{"name": "write_file", "parameters": {"path": "a.py", "content": "x STOP; y"}}"#,
        ),
        tool_case(
            "mistral",
            r#"[TOOL_CALLS][{"name": "write_file", "arguments": {"path": "a.py", "content": "x STOP] y"}}]"#,
        ),
        tool_case(
            "qwen3_coder",
            "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n<parameter=content>\nx STOP y\n</parameter>\n</function>\n</tool_call>",
        ),
        Case {
            name: "json_schema",
            spec: ConstraintSpec::JsonSchema(schema()),
            thinking: None,
            script: r#"{"path": "a.py", "content": "x STOP} y"}"#.into(),
            check: Box::new(|text| valid_json(text, &schema())),
        },
        Case {
            name: "json_object",
            spec: ConstraintSpec::JsonObject,
            thinking: None,
            script: r#"{"a": "STOP", "b": [1, 2]}"#.into(),
            check: Box::new(|text| valid_json(text, &json!({"type": "object"}))),
        },
        // The format holds the answer after the thinking only; nothing ends inside either.
        Case {
            name: "thinking_then_json",
            spec: ConstraintSpec::JsonSchema(schema()),
            thinking: Some(ThinkingSpec {
                start: None,
                end: "</think>".into(),
                budget: None,
            }),
            script: r#"Plan: STOP} here.</think>{"path": "a.py", "content": "x STOP"}"#.into(),
            check: Box::new(|text| {
                let (_, answer) = text
                    .split_once("</think>")
                    .ok_or_else(|| format!("no end of thinking in {text:?}"))?;
                valid_json(answer, &schema())
            }),
        },
        regex_case(
            "regex",
            ConstraintSpec::Regex(r#"say "[a-zA-Z }{]+"\."#.into()),
            r#"say "[a-zA-Z }{]+"\."#,
            r#"say "x STOP} y"."#,
        ),
        regex_case(
            "choice",
            ConstraintSpec::Choice(vec!["alpha".into(), "alpha STOP beta".into()]),
            "alpha|alpha STOP beta",
            "alpha STOP beta",
        ),
        regex_case(
            "lark",
            ConstraintSpec::Lark("start: \"(\" item (\",\" item)* \")\"\nitem: /[a-zA-Z ]+/\n".into()),
            r"\([a-zA-Z ]+(,[a-zA-Z ]+)*\)",
            "(ab,c STOP d)",
        ),
    ]
}

/// An engine over `tokenizer` on a mock model ranking tokens by `rule`, ending outputs with
/// `ends`.
fn engine(tokenizer: &ModelTokenizer, rule: RankedTokens, ends: Vec<u32>) -> EngineHandle {
    let tokenizer = Arc::new(tokenizer.clone());
    let vocab = tokenizer.inner().get_vocab_size(true);
    let kv = ManagerConfig {
        num_blocks: 512,
        block_size: 16,
        prefix_caching: true,
        watermark: 0.0,
        window: None,
    };
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: 512,
            max_num_seqs: 32,
            max_model_len: 512,
            kv,
        },
        max_pending: 1024,
        speculation: SpeculationConfig {
            cost: CostCurve::flat(),
            ..SpeculationConfig::default()
        },
        kv_prefault: false,
        state_snapshots: Default::default(),
    };
    let backend = MockBackend::ranked(vocab, kv.num_blocks * kv.block_size, rule);
    engine::spawn_with_backend(Box::new(backend), tokenizer, ends, config)
        .unwrap()
        .0
}

fn token(tokenizer: &ModelTokenizer, text: &str) -> u32 {
    match tokenizer.encode_plain(text).unwrap()[..] {
        [id] => id,
        ref ids => panic!("{text:?} is {ids:?}, not one token"),
    }
}

/// Prompt tokens that say which position the model tries to end at and how (the mock reads
/// them back), then the script and junk after it for prompt lookup to draft.
const CUT_BASE: u32 = 1000;
const HOW_BASE: u32 = 900;

/// How the model tries to end at the cut.
#[derive(Debug, Clone, Copy, PartialEq)]
enum How {
    /// With the engine's end token.
    End,
    /// With the request's stop token.
    StopToken,
}

fn request(case: &Case, prompt: Vec<u32>, how: How, stop_token: u32, spec: bool) -> Request {
    Request {
        prompt,
        sampling: SamplingParams::greedy(),
        stop: StopConditions {
            max_tokens: 200,
            stop: vec![STOP.into()],
            stop_token_ids: if how == How::StopToken {
                vec![stop_token]
            } else {
                Vec::new()
            },
            ..StopConditions::default()
        },
        n: 1,
        speculation: spec.then_some(SpecRequest {
            method: SpecMethod::PromptLookup,
            max_draft_tokens: None,
        }),
        constraint: Some(case.spec.clone()),
        thinking: case.thinking.clone(),
        prediction: None,
        cache_salt: None,
        pooling: None,
    }
}

/// Runs every cut of `case` on `tokenizer`, on an engine whose first end token is `end` (the
/// one the model tries to end with) among `ends`.
fn every_cut(tokenizer: &ModelTokenizer, case: &Case, end: u32, ends: Vec<u32>) {
    let script = tokenizer.encode_plain(&case.script).unwrap();
    let junk = tokenizer
        .encode_plain(" and then some junk after it")
        .unwrap();
    let stop_token = token(tokenizer, " moon");
    assert!(!script.contains(&stop_token) && !script.contains(&end));
    let prompt_len = 2 + script.len() + junk.len();
    let rule: RankedTokens = {
        let script = script.clone();
        Arc::new(move |seen: &[u32]| {
            if seen.len() < prompt_len {
                return vec![0];
            }
            let cut = seen[0].saturating_sub(CUT_BASE) as usize;
            let how = seen[1].saturating_sub(HOW_BASE);
            let out = &seen[prompt_len..];
            if !script.starts_with(out) {
                return vec![end];
            }
            let next = script.get(out.len()).copied().unwrap_or(end);
            match (out.len() == cut, how) {
                (true, 0) => vec![end, next],
                (true, _) => vec![stop_token, next],
                (false, _) => vec![next],
            }
        })
    };
    let handle = engine(tokenizer, rule, ends);
    let mut runs = Vec::new();
    for cut in 0..script.len() {
        for (how, code) in [(How::End, 0), (How::StopToken, 1)] {
            for spec in [false, true] {
                let mut prompt = vec![CUT_BASE + cut as u32, HOW_BASE + code];
                prompt.extend_from_slice(&script);
                prompt.extend_from_slice(&junk);
                let stream = handle
                    .submit(request(case, prompt, how, stop_token, spec))
                    .unwrap();
                runs.push((cut, how, spec, stream));
            }
        }
    }
    for (cut, how, spec, stream) in runs {
        let out = stream.wait().unwrap().remove(0);
        let what = format!(
            "{} (first end {end}), ending by {how:?} at token {cut}, speculation {spec}",
            case.name
        );
        let prefix = tokenizer.decode(&script[..cut]).unwrap();
        let whole = matches!(out.finish, Some(FinishReason::Eos)) && out.text == case.script;
        // Ending at the cut is right only where the answer was complete there.
        let cut_short = out.text == prefix && (case.check)(&prefix).is_ok();
        assert!(
            whole || cut_short,
            "{what}: {:?} {:?}",
            out.finish,
            out.text
        );
        (case.check)(&out.text).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

#[test]
fn every_constraint_ends_only_where_complete_whatever_the_model_tries() {
    let tokenizer = &smollm2().tokenizer;
    let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
    // An ordinary token counted as an end, first among the ends.
    let text_end = token(tokenizer, " river");
    let mut with_text_end = vec![text_end];
    with_text_end.extend_from_slice(tokenizer.eos_ids());
    for case in cases() {
        every_cut(tokenizer, &case, im_end, tokenizer.eos_ids().to_vec());
        every_cut(tokenizer, &case, text_end, with_text_end.clone());
    }
}

#[test]
fn markers_written_as_one_token_end_only_where_complete_too() {
    // Qwen's tokenizer spells `<tool_call>` and `</tool_call>` as one token each, inside the
    // argument string too; its `</s>` is an ordinary token, which its ends once counted first.
    let (content, _) =
        engine::model::gguf::read_content(&crate::support::fixtures::qwen_path()).unwrap();
    let tokenizer = ModelTokenizer::from_gguf(&content).unwrap();
    let close = tokenizer.token_to_id("</tool_call>").unwrap();
    let text_end = tokenizer.token_to_id("</s>").unwrap();
    let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
    let mut old_ends = vec![text_end];
    old_ends.extend_from_slice(tokenizer.eos_ids());
    for case in cases()
        .into_iter()
        .filter(|c| c.name == "hermes" || c.name == "qwen3_coder")
    {
        let script = tokenizer.encode_plain(&case.script).unwrap();
        assert!(script.contains(&close), "{}: {script:?}", case.name);
        every_cut(&tokenizer, &case, im_end, tokenizer.eos_ids().to_vec());
        every_cut(&tokenizer, &case, text_end, old_ends.clone());
    }
}

#[test]
fn sampled_answers_that_say_they_are_done_are_valid() {
    let tokenizer = &smollm2().tokenizer;
    let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
    let vocab = tokenizer.inner().get_vocab_size(true) as u64;
    // A model ranking a few tokens by a hash of the last ones seen, the end among them.
    let rule: RankedTokens = Arc::new(move |seen: &[u32]| {
        let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
        for &t in seen.iter().rev().take(2) {
            h = (h ^ u64::from(t)).wrapping_mul(0x0100_0000_01b3);
        }
        let pick = |k: u64| ((h >> (k * 8)) % vocab) as u32;
        vec![pick(0), im_end, pick(1), pick(2)]
    });
    let handle = engine(tokenizer, rule, tokenizer.eos_ids().to_vec());
    let max_tokens = 48;
    let mut runs = Vec::new();
    for case in cases() {
        for seed in 0..8u64 {
            for spec in [false, true] {
                let prompt = tokenizer
                    .encode_plain(&format!("{} {seed} {}", case.name, case.script))
                    .unwrap();
                let mut request = request(&case, prompt, How::End, 0, spec);
                request.sampling = SamplingParams {
                    temperature: 1.0,
                    seed: Some(seed),
                    ..SamplingParams::default()
                };
                request.stop.max_tokens = max_tokens;
                request.stop.stop = vec![STOP.into(), "}".into(), "a".into()];
                let stream = handle.submit(request).unwrap();
                runs.push((case.name, seed, spec, stream));
            }
        }
    }
    let by_name: std::collections::HashMap<&str, Case> =
        cases().into_iter().map(|c| (c.name, c)).collect();
    let mut done = 0;
    for (name, seed, spec, stream) in runs {
        let out = stream.wait().unwrap().remove(0);
        let what = format!("{name} seed {seed} speculation {spec}");
        match out.finish {
            Some(FinishReason::Length) => {
                assert_eq!(out.token_ids.len(), max_tokens, "{what}: {:?}", out.text)
            }
            Some(_) => {
                done += 1;
                (by_name[name].check)(&out.text).unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            None => panic!("{what}: no finish"),
        }
    }
    // The end is always among the model's first choices: many answers end.
    assert!(done >= 8, "only {done} answers ended");
}

#[test]
fn a_stop_ends_an_output_at_its_start_where_the_format_accepts_the_empty_one() {
    // `( moon)*` accepts nothing at all; the model's first choice is ` moon`, the request's
    // stop token: the empty output is complete, so the stop token ends it there.
    let tokenizer = &smollm2().tokenizer;
    let moon = token(tokenizer, " moon");
    let handle = engine(
        tokenizer,
        Arc::new(move |_: &[u32]| vec![moon]),
        tokenizer.eos_ids().to_vec(),
    );
    let case = regex_case(
        "empty",
        ConstraintSpec::Regex("( moon)*".into()),
        "( moon)*",
        "",
    );
    let prompt = tokenizer.encode_plain("Say nothing.").unwrap();
    let out = handle
        .submit(request(&case, prompt, How::StopToken, moon, false))
        .unwrap()
        .wait()
        .unwrap()
        .remove(0);
    assert_eq!(out.finish, Some(FinishReason::StopToken(moon)));
    assert_eq!(out.text, "");
}
