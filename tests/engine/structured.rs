//! Constrained decoding on SmolLM2: outputs asked to follow one of 30 JSON schemas parse
//! and validate against it (checked with the `jsonschema` crate, not with the engine's own
//! grammar code), greedy and sampled, for one sample and for forked samples (`n > 1`; a
//! sample may instead spend its whole token budget inside a string the schema leaves
//! unbounded, and at most two of about sixty do);
//! any-object, regex and choice formats hold; with speculation (draft trees pruned to what
//! the format allows, every node verified against its own mask) greedy output is token for
//! token the output without it, for every drafter; tokens the format forces are fed as a
//! tree of their own and all accepted (jump-forward), even by a drafter whose own drafts
//! never are; a special token written in a grammar (`<[id]>`) is that token, and stays in
//! the text when special tokens are not skipped. `structured_limits` tests formats that
//! cannot compile or that reach the grammar engine's limits, with this file's helpers.

use engine::constraint::ConstraintSpec;
use engine::handle::EngineHandle;
use engine::{
    EngineConfig, FinishReason, Request, SamplingParams, SpecMethod, SpecRequest,
    SpeculationConfig, StopConditions,
};
use kvcache::ManagerConfig;
use scheduler::SchedulerConfig;
use serde_json::json;

use crate::support::fixtures::{smollm2, spawn_smollm2};

pub(crate) fn start() -> EngineHandle {
    start_with(SpeculationConfig::default())
}

pub(crate) fn start_with(speculation: SpeculationConfig) -> EngineHandle {
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: 512,
            max_num_seqs: 16,
            max_model_len: 1024,
            kv: ManagerConfig {
                num_blocks: 256,
                block_size: 16,
                prefix_caching: true,
                watermark: 0.01,
                window: None,
            },
        },
        max_pending: 64,
        speculation,
        kv_prefault: false,
        state_snapshots: Default::default(),
    };
    spawn_smollm2(config)
}

pub(crate) fn chat(question: &str) -> Vec<u32> {
    let text =
        format!("<|im_start|>user\n{question} Answer in JSON.<|im_end|>\n<|im_start|>assistant\n");
    smollm2().tokenizer.encode_plain(&text).unwrap()
}

/// Output tokens each request may take.
const MAX_TOKENS: usize = 400;

/// Samples (of about 60) that may run to `MAX_TOKENS`.
const MAY_WANDER: usize = 2;

pub(crate) fn request(
    prompt: Vec<u32>,
    spec: ConstraintSpec,
    sampling: SamplingParams,
    n: usize,
) -> Request {
    Request {
        prompt,
        sampling,
        stop: StopConditions {
            max_tokens: MAX_TOKENS,
            ..StopConditions::default()
        },
        n,
        speculation: Some(SpecRequest {
            method: SpecMethod::PromptLookup,
            max_draft_tokens: None,
        }),
        constraint: Some(spec),
        thinking: None,
        prediction: None,
        cache_salt: None,
        pooling: None,
    }
}

/// Real-world shapes: nested objects, bounded arrays, enums, nullable fields, `$ref`,
/// patterns and number bounds; four here, the rest in `tests/data/json_schemas.json`.
fn schemas() -> Vec<(String, serde_json::Value)> {
    let mut all: Vec<(String, serde_json::Value)> = four_schemas()
        .into_iter()
        .map(|(q, s)| (q.to_string(), s))
        .collect();
    let more: Vec<serde_json::Value> =
        serde_json::from_str(include_str!("../data/json_schemas.json")).unwrap();
    for case in more {
        all.push((
            case["question"].as_str().unwrap().to_string(),
            case["schema"].clone(),
        ));
    }
    all
}

fn four_schemas() -> Vec<(&'static str, serde_json::Value)> {
    vec![
        (
            "Describe a person called Ada.",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 20},
                    "age": {"type": "integer", "minimum": 0, "maximum": 150},
                    "email": {"anyOf": [{"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"}, {"type": "null"}]}
                },
                "required": ["name", "age", "email"],
                "additionalProperties": false
            }),
        ),
        (
            "List three fruits with their colours.",
            json!({
                "type": "object",
                "properties": {
                    "fruits": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 3,
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string", "maxLength": 12},
                                "colour": {"enum": ["red", "green", "yellow", "orange"]}
                            },
                            "required": ["name", "colour"],
                            "additionalProperties": false
                        }
                    }
                },
                "required": ["fruits"],
                "additionalProperties": false
            }),
        ),
        (
            "Give the shipping address of the order.",
            json!({
                "$defs": {
                    "address": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "maxLength": 16},
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
                        },
                        "required": ["city", "zip"],
                        "additionalProperties": false
                    }
                },
                "type": "object",
                "properties": {
                    "order": {"type": "integer", "minimum": 1},
                    "ship_to": {"$ref": "#/$defs/address"},
                    "express": {"type": "boolean"}
                },
                "required": ["order", "ship_to", "express"],
                "additionalProperties": false
            }),
        ),
        (
            "Rate the movie Alien.",
            json!({
                "type": "object",
                "properties": {
                    "title": {"type": "string", "maxLength": 24},
                    "stars": {"type": "number", "minimum": 0, "maximum": 5},
                    "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 4}
                },
                "required": ["title", "stars", "tags"],
                "additionalProperties": false
            }),
        ),
    ]
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

#[test]
fn outputs_follow_their_json_schema() {
    let handle = start();
    assert!(schemas().len() >= 30);
    let mut cases = Vec::new();
    for (i, (question, schema)) in schemas().into_iter().enumerate() {
        let spec = ConstraintSpec::JsonSchema(schema.clone());
        for (sampling, n) in [(SamplingParams::greedy(), 1), (sampled(i as u64), 2)] {
            let stream = handle
                .submit(request(chat(&question), spec.clone(), sampling, n))
                .unwrap();
            cases.push((question.clone(), schema.clone(), n, stream));
        }
    }
    let mut wandered = Vec::new();
    for (question, schema, n, stream) in cases {
        let validator = jsonschema::validator_for(&schema).unwrap();
        let outputs = stream.wait().unwrap();
        assert_eq!(outputs.len(), n);
        for out in outputs {
            // A sample at temperature 0.8 may wander inside a string the schema leaves
            // unbounded until the token budget is spent: the model's choice, not a broken
            // format (whatever changes the logits' last bits moves which samples do). Greedy
            // outputs must all end, and only a few samples may run out.
            if n > 1 && out.finish == Some(FinishReason::Length) {
                assert_eq!(
                    out.token_ids.len(),
                    MAX_TOKENS,
                    "{question}: {:?}",
                    out.text
                );
                wandered.push((question.clone(), out.text));
                continue;
            }
            assert_eq!(
                out.finish,
                Some(FinishReason::Eos),
                "{question} (n = {n}): {:?}",
                out.text
            );
            let value: serde_json::Value = serde_json::from_str(&out.text)
                .unwrap_or_else(|e| panic!("{question}: {e}: {:?}", out.text));
            let errors: Vec<String> = validator
                .iter_errors(&value)
                .map(|e| e.to_string())
                .collect();
            assert!(
                errors.is_empty(),
                "{question}: {value} breaks the schema: {errors:?}"
            );
        }
    }
    assert!(
        wandered.len() <= MAY_WANDER,
        "{} samples ran to the length limit: {wandered:?}",
        wandered.len()
    );
}

#[test]
fn speculation_under_a_format_changes_no_token() {
    // A flat cost curve makes every draft look free, so trees are as large as drafters can
    // make them and pruning and per-node masks are exercised on every step.
    let handle = start_with(SpeculationConfig {
        cost: engine::CostCurve::flat(),
        max_draft_tokens: 16,
        ..SpeculationConfig::default()
    });
    let methods = [
        SpecMethod::None,
        SpecMethod::Recycling,
        SpecMethod::NgramTrie,
        SpecMethod::PromptLookup,
        SpecMethod::Auto,
    ];
    let mut accepted = 0;
    for (question, schema) in schemas().into_iter().take(4) {
        let spec = ConstraintSpec::JsonSchema(schema);
        let outputs: Vec<_> = methods
            .iter()
            .map(|&method| {
                let mut r = request(chat(&question), spec.clone(), SamplingParams::greedy(), 1);
                r.speculation = Some(SpecRequest {
                    method,
                    max_draft_tokens: None,
                });
                handle.submit(r).unwrap().wait().unwrap().remove(0)
            })
            .collect();
        for (method, out) in methods.iter().zip(&outputs) {
            assert_eq!(
                out.token_ids, outputs[0].token_ids,
                "{question}: {method:?}"
            );
            accepted += out.usage.accepted_tokens;
        }
    }
    assert!(accepted > 0, "no draft was accepted under a format");
}

/// A drafter that proposes `drafts` tokens, all wrong (token 0, over and over): 8 for
/// method "wrong", none at all for "mute".
#[derive(Clone, Copy)]
struct Wrong {
    name: &'static str,
    drafts: usize,
}

impl engine::spec::Drafter for Wrong {
    fn method(&self) -> SpecMethod {
        SpecMethod::Named(self.name)
    }
    fn prepare(&mut self, _ctx: &engine::spec::DraftContext<'_>) -> usize {
        self.drafts
    }
    fn draft(&mut self, ctx: &engine::spec::DraftContext<'_>, budget: usize) -> engine::TokenTree {
        let mut chain = vec![ctx.tokens[ctx.tokens.len() - 1]];
        chain.extend(std::iter::repeat_n(0, budget.min(self.drafts)));
        engine::TokenTree::chain(&chain)
    }
    fn observe(&mut self, _tokens: &[u32], _appended: usize) {}
}

impl engine::spec::speculator::Speculator for Wrong {
    fn method(&self) -> SpecMethod {
        SpecMethod::Named(self.name)
    }
    fn drafter(
        &self,
        _seq: &engine::spec::NewSequence<'_>,
    ) -> Option<Box<dyn engine::spec::Drafter>> {
        Some(Box::new(*self))
    }
}

#[test]
fn forced_tokens_are_fed_at_once_and_all_accepted() {
    // Long required keys: after `{"` the format forces every token of a key.
    let schema = json!({
        "type": "object",
        "properties": {
            "the_full_name_of_the_person_described": {"type": "string", "maxLength": 12},
            "the_age_in_years_of_the_person_described": {"type": "integer", "minimum": 0, "maximum": 99}
        },
        "required": [
            "the_full_name_of_the_person_described",
            "the_age_in_years_of_the_person_described"
        ],
        "additionalProperties": false
    });
    let run = |method: SpecMethod, cost: engine::CostCurve| {
        let handle = start_with(SpeculationConfig {
            cost,
            max_draft_tokens: 16,
            speculators: vec![
                engine::spec::speculator::SpeculatorFactory::new("wrong", |_| {
                    Box::new(Wrong {
                        name: "wrong",
                        drafts: 8,
                    })
                }),
                engine::spec::speculator::SpeculatorFactory::new("mute", |_| {
                    Box::new(Wrong {
                        name: "mute",
                        drafts: 0,
                    })
                }),
            ],
            ..SpeculationConfig::default()
        });
        let mut r = request(
            chat("Describe Ada Lovelace."),
            ConstraintSpec::JsonSchema(schema.clone()),
            SamplingParams::greedy(),
            1,
        );
        r.speculation = Some(SpecRequest {
            method,
            max_draft_tokens: None,
        });
        let out = handle.submit(r).unwrap().wait().unwrap().remove(0);
        let steps = handle.stats().unwrap().scheduler.steps;
        (out, steps)
    };
    let (plain, plain_steps) = run(SpecMethod::None, engine::CostCurve::flat());
    let tokens = plain.token_ids.len() as u64;
    // Plain: one step per token (and one for the prompt).
    assert!(
        plain_steps >= tokens,
        "{plain_steps} steps for {tokens} tokens"
    );
    // Rows that cost something: a drafter without evidence would get no tree here, but
    // forced tokens are offered as certain, so even a drafter that never drafts gets room
    // for them.
    let costly = engine::CostCurve::new(vec![(1, 1.0), (2, 1.2), (8, 2.2), (64, 12.0)]).unwrap();
    for (method, cost) in [
        (SpecMethod::Named("wrong"), engine::CostCurve::flat()),
        (SpecMethod::Named("mute"), costly),
    ] {
        let (forced, forced_steps) = run(method, cost);
        assert_eq!(forced.token_ids, plain.token_ids, "{method:?}");
        assert_eq!(
            forced.usage.accepted_tokens, 0,
            "{method:?}: a drafter was accepted"
        );
        // The keys alone force more than 20 tokens, each of which needs no step of its own.
        assert!(
            forced_steps + 20 <= plain_steps,
            "{method:?}: {forced_steps} steps with jump-forward, {plain_steps} without"
        );
    }
}

#[test]
fn any_object_and_regex_formats_hold() {
    let handle = start();
    let object = handle
        .submit(request(
            chat("Which city is the capital of France? Use the key \"capital\"."),
            ConstraintSpec::JsonObject,
            SamplingParams::greedy(),
            1,
        ))
        .unwrap()
        .wait()
        .unwrap()
        .remove(0);
    assert_eq!(object.finish, Some(FinishReason::Eos), "{:?}", object.text);
    let value: serde_json::Value = serde_json::from_str(&object.text).unwrap();
    assert!(value.is_object(), "{value}");
    let date = handle
        .submit(request(
            chat("When did the Berlin wall fall?"),
            ConstraintSpec::Regex("[0-9]{4}-[0-9]{2}-[0-9]{2}".into()),
            sampled(7),
            1,
        ))
        .unwrap()
        .wait()
        .unwrap()
        .remove(0);
    let bytes = date.text.as_bytes();
    assert_eq!(bytes.len(), 10, "{:?}", date.text);
    assert!(
        bytes.iter().enumerate().all(|(i, b)| if i == 4 || i == 7 {
            *b == b'-'
        } else {
            b.is_ascii_digit()
        }),
        "{:?}",
        date.text
    );
}

#[test]
fn a_choice_gives_one_of_its_strings() {
    let handle = start();
    let choices = vec![
        "positive".to_string(),
        "negative (sad)".to_string(),
        "n/a".to_string(),
    ];
    for (question, seed) in [
        ("I loved this film!", 1),
        ("The food was cold and bland.", 2),
    ] {
        let out = handle
            .submit(request(
                chat(&format!("Is this review positive or negative? {question}")),
                ConstraintSpec::Choice(choices.clone()),
                sampled(seed),
                2,
            ))
            .unwrap()
            .wait()
            .unwrap();
        for sample in out {
            assert!(choices.contains(&sample.text), "{:?}", sample.text);
        }
    }
}

#[test]
fn where_a_format_may_end_every_end_token_is_allowed() {
    // A chat model's turn end is often not its first end token (`<|endoftext|>` first, then
    // `<|im_end|>` here): a format that masked it would keep the model writing wherever the
    // format lets it go on.
    let loaded = smollm2();
    let tokenizer = std::sync::Arc::new(loaded.tokenizer.clone());
    let turn_end = loaded
        .tokenizer
        .encode_plain("<|im_end|>")
        .expect("encodes");
    assert_eq!(turn_end.len(), 1, "<|im_end|> is one token");
    let turn_end = turn_end[0];
    let text_end = loaded
        .tokenizer
        .token_to_id("<|endoftext|>")
        .expect("a token");
    assert!(loaded.tokenizer.eos_ids().contains(&turn_end));
    let ends = vec![text_end, turn_end];
    let vocab = loaded.model.config().vocab_size;
    let grammars = engine::constraint::Grammars::new(tokenizer, vocab, ends.clone());
    let spec = ConstraintSpec::Lark("start: \"yes\" (\" yes\")*\n".into());
    let mut constraint = grammars.compile(&spec).expect("compiles");
    let yes = loaded.tokenizer.encode_plain("yes").expect("encodes");
    let mask = constraint.mask().expect("a mask");
    assert!(
        ends.iter().all(|&e| !mask.allows(e)),
        "nothing may end the output before \"yes\""
    );
    for &t in &yes {
        constraint.advance(t).expect("allowed");
    }
    let mask = constraint.mask().expect("a mask");
    for &end in &ends {
        assert!(mask.allows(end), "end token {end} allowed after \"yes\"");
    }
    assert_eq!(
        constraint.allowed_prefix(&[turn_end]).expect("validates"),
        1,
        "the turn end is accepted as the format's end"
    );
    assert!(constraint.mask_after(&[turn_end]).is_ok());
    constraint
        .advance(turn_end)
        .expect("the turn end ends the output");
}

#[test]
fn a_special_token_in_a_grammar_is_that_token() {
    // `<[id]>` is how tool-call grammars write a marker that is one special token of the
    // model's (Mistral's `[TOOL_CALLS]`); SmolLM2's `<|im_start|>` stands in for it.
    let handle = start();
    let tokenizer = &smollm2().tokenizer;
    let id = tokenizer.token_to_id("<|im_start|>").unwrap();
    let spec = ConstraintSpec::Lark(format!("start: <[{id}]> \"Hi\"\n"));
    let mut r = request(chat("Say hi."), spec, SamplingParams::greedy(), 1);
    r.stop.skip_special_tokens = false;
    let out = handle.submit(r).unwrap().wait().unwrap().remove(0);
    assert_eq!(out.token_ids[0], id);
    assert_eq!(out.text, "<|im_start|>Hi");
    assert_eq!(out.finish, Some(FinishReason::Eos));
}
