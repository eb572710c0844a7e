//! `thicket generate` on a model without a chat template (a tiny random model with a
//! tokenizer and no `tokenizer_config.json`): the raw prompt is continued, and `--chat` is
//! refused with a message that says why and what to do.

use engine::model::testing::{write_tiny_hf_model, write_tiny_tokenizer, TinyModelSpec};

use crate::support::processes::thicket;

#[test]
fn generate_continues_a_raw_prompt_and_refuses_chat_without_a_template() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinyModelSpec::default();
    write_tiny_hf_model(dir.path(), &spec).unwrap();
    write_tiny_tokenizer(dir.path(), spec.vocab_size).unwrap();
    let model = dir.path().to_str().unwrap();
    let args = |chat: bool| {
        let mut args = vec!["generate", "--model", model, "--prompt", "<5> <6>"];
        args.extend(["--max-tokens", "3", "--json"]);
        if chat {
            args.push("--chat");
        }
        args.into_iter().map(str::to_string).collect::<Vec<_>>()
    };

    let out = thicket().args(args(false)).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json["prompt_token_ids"],
        serde_json::json!([5, 6]),
        "{json}"
    );
    assert_eq!(
        json["token_ids"].as_array().map(Vec::len),
        Some(3),
        "{json}"
    );

    let out = thicket().args(args(true)).output().unwrap();
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no chat template") && stderr.contains("leave out --chat"),
        "{stderr}"
    );
}
