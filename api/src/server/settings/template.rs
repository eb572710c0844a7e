//! How chat templates render (`TemplateSetup`): the template itself (the model's, or the file
//! `--chat-template` names) and the extra variables it is given: the server's
//! `--default-chat-template-kwargs`, with a request's `chat_template_kwargs` over them (for
//! example `{"enable_thinking": false}` for Qwen3). A request's value that is not an object is
//! a 400 naming the field; the server's flags are checked before it starts.

use serde_json::{Map, Value};

use crate::server::error::{ApiError, ApiResult};

/// A chat template and the extra variables it is rendered with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TemplateSetup {
    /// A template replacing the model's own (`--chat-template`).
    pub template: Option<String>,
    /// Extra variables.
    pub kwargs: Map<String, Value>,
}

impl TemplateSetup {
    /// The setup for a request whose `chat_template_kwargs` is `given`: its variables over
    /// the server's.
    pub fn for_request(&self, given: Option<&Value>) -> ApiResult<Self> {
        let mut setup = self.clone();
        match given {
            None | Some(Value::Null) => {}
            Some(Value::Object(extra)) => {
                for (key, value) in extra {
                    setup.kwargs.insert(key.clone(), value.clone());
                }
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "chat_template_kwargs",
                    "chat_template_kwargs must be an object of template variables, e.g. {\"enable_thinking\": false}",
                ))
            }
        }
        Ok(setup)
    }
}

/// `--default-chat-template-kwargs`: a JSON object.
pub fn parse_kwargs(text: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => {
            Err("a JSON object of template variables, e.g. {\"enable_thinking\": false}".into())
        }
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_request_s_variables_go_over_the_server_s() {
        let server = TemplateSetup {
            template: None,
            kwargs: parse_kwargs(r#"{"enable_thinking": false, "x": 1}"#).unwrap(),
        };
        let merged = server
            .for_request(Some(&json!({"enable_thinking": true})))
            .unwrap();
        assert_eq!(
            Value::Object(merged.kwargs),
            json!({"enable_thinking": true, "x": 1})
        );
        assert_eq!(server.for_request(None).unwrap(), server);
        let e = server.for_request(Some(&json!([1]))).unwrap_err();
        assert_eq!(e.body()["error"]["param"], "chat_template_kwargs");
        assert!(parse_kwargs("[1]").is_err() && parse_kwargs("{").is_err());
    }
}
