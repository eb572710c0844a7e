//! The tool-call formats by name (`--tool-call-parser`) and by the chat template that writes
//! them: `hermes` (`<tool_call>` blocks of JSON, Qwen2.5 and most fine-tunes), `llama3_json`
//! (a bare JSON object per call, `;` between them, after an optional `<|python_tag|>`),
//! `mistral` (`[TOOL_CALLS]` and a JSON list, or `[TOOL_CALLS]name[ARGS]{...}`) and
//! `qwen3_coder` (`<tool_call><function=NAME><parameter=P>` XML), `openai` (gpt-oss's
//! harmony messages to `functions.NAME`, read with the `openai_gptoss` reasoning parser) and
//! `gemma4` (`<|tool_call>call:NAME{key:value}<tool_call|>`, Gemma 4's value syntax).
//! [`default_for_template`] picks the one a model's chat template writes.

use std::sync::Arc;

use super::format::ToolFormat;
use super::gemma4;
use super::{
    gemma4::Gemma4, hermes::Hermes, llama3::Llama3Json, mistral::Mistral, openai::OpenAi,
    qwen3_coder::Qwen3Coder,
};

/// The names `--tool-call-parser` takes.
pub const TOOL_CALL_PARSERS: &[&str] = &[
    "hermes",
    "llama3_json",
    "mistral",
    "qwen3_coder",
    "openai",
    "gemma4",
];

/// The format `name` names; an error listing the names otherwise.
pub fn tool_format(name: &str) -> Result<Arc<dyn ToolFormat>, String> {
    match name {
        "hermes" => Ok(Arc::new(Hermes)),
        "llama3_json" => Ok(Arc::new(Llama3Json)),
        "mistral" => Ok(Arc::new(Mistral)),
        "qwen3_coder" => Ok(Arc::new(Qwen3Coder)),
        "openai" => Ok(Arc::new(OpenAi)),
        "gemma4" => Ok(Arc::new(Gemma4)),
        other => Err(format!(
            "unknown tool-call parser {other:?} (known: {})",
            TOOL_CALL_PARSERS.join(", ")
        )),
    }
}

/// The format a chat template writes its calls in (`hermes` when it shows none of the
/// others' markers, and for templates without tool support, which thicket shows `hermes`
/// calls in).
pub fn default_for_template(template: Option<&str>) -> Arc<dyn ToolFormat> {
    let template = template.unwrap_or_default();
    if template.contains("<|channel|>") && template.contains("<|call|>") {
        Arc::new(OpenAi)
    } else if template.contains(gemma4::CALL_OPEN) && template.contains(gemma4::CALL_CLOSE) {
        Arc::new(Gemma4)
    } else if template.contains("<function=") && template.contains("<parameter=") {
        Arc::new(Qwen3Coder)
    } else if template.contains("[TOOL_CALLS]") {
        Arc::new(Mistral)
    } else if template.contains("<|python_tag|>") || template.contains("<|eom_id|>") {
        Arc::new(Llama3Json)
    } else {
        Arc::new(Hermes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_templates_pick_their_format() {
        for name in TOOL_CALL_PARSERS {
            assert_eq!(tool_format(name).map(|f| f.name()), Ok(*name));
        }
        assert!(tool_format("xml")
            .unwrap_err()
            .contains("hermes, llama3_json"));
        let pick = |t: &str| default_for_template(Some(t)).name();
        assert_eq!(pick("{{ '<tool_call>' }}"), "hermes");
        assert_eq!(
            pick("<tool_call>\n<function={{ n }}>\n<parameter={{ p }}>"),
            "qwen3_coder"
        );
        assert_eq!(pick("{{ '[TOOL_CALLS]' + calls|tojson }}"), "mistral");
        assert_eq!(
            pick("{{ '<|python_tag|>' }}{{ '<|eom_id|>' }}"),
            "llama3_json"
        );
        assert_eq!(
            pick("{{ '<|start|>assistant<|channel|>commentary ' }}{{ '<|call|>' }}"),
            "openai"
        );
        assert_eq!(
            pick("{{- '<|tool_call>call:' + name + '{' -}}{{- '}<tool_call|>' -}}"),
            "gemma4"
        );
        // One of its markers alone (beside Hermes' `</tool_call>`) is not enough.
        assert_eq!(pick("{{ '<|tool_call>' }}{{ '</tool_call>' }}"), "hermes");
        assert_eq!(default_for_template(None).name(), "hermes");
    }
}
