//! Chat prompts: renders a list of messages with the model's own Jinja chat template
//! (minijinja), adding the generation prompt so the model answers as the assistant. Tools and
//! tool calls go to templates that know them (Qwen2.5's) as `tools` and `message.tool_calls`;
//! for a template that never mentions tools, they are written into the conversation in the
//! same `<tools>` / `<tool_call>` / `<tool_response>` form, so any chat model can be offered
//! functions and see their results.

use minijinja::{context, Environment};
use serde::Serialize;

/// One chat message.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text.
    pub content: String,
    /// An assistant message's calls: `{"id", "type": "function", "function": {"name",
    /// "arguments"}}`, the arguments an object (as templates expect them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<serde_json::Value>,
    /// The call a `tool` message answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The function a `tool` message answers for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What an assistant message thought before it, under the name Qwen3's and DeepSeek's
    /// templates read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The same, under the name gpt-oss's template reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

impl ChatMessage {
    /// A message of `role` with plain text.
    pub fn text(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning_content: None,
            thinking: None,
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::text("user", content)
    }
}

/// The tool-call markers a model writes (Qwen2.5's, and the fallback's).
pub const TOOL_CALL_OPEN: &str = "<tool_call>";
/// See [`TOOL_CALL_OPEN`].
pub const TOOL_CALL_CLOSE: &str = "</tool_call>";

/// Whether `template` renders tools itself.
pub fn template_knows_tools(template: &str) -> bool {
    template.contains("tools")
}

/// `messages` with tools, calls and results written as text, for a template that knows no
/// tools: the tool list joins the first system message (or opens one), an assistant's calls
/// follow its text as `<tool_call>` blocks, and `tool` results become user turns in
/// `<tool_response>` blocks.
fn tools_as_text(messages: &[ChatMessage], tools: &[serde_json::Value]) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    if !tools.is_empty() {
        let mut listing = String::from(
            "# Tools\n\nYou may call one or more functions to help with the user's request. \
             Their signatures are inside <tools></tools>:\n<tools>",
        );
        for tool in tools {
            listing.push('\n');
            listing.push_str(&tool.to_string());
        }
        listing.push_str(
            "\n</tools>\n\nTo call a function, answer with a JSON object holding its name and \
             arguments inside <tool_call></tool_call> tags:\n<tool_call>\n\
             {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
        );
        match messages.first() {
            Some(first) if first.role == "system" => {
                out.push(ChatMessage::text(
                    "system",
                    format!("{}\n\n{listing}", first.content),
                ));
            }
            _ => out.push(ChatMessage::text("system", listing)),
        }
    }
    let skip =
        usize::from(!tools.is_empty() && messages.first().is_some_and(|m| m.role == "system"));
    for m in &messages[skip..] {
        match m.role.as_str() {
            "tool" => out.push(ChatMessage::user(format!(
                "<tool_response>\n{}\n</tool_response>",
                m.content
            ))),
            "assistant" if !m.tool_calls.is_empty() => {
                let mut text = m.content.clone();
                for call in &m.tool_calls {
                    let function = &call["function"];
                    // Name first, as the instructions above show it.
                    let shown = format!(
                        "{{\"name\": {}, \"arguments\": {}}}",
                        function["name"], function["arguments"]
                    );
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!("{TOOL_CALL_OPEN}\n{shown}\n{TOOL_CALL_CLOSE}"));
                }
                out.push(ChatMessage::text("assistant", text));
            }
            _ => out.push(m.clone()),
        }
    }
    out
}

/// Renders `messages` (and `tools`, when offered) with `template`; errors name what failed
/// in the template.
pub fn render_chat(
    template: &str,
    messages: &[ChatMessage],
    tools: &[serde_json::Value],
    bos_token: &str,
    eos_token: &str,
) -> anyhow::Result<String> {
    render_chat_with(
        template,
        messages,
        tools,
        bos_token,
        eos_token,
        &serde_json::Map::new(),
    )
}

/// `render_chat` with extra template variables (`chat_template_kwargs`, for example
/// `enable_thinking`); the variables the renderer sets itself (`messages`, `tools`,
/// `add_generation_prompt`, `bos_token`, `eos_token`) take precedence over them.
pub fn render_chat_with(
    template: &str,
    messages: &[ChatMessage],
    tools: &[serde_json::Value],
    bos_token: &str,
    eos_token: &str,
    kwargs: &serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<String> {
    let uses_tools = !tools.is_empty()
        || messages
            .iter()
            .any(|m| m.role == "tool" || !m.tool_calls.is_empty());
    let rewritten;
    let (messages, tools) = if uses_tools && !template_knows_tools(template) {
        rewritten = tools_as_text(messages, tools);
        (rewritten.as_slice(), &[][..])
    } else {
        (messages, tools)
    };
    let mut env = Environment::new();
    crate::chat_functions::install(&mut env);
    env.add_template("chat", template)
        .map_err(|e| anyhow::anyhow!("chat template does not parse: {e}"))?;
    let fixed = context! {
        messages => messages,
        tools => (!tools.is_empty()).then_some(tools),
        add_generation_prompt => true,
        bos_token => bos_token,
        eos_token => eos_token,
    };
    let rendered = env
        .get_template("chat")
        .and_then(|t| t.render(context! { ..fixed, ..minijinja::Value::from_serialize(kwargs) }))
        .map_err(|e| anyhow::anyhow!("chat template failed: {e}"))?;
    Ok(rendered)
}

/// An error unless `template` parses as a Jinja template.
pub fn check_template(template: &str) -> anyhow::Result<()> {
    let mut env = Environment::new();
    env.add_template("chat", template)
        .map_err(|e| anyhow::anyhow!("chat template does not parse: {e}"))?;
    Ok(())
}

/// `text` as a single user message in `tokenizer`'s chat template, ready to encode.
pub fn user_prompt(tokenizer: &engine::ModelTokenizer, text: &str) -> anyhow::Result<String> {
    let template = tokenizer
        .chat_template()
        .ok_or_else(|| anyhow::anyhow!("this model has no chat template"))?;
    let token_text = |id: Option<u32>| {
        id.and_then(|i| tokenizer.inner().id_to_token(i))
            .unwrap_or_default()
    };
    let eos = tokenizer.eos_ids().first().copied();
    render_chat(
        template,
        &[ChatMessage::user(text)],
        &[],
        &token_text(tokenizer.bos_id()),
        &token_text(eos),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml_with_generation_prompt() {
        let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let out = render_chat(template, &[ChatMessage::user("hi")], &[], "", "").unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn extra_variables_reach_the_template_but_do_not_replace_its_own() {
        let template = "{{ messages | length }}{% if enable_thinking is defined %}:{{ enable_thinking }}{% endif %}";
        let mut kwargs = serde_json::Map::new();
        let plain = render_chat_with(template, &[ChatMessage::user("hi")], &[], "", "", &kwargs);
        assert_eq!(plain.unwrap(), "1");
        kwargs.insert("enable_thinking".into(), serde_json::json!(false));
        kwargs.insert("messages".into(), serde_json::json!([1, 2, 3]));
        let out = render_chat_with(template, &[ChatMessage::user("hi")], &[], "", "", &kwargs);
        // Jinja writes booleans as Python does.
        assert_eq!(out.unwrap(), "1:False");
    }

    #[test]
    fn broken_template_is_an_error() {
        assert!(render_chat("{% for %}", &[], &[], "", "").is_err());
    }
}
