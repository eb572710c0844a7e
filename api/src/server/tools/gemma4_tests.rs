//! The `gemma4` format: calls read whole and streamed (cut at every character, and split in
//! two at every boundary) give the same content and the same JSON arguments, the fragments
//! joining to them; malformed calls stay text without a panic; `<|tool_response>` is never
//! content and ends the answer; thinking and calls read together; and its grammar, compiled by
//! the engine's grammar compiler over a small byte-level vocabulary, takes valid calls and
//! refuses invalid ones, with its markers as text or as the model's own tokens.

use std::sync::Arc;

use engine::constraint::{ConstraintSpec, Grammars};
use engine::{ModelTokenizer, StopConditions};
use serde_json::{json, Value};

use super::format::{as_text, Markers, ToolFormat};
use super::format_tests::{calls_of, check, check_raw, stream_pieces, text_of};
use super::gemma4::{to_json, Gemma4, TOOL_RESPONSE};
use super::{parse_calls, Calls, Tool};
use crate::server::parts::{ChoiceReader, Part};
use crate::server::pipeline::end_at_hand_back;
use crate::server::reasoning::ReasoningParser;
use crate::server::tools::Piece;

fn tool(name: &str, parameters: Value) -> Tool {
    Tool {
        name: name.into(),
        parameters,
        declaration: json!({}),
    }
}

fn tools() -> Vec<Tool> {
    vec![
        tool(
            "get_weather",
            json!({"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"},
                "units": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"]}),
        ),
        tool(
            "set_config",
            json!({"type": "object", "properties": {
                "config": {"type": "object", "properties": {
                    "theme": {"type": "string"}, "count": {"type": "integer"}}},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}}}),
        ),
        tool("now", json!({"type": "object", "properties": {}})),
    ]
}

fn gemma() -> Calls {
    Calls::new(Arc::new(Gemma4), tools())
}

#[test]
fn one_call_two_calls_and_content_before_them() {
    let c = gemma();
    check(
        &c,
        "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>",
        None,
        &[("get_weather", json!({"city": "Paris"}))],
    );
    check(
        &c,
        "Let me check.\n<|tool_call>call:get_weather{city:<|\"|>London<|\"|>,days:2}<tool_call|><|tool_call>call:now{}<tool_call|><|tool_response>",
        Some("Let me check."),
        &[
            ("get_weather", json!({"city": "London", "days": 2})),
            ("now", json!({})),
        ],
    );
}

#[test]
fn nested_objects_arrays_and_scalars_become_json_as_written() {
    let c = gemma();
    check_raw(
        &c,
        "<|tool_call>call:set_config{config:{theme:<|\"|>dark<|\"|>,count:3},tags:[<|\"|>a<|\"|>,<|\"|>b<|\"|>]}<tool_call|>",
        &[(
            "set_config",
            "{\"config\":{\"theme\":\"dark\",\"count\":3},\"tags\":[\"a\",\"b\"]}",
        )],
    );
    check_raw(
        &c,
        "<|tool_call>call:now{a:-7,b:3.14,c:1.5e10,d:true,e:false,f:null,g:[],h:{},i:[1,[2,{j:null}]]}<tool_call|>",
        &[(
            "now",
            "{\"a\":-7,\"b\":3.14,\"c\":1.5e10,\"d\":true,\"e\":false,\"f\":null,\"g\":[],\"h\":{},\"i\":[1,[2,{\"j\":null}]]}",
        )],
    );
    // Blanks between tokens, and a key quoted as the template quotes its declarations'.
    check_raw(
        &c,
        "<|tool_call>call:now{ a: 1, <|\"|>b c<|\"|>:[ 2 , 3 ] }<tool_call|>",
        &[("now", "{\"a\":1,\"b c\":[2,3]}")],
    );
}

#[test]
fn strings_hold_any_text_and_come_out_escaped() {
    let text = "a, b} c: d\n{x:1} \"q\" \\ <tool_call|> <|tool_call>call:now{} é";
    check(
        &gemma(),
        &format!("<|tool_call>call:get_weather{{city:<|\"|>{text}<|\"|>}}<tool_call|>"),
        None,
        &[("get_weather", json!({ "city": text }))],
    );
    check(
        &gemma(),
        "<|tool_call>call:get_weather{city:<|\"|><|\"|>}<tool_call|>",
        None,
        &[("get_weather", json!({"city": ""}))],
    );
}

/// The (name, arguments) calls and the text of `text` streamed in two pieces cut at `cut`.
fn split_at(calls: &Calls, text: &str, cut: usize) -> (Vec<(String, String)>, String) {
    let mut reader = super::CallReader::new(calls.clone());
    let mut pieces = reader.push(&text[..cut]);
    pieces.extend(reader.push(&text[cut..]));
    pieces.extend(reader.finish());
    let content = text_of(&pieces);
    (calls_of(pieces), content)
}

#[test]
fn split_in_two_at_every_boundary_the_same_calls_and_fragments() {
    let c = gemma();
    let text = "Sure: <|tool_call>call:set_config{config:{count:12,theme:<|\"|>a <|\"\"|> b<|\"|>},tags:[<|\"|>x<|\"|>]}<tool_call|><|tool_call>call:get_weather{city:<|\"|>Köln<|\"|>,days:-1.5e3}<tool_call|><|tool_response>";
    let (content, whole) = parse_calls(text, &c).expect("calls");
    assert_eq!(content.as_deref(), Some("Sure:"));
    let whole: Vec<(String, String)> = whole
        .into_iter()
        .map(|c| (c.function.name, c.function.arguments))
        .collect();
    assert_eq!(
        whole[0].1,
        "{\"config\":{\"count\":12,\"theme\":\"a <|\\\"\\\"|> b\"},\"tags\":[\"x\"]}"
    );
    assert_eq!(whole[1].1, "{\"city\":\"Köln\",\"days\":-1.5e3}");
    for cut in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
        let (streamed, streamed_text) = split_at(&c, text, cut);
        assert_eq!(streamed, whole, "cut at {cut}");
        assert_eq!(streamed_text.trim(), "Sure:", "cut at {cut}");
    }
    // One character at a time, the first call's arguments come in many fragments.
    let (pieces, _) = stream_pieces(&c, text, 1);
    let fragments = pieces
        .iter()
        .filter(|p| matches!(p, Piece::Arguments { index: 0, .. }))
        .count();
    assert!(fragments > 20, "{fragments} fragments");
}

#[test]
fn a_call_cut_off_counts_as_far_as_its_arguments_got() {
    let c = gemma();
    check_raw(
        &c,
        "<|tool_call>call:get_weather{city:<|\"|>Os",
        &[("get_weather", "{\"city\":\"Os")],
    );
    check_raw(
        &c,
        "<|tool_call>call:now{}<tool_call|><|tool_call>call:get_weather{days:1",
        &[("now", "{}"), ("get_weather", "{\"days\":1")],
    );
    // Whole but its close marker cut off.
    check_raw(&c, "<|tool_call>call:now{}<tool_ca", &[("now", "{}")]);
    // A function not offered, cut off: no call.
    check_raw(&c, "<|tool_call>call:rm{path:<|\"|>/", &[]);
    // Forced to be calls: the same.
    check_raw(
        &c.clone().forced(true),
        "<|tool_call>call:get_weather{city:<|\"|>Os",
        &[("get_weather", "{\"city\":\"Os")],
    );
}

#[test]
fn malformed_calls_stay_text() {
    let c = gemma();
    for text in [
        "<|tool_call>call get_weather{}<tool_call|> ok",
        "<|tool_call>get_weather{}<tool_call|> ok",
        "<|tool_call>call:get weather{}<tool_call|> ok",
        "<|tool_call>call:{}<tool_call|> ok",
        "<|tool_call>{\"name\": \"now\"}<tool_call|> ok",
    ] {
        check(&c, text, None, &[]);
    }
    // Broken arguments: not a call read whole; streamed, what had begun ends as sent; and
    // nothing panics at any cut.
    let deep = format!("<|tool_call>call:now{{a:{}", "[".repeat(500));
    for text in [
        "<|tool_call>call:get_weather{city:Paris}<tool_call|>",
        "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,}<tool_call|>",
        "<|tool_call>call:get_weather{days:01}<tool_call|>",
        "<|tool_call>call:get_weather{days:1 2}<tool_call|>",
        "<|tool_call>call:get_weather{:1}<tool_call|>",
        "<|tool_call>call:get_weather{a:[1,]}<tool_call|>",
        "<|tool_call>call:get_weather{a:tru}<tool_call|>",
        "<|tool_call>call:get_weather{a<tool_call|> ok",
        deep.as_str(),
    ] {
        assert!(parse_calls(text, &c).is_none(), "{text:?}");
        for step in [1, 2, 5] {
            let (pieces, _) = stream_pieces(&c, text, step);
            calls_of(pieces);
        }
    }
    assert_eq!(
        to_json(&format!("{}1{}", "[".repeat(40), "]".repeat(40))).map(|j| j.len()),
        Some(81)
    );
    assert_eq!(
        to_json(&format!("{}1{}", "[".repeat(100), "]".repeat(100))),
        None
    );
}

#[test]
fn the_tool_response_marker_is_never_content_and_ends_the_answer() {
    let c = gemma();
    for forced in [false, true] {
        let c = c.clone().forced(forced);
        let text = "<|tool_call>call:now{}<tool_call|><|tool_response>response:now{t:1}";
        let (content, found) = parse_calls(text, &c).expect("a call");
        assert_eq!((content, found.len()), (None, 1));
        for step in 1..=8 {
            let (pieces, _) = stream_pieces(&c, text, step);
            assert_eq!(text_of(&pieces), "", "every {step}");
        }
    }
    assert_eq!(Gemma4.end_markers(), [TOOL_RESPONSE]);
    // A vocabulary with the marker stops at its token; one without, at its text.
    let (tokenizer, _) = vocabulary(false);
    let mut stop = StopConditions::default();
    end_at_hand_back(&tokenizer, &Gemma4, &mut stop);
    assert_eq!(
        stop.stop_token_ids,
        tokenizer
            .token_to_id(TOOL_RESPONSE)
            .into_iter()
            .collect::<Vec<_>>()
    );
    assert!(stop.stop.is_empty() && !stop.stop_token_ids.is_empty());
    let mut stop = StopConditions::default();
    end_at_hand_back(&tokenizer, &super::hermes::Hermes, &mut stop);
    assert!(stop.stop_token_ids.is_empty() && stop.stop.is_empty());
}

#[test]
fn thinking_then_calls_read_as_the_chat_api_reads_them() {
    let text = "<|channel>thought\nNeed the weather.<channel|><|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>}<tool_call|><|tool_response>";
    let prompt = "<|turn>user\nWeather?<turn|>\n<|turn>model\n";
    let reasoning = ReasoningParser::Gemma4.for_prompt(prompt);
    for cut in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
        let mut reader = ChoiceReader::new(Some(gemma()), Some(reasoning));
        let mut parts = reader.push(&text[..cut]);
        parts.extend(reader.push(&text[cut..]));
        parts.extend(reader.finish());
        let (mut thinking, mut answer, mut pieces) = (String::new(), String::new(), Vec::new());
        for part in parts {
            match part {
                Part::Thinking(t) => thinking.push_str(&t),
                Part::Answer(Piece::Text(t)) => answer.push_str(&t),
                Part::Answer(piece) => pieces.push(piece),
                Part::End(_) => {}
            }
        }
        assert_eq!(
            (thinking.as_str(), answer.as_str()),
            ("Need the weather.", ""),
            "cut {cut}"
        );
        let want = vec![("get_weather".to_string(), "{\"city\":\"Oslo\"}".to_string())];
        assert_eq!(calls_of(pieces), want, "cut {cut}");
    }
}

/// A byte-level vocabulary (the 256 byte pieces) with `<eos>` (the end) and Gemma 4's call
/// markers, those special tokens when `special`; and its size.
fn vocabulary(special: bool) -> (ModelTokenizer, usize) {
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u32 {
        vocab.insert(format!("<0x{b:02X}>"), json!(b));
    }
    let markers = ["<|tool_call>", "<tool_call|>", "<|\"|>", TOOL_RESPONSE];
    let added = |id: usize, content: &str, special: bool| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": special})
    };
    let mut added_tokens = vec![added(256, "<eos>", true)];
    for (i, marker) in markers.iter().enumerate() {
        added_tokens.push(added(257 + i, marker, special));
    }
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added_tokens, "normalizer": null, "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": []},
    });
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).expect("written");
    let tokenizer = ModelTokenizer::from_hf_dir(dir.path(), vec![256]).expect("loads");
    (tokenizer, 257 + markers.len())
}

/// Compiles grammars and reads texts against them over one vocabulary.
struct Checker {
    tokenizer: ModelTokenizer,
    grammars: Grammars,
}

impl Checker {
    fn new(special: bool) -> Self {
        let (tokenizer, size) = vocabulary(special);
        let grammars = Grammars::new(Arc::new(tokenizer.clone()), size, vec![256]);
        Self {
            tokenizer,
            grammars,
        }
    }

    /// Whether `grammar` takes the whole of `text` and may end there.
    fn accepts(&self, grammar: &str, text: &str) -> bool {
        let spec = ConstraintSpec::Lark(grammar.to_string());
        let mut constraint = match self.grammars.compile(&spec) {
            Ok(c) => c,
            Err(e) => panic!("{e}\n{grammar}"),
        };
        for id in self.tokenizer.encode_plain(text).expect("encodes") {
            let mask = constraint.mask().expect("a mask");
            if !mask.allows(id) {
                return false;
            }
            constraint.advance(id).expect("advances");
        }
        constraint.mask().expect("a mask").allows(256)
    }
}

#[test]
fn the_grammar_takes_valid_calls_and_refuses_invalid_ones() {
    let all = tools();
    let allowed: Vec<&Tool> = all.iter().collect();
    for special in [false, true] {
        let checker = Checker::new(special);
        let token = |m: &str| checker.tokenizer.token_to_id(m).filter(|_| special);
        let own = Markers::new(&token);
        let text = Markers::new(&as_text);
        let markers = if special { &own } else { &text };
        let several = Gemma4.grammar(&allowed, true, markers);
        let one = Gemma4.grammar(&allowed[..1], false, markers);
        assert_eq!(several.contains("<[259]>"), special, "{several}");
        let weather = "<|tool_call>call:get_weather{city:<|\"|>Paris, \"FR\" {x:1}\n<|\"|>,days:3,units:<|\"|>c<|\"|>}<tool_call|>";
        let config = "<|tool_call>call:set_config{config:{count:-2,theme:<|\"|><|\"|>},tags:[<|\"|>a<|\"|>,<|\"|>b<|\"|>]}<tool_call|>";
        let valid = [
            weather,
            "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>}<tool_call|>",
            config,
            "<|tool_call>call:set_config{}<tool_call|>",
            "<|tool_call>call:now{}<tool_call|>",
            "<|tool_call>call:now{any:[1,<|\"|>x<|\"|>,{b:null}]}<tool_call|>",
        ];
        for call in valid {
            assert!(checker.accepts(&several, call), "special {special}: {call}");
            let args = &call[call.find('{').expect("args")..call.len() - 12];
            assert!(to_json(args).is_some(), "{args}");
        }
        assert!(checker.accepts(&several, &format!("{weather}{config}")));
        assert!(checker.accepts(&one, weather));
        let invalid = [
            // Not an allowed function; a required key left out; a type, an enum value, a key
            // order (the template's) or an array bound broken; JSON instead of the syntax.
            "<|tool_call>call:rm{}<tool_call|>",
            "<|tool_call>call:get_weather{days:3}<tool_call|>",
            "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>,days:<|\"|>3<|\"|>}<tool_call|>",
            "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>,units:<|\"|>k<|\"|>}<tool_call|>",
            "<|tool_call>call:get_weather{days:3,city:<|\"|>Oslo<|\"|>}<tool_call|>",
            "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>,city:<|\"|>Oslo<|\"|>}<tool_call|>",
            "<|tool_call>call:set_config{tags:[<|\"|>a<|\"|>,<|\"|>b<|\"|>,<|\"|>c<|\"|>,<|\"|>d<|\"|>]}<tool_call|>",
            "<|tool_call>call:get_weather{\"city\":\"Oslo\"}<tool_call|>",
            "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>}",
            "call:now{}",
        ];
        for call in invalid {
            assert!(
                !checker.accepts(&several, call),
                "special {special}: {call}"
            );
        }
        // A named function is called once.
        let twice = "<|tool_call>call:get_weather{city:<|\"|>a<|\"|>}<tool_call|>";
        assert!(!checker.accepts(&one, &format!("{twice}{twice}")));
        assert!(!checker.accepts(&one, config));
    }
}

#[test]
fn schemas_the_grammar_follows_and_those_it_does_not() {
    let checker = Checker::new(false);
    let grammar = |parameters: Value| {
        let t = tool("f", parameters);
        Gemma4.grammar(&[&t], false, &Markers::new(&as_text))
    };
    let call = |args: &str| format!("<|tool_call>call:f{args}<tool_call|>");
    let cases = [
        (
            json!({"type": "object", "properties": {"a": {"type": ["integer", "null"]},
                   "b": {"anyOf": [{"type": "boolean"}, {"const": {"k": [1, "x"]}}]},
                   "c": {"type": "string", "minLength": 2, "maxLength": 3}}}),
            vec![
                "{a:null,b:{k:[1,<|\"|>x<|\"|>]},c:<|\"|>xyz<|\"|>}",
                "{a:5,b:false}",
                "{}",
            ],
            vec![
                "{a:1.5}",
                "{b:1}",
                "{c:<|\"|>x<|\"|>}",
                "{c:<|\"|>wxyz<|\"|>}",
            ],
        ),
        (
            json!({"type": "object", "additionalProperties": {"type": "number"}}),
            vec!["{x:1,y:2.5e3}", "{}"],
            vec!["{x:true}"],
        ),
        (
            json!({"type": "object", "properties": {"l": {"type": "array", "minItems": 2,
                   "items": {"type": "integer"}}}, "required": ["l"]}),
            vec!["{l:[1,2,3]}"],
            vec!["{l:[1]}", "{}"],
        ),
        // Not followed: a pattern (any string) and a $ref (any value).
        (
            json!({"type": "object", "properties": {"p": {"type": "string", "pattern": "^a$"},
                   "r": {"$ref": "#/$defs/x"}}}),
            vec!["{p:<|\"|>b<|\"|>,r:[{q:<|\"|>w<|\"|>}]}"],
            vec!["{p:1}"],
        ),
    ];
    for (schema, valid, invalid) in cases {
        let g = grammar(schema);
        for args in valid {
            assert!(checker.accepts(&g, &call(args)), "{args}\n{g}");
        }
        for args in invalid {
            assert!(!checker.accepts(&g, &call(args)), "{args}\n{g}");
        }
    }
}
