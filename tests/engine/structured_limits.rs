//! Formats the grammar engine cannot or should not build, on SmolLM2: a schema, regex, grammar
//! or choice that cannot compile is refused at submission, naming `response_format`; one
//! beyond the grammar engine's limits fails its request as the format's fault; formats whose
//! automata would be astronomically large compile in bounded time (llguidance builds them
//! lazily) and their requests end.

use engine::constraint::ConstraintSpec;
use engine::{Event, SamplingParams, SubmitError};
use serde_json::json;

use super::structured::{chat, request, start};

/// An object schema `levels` objects deep.
fn nested(levels: usize) -> serde_json::Value {
    let mut schema = json!({"type": "string", "maxLength": 4});
    for _ in 0..levels {
        schema = json!({"type": "object", "properties": {"a": schema}, "required": ["a"]});
    }
    schema
}

#[test]
fn formats_that_cannot_compile_are_refused_at_submission() {
    let handle = start();
    let bad = [
        ConstraintSpec::JsonSchema(
            json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
        ),
        ConstraintSpec::JsonSchema(json!({"type": "frobnicate"})),
        ConstraintSpec::Regex("(unclosed".into()),
        ConstraintSpec::Lark("start: undefined_rule".into()),
        ConstraintSpec::Choice(Vec::new()),
        // Validation keywords llguidance does not implement are refused and named, never
        // silently dropped (an output could break them).
        ConstraintSpec::JsonSchema(json!({"type": "array", "uniqueItems": true})),
        ConstraintSpec::JsonSchema(json!({"not": {"type": "string"}})),
        // Nested deeper than any schema compiles (its compiler recurses).
        ConstraintSpec::JsonSchema(nested(200)),
    ];
    for spec in bad {
        match handle.submit(request(
            chat("Hi."),
            spec.clone(),
            SamplingParams::greedy(),
            1,
        )) {
            Err(SubmitError::Invalid(e)) => {
                assert_eq!(e.field, "response_format", "{spec:?}");
                assert!(
                    e.message.starts_with("the output format cannot be used: ")
                        && !e.message.contains('\n'),
                    "{}",
                    e.message
                );
                if let ConstraintSpec::JsonSchema(schema) = &spec {
                    for keyword in ["uniqueItems", "not"] {
                        if schema.get(keyword).is_some() {
                            assert!(e.message.contains(keyword), "{}", e.message);
                        }
                    }
                }
            }
            other => panic!("{spec:?}: {:?}", other.map(|_| ())),
        }
    }
    // Nothing was queued: the engine is idle.
    assert_eq!(handle.pending(), 0);
}

#[test]
fn a_format_beyond_the_grammar_engines_limits_fails_its_request_as_the_formats_fault() {
    let handle = start();
    // Thousands of optional properties compile, and the first token (`{`) is allowed, but
    // the mask after it would need more Earley items than llguidance allows: the request
    // fails, marked as its format's failure (the server answers 400, not a 5xx a router
    // would retry elsewhere), and the engine goes on.
    let properties: serde_json::Map<String, serde_json::Value> = (0..3000)
        .map(|i| (format!("p{i}"), json!({"type": "string", "maxLength": 8})))
        .collect();
    // The last one required, so that `{}` cannot end the object at once.
    let spec = ConstraintSpec::JsonSchema(json!({
        "type": "object", "properties": properties, "required": ["p2999"]
    }));
    let stream = handle
        .submit(request(chat("Hi."), spec, SamplingParams::greedy(), 1))
        .expect("the format compiles");
    let failure = loop {
        match stream.recv() {
            Some(Event::Error(failure)) => break failure,
            Some(Event::Finished { .. } | Event::Pooled { .. }) | None => {
                panic!("the request did not fail")
            }
            Some(Event::Output { .. }) => {}
        }
    };
    assert!(failure.format, "{failure:?}");
    assert!(
        failure
            .message
            .starts_with("the output format could not be followed: "),
        "{}",
        failure.message
    );
    assert!(failure.message.contains("max is"), "{}", failure.message);
    // A format within the limits still runs on the same engine.
    let ok = ConstraintSpec::JsonSchema(json!({
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]
    }));
    let out = handle
        .submit(request(chat("Hi."), ok, SamplingParams::greedy(), 1))
        .unwrap()
        .wait()
        .unwrap()
        .remove(0);
    assert!(out.finish.is_some(), "{out:?}");
    assert_eq!(handle.pending(), 0);
}

#[test]
fn pathological_formats_compile_in_bounded_time_and_end() {
    let handle = start();
    // A string pattern, a regex and arrays whose automata or grammars would be a billion
    // states, and a grammar that repeats a repetition a million times.
    let mut arrays = json!({"type": "integer"});
    for _ in 0..3 {
        arrays = json!({"type": "array", "items": arrays, "minItems": 1000, "maxItems": 1000});
    }
    let bad = [
        // Deep, but within what compiles.
        ConstraintSpec::JsonSchema(nested(45)),
        ConstraintSpec::JsonSchema(
            json!({"type": "string", "pattern": "^[a-z]{1000}{1000}{1000}$"}),
        ),
        ConstraintSpec::JsonSchema(arrays),
        ConstraintSpec::Regex("[a-z]{1000}{1000}{1000}".into()),
        ConstraintSpec::Lark("start: x{1000}\nx: y{1000}\ny: \"a\"{1000}".into()),
    ];
    for spec in bad {
        let started = std::time::Instant::now();
        let answer = handle.submit(request(chat("Hi."), spec, SamplingParams::greedy(), 1));
        let took = started.elapsed();
        assert!(took.as_secs() < 20, "took {took:?} to compile");
        match answer {
            // llguidance builds lexers and grammars lazily: what it accepts must still end
            // (at `max_tokens` at the latest) with output the format allows so far.
            Ok(stream) => {
                let out = stream.wait().unwrap().remove(0);
                assert!(out.finish.is_some(), "{out:?}");
                assert!(started.elapsed().as_secs() < 120, "{out:?}");
            }
            Err(SubmitError::Invalid(e)) => {
                assert_eq!(e.field, "response_format");
                assert!(!e.message.is_empty());
            }
            Err(other) => panic!("{other:?}"),
        }
    }
}
