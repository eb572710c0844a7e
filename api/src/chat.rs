//! Chat prompts: renders a list of messages with the model's own Jinja chat template
//! (minijinja), adding the generation prompt so the model answers as the assistant.

use minijinja::{context, Environment};
use serde::Serialize;

/// One chat message.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// Text.
    pub content: String,
}

impl ChatMessage {
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: "user".into(),
            content: content.into(),
        }
    }
}

/// Renders `messages` with `template`; errors name what failed in the template.
pub fn render_chat(
    template: &str,
    messages: &[ChatMessage],
    bos_token: &str,
    eos_token: &str,
) -> anyhow::Result<String> {
    let mut env = Environment::new();
    env.set_unknown_method_callback(minijinja_contrib_pycompat);
    env.add_template("chat", template)
        .map_err(|e| anyhow::anyhow!("chat template does not parse: {e}"))?;
    let rendered = env
        .get_template("chat")
        .and_then(|t| {
            t.render(context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => bos_token,
                eos_token => eos_token,
            })
        })
        .map_err(|e| anyhow::anyhow!("chat template failed: {e}"))?;
    Ok(rendered)
}

/// Python string methods some templates call (`strip`, `startswith`, ...).
fn minijinja_contrib_pycompat(
    _state: &minijinja::State,
    value: &minijinja::Value,
    method: &str,
    args: &[minijinja::Value],
) -> Result<minijinja::Value, minijinja::Error> {
    let unknown = || {
        minijinja::Error::new(
            minijinja::ErrorKind::UnknownMethod,
            format!("method {method} is not supported in chat templates"),
        )
    };
    let s = value.as_str().ok_or_else(unknown)?;
    let arg = |i: usize| args.get(i).and_then(|a| a.as_str()).unwrap_or("");
    Ok(match method {
        "strip" => s.trim().into(),
        "lstrip" => s.trim_start().into(),
        "rstrip" => s.trim_end().into(),
        "startswith" => s.starts_with(arg(0)).into(),
        "endswith" => s.ends_with(arg(0)).into(),
        "upper" => s.to_uppercase().into(),
        "lower" => s.to_lowercase().into(),
        _ => return Err(unknown()),
    })
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
        let out = render_chat(template, &[ChatMessage::user("hi")], "", "").unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn broken_template_is_an_error() {
        assert!(render_chat("{% for %}", &[], "", "").is_err());
    }
}
