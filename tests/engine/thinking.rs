//! A thinking phase on SmolLM2 (which does not think: the phases are the engine's to
//! enforce, whatever the model writes). A spent thinking budget forces the end string's
//! tokens and the answer then follows its JSON schema (checked with the `jsonschema` crate);
//! a budget of 0 ends the thinking at once; a format waits for the thinking's end and the
//! output cannot end inside it, so thinking that never ends runs to `max_tokens` (without a
//! format or budget, a thinking phase changes no token); an output
//! that may open thinking and does not is held to the format from its first token; and greedy
//! output with a thinking phase and a format is token for token the same under every
//! drafter, and with a prediction that runs across the end of the thinking.

use engine::constraint::{ConstraintSpec, ThinkingSpec};
use engine::{FinishReason, SamplingParams, SpecMethod, SpecRequest, SpeculationConfig};
use serde_json::json;

use super::structured::{chat, request, start, start_with};
use crate::support::fixtures::smollm2;

fn schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 150}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    })
}

fn thinking(start: Option<&str>, budget: Option<usize>) -> ThinkingSpec {
    ThinkingSpec {
        start: start.map(str::to_string),
        end: "</think>".into(),
        budget,
    }
}

fn tokens(text: &str) -> Vec<u32> {
    smollm2().tokenizer.encode_plain(text).unwrap()
}

/// The answer after the end string, checked against the schema.
fn assert_answer_holds(text: &str) {
    let (_, answer) = text
        .split_once("</think>")
        .unwrap_or_else(|| panic!("no end of thinking in {text:?}"));
    let value: serde_json::Value =
        serde_json::from_str(answer).unwrap_or_else(|e| panic!("{e}: {answer:?}"));
    let validator = jsonschema::validator_for(&schema()).unwrap();
    assert!(validator.is_valid(&value), "{value} breaks the schema");
}

#[test]
fn a_spent_budget_forces_the_end_and_the_schema_holds_after_it() {
    let handle = start();
    let end = tokens("</think>");
    for budget in [0, 1, 7, 20] {
        let mut r = request(
            chat("Describe a person called Ada."),
            ConstraintSpec::JsonSchema(schema()),
            SamplingParams::greedy(),
            1,
        );
        r.thinking = Some(thinking(None, Some(budget)));
        let out = handle.submit(r).unwrap().wait().unwrap().remove(0);
        assert_eq!(out.finish, Some(FinishReason::Eos), "{:?}", out.text);
        let thought = smollm2()
            .tokenizer
            .decode(&out.token_ids[..budget])
            .unwrap();
        assert!(!thought.contains("</think>"), "{thought:?}");
        assert_eq!(
            out.token_ids[budget..budget + end.len()],
            end[..],
            "budget {budget}: {:?}",
            out.text
        );
        assert_answer_holds(&out.text);
    }
}

#[test]
fn thinking_that_never_ends_runs_to_the_length_limit_under_a_format() {
    let handle = start();
    let mut r = request(
        chat("Describe a person called Ada."),
        ConstraintSpec::JsonSchema(schema()),
        SamplingParams::greedy(),
        1,
    );
    r.stop.max_tokens = 40;
    r.thinking = Some(thinking(None, None));
    let out = handle.submit(r).unwrap().wait().unwrap().remove(0);
    // SmolLM2 ends its turn after a few sentences; inside the thinking it may not.
    assert_eq!(out.finish, Some(FinishReason::Length), "{:?}", out.text);
    assert_eq!(out.token_ids.len(), 40);
    assert!(!out.text.contains("</think>"));
    // Without a format or a budget a thinking phase changes nothing: the output may end
    // inside it, where the model ends it.
    let run = |thinks: bool| {
        let mut r = request(
            chat("Say hi."),
            ConstraintSpec::JsonSchema(schema()),
            SamplingParams::greedy(),
            1,
        );
        r.constraint = None;
        r.stop.max_tokens = 300;
        r.thinking = thinks.then(|| thinking(None, None));
        handle.submit(r).unwrap().wait().unwrap().remove(0)
    };
    let (plain, thought) = (run(false), run(true));
    assert_eq!(thought.token_ids, plain.token_ids);
    assert_eq!(thought.finish, plain.finish);
}

#[test]
fn an_output_that_does_not_open_thinking_follows_the_format_at_once() {
    let handle = start();
    let mut r = request(
        chat("Describe a person called Ada."),
        ConstraintSpec::JsonSchema(schema()),
        SamplingParams::greedy(),
        1,
    );
    r.thinking = Some(thinking(Some("<think>"), Some(5)));
    let out = handle.submit(r).unwrap().wait().unwrap().remove(0);
    assert_eq!(out.finish, Some(FinishReason::Eos));
    // SmolLM2 does not write `<think>`: the answer starts at once.
    let value: serde_json::Value = serde_json::from_str(&out.text).unwrap();
    assert!(jsonschema::validator_for(&schema())
        .unwrap()
        .is_valid(&value));
}

#[test]
fn speculation_across_the_thinking_changes_no_token() {
    let handle = start_with(SpeculationConfig {
        cost: engine::CostCurve::flat(),
        max_draft_tokens: 16,
        ..SpeculationConfig::default()
    });
    let run = |method: SpecMethod, prediction: Option<&[u32]>| {
        let mut r = request(
            chat("Describe a person called Grace."),
            ConstraintSpec::JsonSchema(schema()),
            SamplingParams::greedy(),
            1,
        );
        r.thinking = Some(thinking(None, Some(12)));
        r.speculation = Some(SpecRequest {
            method,
            max_draft_tokens: None,
        });
        r.prediction = prediction.map(Into::into);
        handle.submit(r).unwrap().wait().unwrap().remove(0)
    };
    let plain = run(SpecMethod::None, None);
    assert_answer_holds(&plain.text);
    let mut accepted = 0;
    for method in [
        SpecMethod::Recycling,
        SpecMethod::NgramTrie,
        SpecMethod::PromptLookup,
        SpecMethod::Auto,
    ] {
        let out = run(method, None);
        assert_eq!(out.token_ids, plain.token_ids, "{method:?}");
        accepted += out.usage.accepted_tokens;
    }
    // A prediction of the whole output: drafts run through the thinking, the forced end and
    // the answer, and are all right.
    let out = run(SpecMethod::Auto, Some(&plain.token_ids));
    assert_eq!(out.token_ids, plain.token_ids);
    assert!(
        out.usage.accepted_prediction_tokens() >= plain.token_ids.len() / 2,
        "{:?}",
        out.usage
    );
    // One that is wrong after the thinking's first half.
    let mut wrong = plain.token_ids[..6].to_vec();
    wrong.extend(tokens(
        " and then something else entirely </think> {\"x\": 1}",
    ));
    let out = run(SpecMethod::Auto, Some(&wrong));
    assert_eq!(out.token_ids, plain.token_ids);
    accepted += out.usage.accepted_tokens;
    assert!(accepted > 0);
}
