//! A multimodal checkpoint's `config.json` read as its text model's: the keys of
//! `text_config` (Qwen3.5 / Qwen3.6's `Qwen3_5ForConditionalGeneration`) over the top level's
//! (which names the architecture), and transformers 5's `rope_parameters` (`rope_theta`,
//! `partial_rotary_factor`, and a scaling `rope_type` with its parameters) as the top-level
//! keys older configs use (`rope_scaling` for the last). The vision tower's
//! weights are not read (the loader says so).

use serde_json::{Map, Value};

/// `raw` as the text model's config, and whether it carried a vision tower's.
pub(crate) fn text_model(raw: Value) -> (Value, bool) {
    let Value::Object(mut top) = raw else {
        return (raw, false);
    };
    let vision = top.contains_key("vision_config");
    let mut merged: Map<String, Value> = match top.remove("text_config") {
        Some(Value::Object(text)) => {
            let mut merged = text;
            for key in ["architectures", "eos_token_id", "tie_word_embeddings"] {
                if let Some(v) = top.get(key) {
                    merged.entry(key.to_string()).or_insert_with(|| v.clone());
                }
            }
            // The architecture is the checkpoint's, not the text model's own name.
            if let Some(v) = top.get("architectures") {
                merged.insert("architectures".into(), v.clone());
            }
            merged
        }
        _ => top,
    };
    if let Some(Value::Object(rope)) = merged.get("rope_parameters").cloned() {
        for key in ["rope_theta", "partial_rotary_factor"] {
            if let Some(v) = rope.get(key) {
                merged.entry(key.to_string()).or_insert_with(|| v.clone());
            }
        }
        let scaled = rope
            .get("rope_type")
            .and_then(Value::as_str)
            .is_some_and(|kind| kind != "default");
        if scaled {
            merged
                .entry("rope_scaling".to_string())
                .or_insert(Value::Object(rope));
        }
    }
    (Value::Object(merged), vision)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_config_wins_and_rope_parameters_flatten() {
        let raw = serde_json::json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "tie_word_embeddings": false,
            "text_config": {
                "model_type": "qwen3_5_text",
                "hidden_size": 64,
                "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.25}
            },
            "vision_config": {"depth": 2}
        });
        let (text, vision) = text_model(raw);
        assert!(vision);
        assert_eq!(text["architectures"][0], "Qwen3_5ForConditionalGeneration");
        assert_eq!(text["hidden_size"], 64);
        assert_eq!(text["rope_theta"], 1e7);
        assert_eq!(text["partial_rotary_factor"], 0.25);
        assert_eq!(text["tie_word_embeddings"], false);
        assert!(text.get("rope_scaling").is_none());
        let (plain, vision) = text_model(serde_json::json!({"hidden_size": 8}));
        assert!(!vision);
        assert_eq!(plain["hidden_size"], 8);
        // A scaled RoPE's parameters are its `rope_scaling`; an older config's own one stays.
        let yarn = serde_json::json!({"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0});
        let (scaled, _) = text_model(serde_json::json!({"rope_parameters": yarn.clone()}));
        assert_eq!(scaled["rope_scaling"], yarn);
        assert_eq!(scaled["rope_theta"], 150000.0);
        let (both, _) = text_model(serde_json::json!({
            "rope_parameters": yarn, "rope_scaling": {"rope_type": "linear", "factor": 2.0}
        }));
        assert_eq!(both["rope_scaling"]["rope_type"], "linear");
    }
}
