//! A format inside a frame (`ConstraintSpec::Framed`, what gpt-oss's harmony header around
//! a structured answer is): on SmolLM2, the output is the frame's text, a special token of
//! the model's among it, and then text in the inner format, for each kind of inner format;
//! a frame inside a frame is refused.

use engine::constraint::ConstraintSpec;
use engine::{FinishReason, SamplingParams};
use serde_json::json;

use super::structured::{chat, request, start};
use crate::support::fixtures::smollm2;

#[test]
fn a_framed_format_writes_the_frame_then_the_inner_format() {
    let handle = start();
    let tokenizer = &smollm2().tokenizer;
    let id = tokenizer.token_to_id("<|im_start|>").unwrap();
    let frame = format!("start: <[{id}]> \"final:\" @inner\n");
    // A bounded string: the output ends on every kernel path, whatever the model writes in it.
    let schema = json!({"type": "object", "properties": {"capital": {"type": "string", "maxLength": 24}},
                        "required": ["capital"], "additionalProperties": false});
    let inners = [
        ConstraintSpec::JsonSchema(schema.clone()),
        ConstraintSpec::Regex("[0-9]{4}".into()),
        ConstraintSpec::Choice(vec!["yes".into(), "no".into()]),
        ConstraintSpec::Lark("start: \"Paris\" | \"Rome\"\n".into()),
    ];
    for inner in inners {
        let spec = ConstraintSpec::Framed {
            frame: frame.clone(),
            inner: Box::new(inner.clone()),
        };
        let mut r = request(
            chat("Which city is the capital of France? Use the key \"capital\"."),
            spec,
            SamplingParams::greedy(),
            1,
        );
        r.stop.skip_special_tokens = false;
        let out = handle.submit(r).unwrap().wait().unwrap().remove(0);
        assert_eq!(out.token_ids[0], id, "{inner:?}: {:?}", out.text);
        assert_eq!(
            out.finish,
            Some(FinishReason::Eos),
            "{inner:?}: {:?}",
            out.text
        );
        let rest = out
            .text
            .strip_prefix("<|im_start|>final:")
            .unwrap_or_else(|| panic!("{inner:?}: no frame in {:?}", out.text));
        match &inner {
            ConstraintSpec::JsonSchema(_) => {
                let value: serde_json::Value = serde_json::from_str(rest).unwrap();
                assert!(jsonschema::is_valid(&schema, &value), "{value}");
            }
            ConstraintSpec::Regex(_) => {
                assert!(
                    rest.len() == 4 && rest.bytes().all(|b| b.is_ascii_digit()),
                    "{rest:?}"
                )
            }
            ConstraintSpec::Choice(c) => assert!(c.iter().any(|c| c == rest), "{rest:?}"),
            _ => assert!(rest == "Paris" || rest == "Rome", "{rest:?}"),
        }
    }
}

#[test]
fn a_frame_inside_a_frame_is_refused() {
    let handle = start();
    let framed = |inner| ConstraintSpec::Framed {
        frame: "start: \"a\" @inner\n".into(),
        inner: Box::new(inner),
    };
    let spec = framed(framed(ConstraintSpec::JsonObject));
    let r = request(chat("Hi."), spec, SamplingParams::greedy(), 1);
    let err = match handle.submit(r) {
        Err(e) => e.to_string(),
        Ok(waiting) => match waiting.wait() {
            Err(e) => e.to_string(),
            Ok(out) => panic!("a nested frame compiled: {:?}", out[0].text),
        },
    };
    assert!(err.contains("framed format inside another"), "{err}");
}
