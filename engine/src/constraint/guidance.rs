//! Constraints compiled by llguidance. [`Grammars`] holds, per engine, llguidance's parser
//! factory over a token trie of the model's own token bytes (made from the same tokenizer
//! thicket encodes with, its vocabulary padded to the model's logits with tokens that can
//! never be allowed). Compiling a spec gives a [`GuidanceConstraint`], an llguidance
//! matcher. Compilation runs in the submitting thread, so a bad schema, regex or grammar is
//! a client error before anything is queued; llguidance's limits bound the time and size of
//! both compilation and every mask. Every end token of the engine is allowed exactly where the
//! format may end, not only the one llguidance knows as its end (a chat model ends its turn
//! with its own token, `<|im_end|>`, often not the tokenizer's first end token), and never
//! anywhere else, even where an end token's bytes would fit the text: an output under a
//! format that says it is done is complete.

use std::sync::{Arc, OnceLock};

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};

use super::thinking::TokenBytes;
use super::{Constraint, ConstraintSpec, ThinkingConstraint, ThinkingSpec, TokenMask};
use crate::model::tokenizer::ModelTokenizer;
use crate::{Error, Result};

/// llguidance's parser factory for one model, with the model's end tokens, the one
/// llguidance knows first.
struct Built {
    factory: Arc<ParserFactory>,
    ends: Arc<[u32]>,
}

/// Compiles constraint specs for one model; the token trie is built on first use.
pub struct Grammars {
    tokenizer: Arc<ModelTokenizer>,
    vocab: usize,
    /// The engine's end tokens.
    ends: Arc<[u32]>,
    factory: OnceLock<std::result::Result<Built, String>>,
    /// Every token's bytes, for thinking constraints (made from the factory's trie).
    token_bytes: OnceLock<Arc<TokenBytes>>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("vocab", &self.vocab)
            .field("ends", &self.ends)
            .field("ready", &self.factory.get().is_some())
            .finish()
    }
}

impl Grammars {
    /// Grammars over `tokenizer` for a model with `vocab` logits per row, ending outputs with
    /// any of `ends` (the engine's end tokens).
    pub fn new(tokenizer: Arc<ModelTokenizer>, vocab: usize, ends: Vec<u32>) -> Self {
        Self {
            tokenizer,
            vocab,
            ends: ends.into(),
            factory: OnceLock::new(),
            token_bytes: OnceLock::new(),
        }
    }

    /// A constraint that follows the output through `spec`'s thinking and applies `inner`
    /// (compiled from the request's format, if any) to the answer only.
    pub fn thinking(
        &self,
        spec: &ThinkingSpec,
        inner: Option<Box<dyn Constraint>>,
    ) -> Result<Box<dyn Constraint>> {
        let built = self.factory()?;
        let tokens = self.token_bytes.get_or_init(|| {
            let trie = built.factory.tok_env().tok_trie();
            let bytes = (0..self.vocab as u32)
                .map(|t| {
                    let b = trie.token(t);
                    match b.split_first() {
                        Some((&TokTrie::SPECIAL_TOKEN_MARKER, text)) => text.into(),
                        _ => b.into(),
                    }
                })
                .collect();
            Arc::new(TokenBytes {
                bytes,
                vocab: self.vocab,
                ends: built.ends.clone(),
            })
        });
        let encode = |text: &str| self.tokenizer.encode_plain(text);
        let start = match &spec.start {
            Some(start) => encode(start)?,
            None => Vec::new(),
        };
        let end = encode(&spec.end)?;
        if end.is_empty() {
            return Err(Error::Format(
                "the thinking end string has no tokens".into(),
            ));
        }
        Ok(Box::new(ThinkingConstraint::new(
            Arc::clone(tokens),
            spec,
            start,
            end,
            inner,
        )))
    }

    fn factory(&self) -> Result<&Built> {
        self.factory
            .get_or_init(|| self.build_factory())
            .as_ref()
            .map_err(|e| {
                Error::Metadata(format!(
                    "structured output is not available for this model's tokenizer: {e}"
                ))
            })
    }

    fn build_factory(&self) -> std::result::Result<Built, String> {
        let json = self
            .tokenizer
            .inner()
            .to_string(false)
            .map_err(|e| e.to_string())?;
        let json: serde_json::Value = serde_json::from_str(&json).map_err(|e| e.to_string())?;
        let mut words =
            llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| e.to_string())?;
        if words.len() > self.vocab {
            return Err(format!(
                "the tokenizer has {} tokens, the model {}",
                words.len(),
                self.vocab
            ));
        }
        // Rows of the model past the tokenizer's tokens: never allowed.
        words.resize(self.vocab, Vec::new());
        // The end llguidance knows: a special token where one of the ends is (text cannot
        // spell it), else the first.
        let special = |t: u32| {
            words
                .get(t as usize)
                .is_some_and(|w| w.first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER))
        };
        let eos = self
            .ends
            .iter()
            .copied()
            .find(|&t| special(t))
            .or_else(|| self.ends.first().copied())
            .ok_or("the model has no end token")?;
        let mut ends = vec![eos];
        ends.extend(self.ends.iter().copied().filter(|&t| t != eos));
        let info = TokRxInfo::new(self.vocab as u32, eos);
        let env = ApproximateTokEnv::new(TokTrie::from(&info, &words));
        let env: toktrie::TokEnv = Arc::new(env);
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        // Errors reach clients: the reason, without a dump of the parser's state.
        factory.limits_mut().verbose_errors = false;
        Ok(Built {
            factory: Arc::new(factory),
            ends: ends.into(),
        })
    }

    /// A constraint for `spec`; errors name what is wrong with it.
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<Box<dyn Constraint>> {
        let Built { factory, ends } = self.factory()?;
        let grammar = top_level(spec)?;
        // The reason, on its first line; the listing of the grammar after it is the one
        // compiled from the request (a tool call's, say), not the client's text.
        let parser = factory
            .create_parser(grammar)
            .map_err(|e| Error::Format(first_line(e)))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::Format(first_line(e)));
        }
        let mut constraint = GuidanceConstraint {
            matcher,
            vocab: self.vocab,
            ends: ends.clone(),
            next: None,
        };
        // The first mask, here rather than in the engine's first step (which then reuses
        // it): a format that exceeds llguidance's limits on its first token (thousands of
        // optional properties) is the client's error, not a failed request later.
        match constraint.compute_mask() {
            Ok(mask) => constraint.next = Some(mask),
            Err(Error::FormatFailed(reason)) => {
                return Err(Error::Format(format!(
                    "the grammar engine cannot compute its first token ({reason})"
                )))
            }
            Err(e) => return Err(e),
        }
        Ok(Box::new(constraint))
    }
}

/// Deepest JSON nesting of a schema compiled (its compiler recurses; far deeper than any
/// real schema, and than an HTTP body may be).
const MAX_SCHEMA_DEPTH: usize = 100;

/// How deeply `value` nests (a scalar is 0), found without recursion.
fn depth(value: &serde_json::Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0)];
    while let Some((value, at)) = stack.pop() {
        deepest = deepest.max(at);
        match value {
            serde_json::Value::Array(items) => stack.extend(items.iter().map(|v| (v, at + 1))),
            serde_json::Value::Object(map) => stack.extend(map.values().map(|v| (v, at + 1))),
            _ => {}
        }
    }
    deepest
}

/// The first line of llguidance's error: the reason (what follows is a placeholder for the
/// parser's state, which is not shown to clients).
fn first_line(error: impl std::fmt::Display) -> String {
    let text = error.to_string();
    text.lines().next().unwrap_or_default().to_string()
}

/// `text` as a regular expression that matches it literally.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `schema` with llguidance's JSON layout set to one line, `", "` between items and `": "`
/// after keys, unless the schema sets its own (`x-guidance`). Free whitespace would let a
/// model spin on newlines until `max_tokens`.
pub fn compact(schema: serde_json::Value) -> serde_json::Value {
    let mut schema = match schema {
        serde_json::Value::Bool(true) => serde_json::json!({}),
        other => other,
    };
    if let Some(object) = schema.as_object_mut() {
        let layout = object
            .entry("x-guidance")
            .or_insert_with(|| serde_json::json!({}));
        if let Some(layout) = layout.as_object_mut() {
            for (key, value) in [
                ("whitespace_flexible", serde_json::json!(false)),
                ("item_separator", serde_json::json!(", ")),
                ("key_separator", serde_json::json!(": ")),
            ] {
                layout.entry(key).or_insert(value);
            }
        }
    }
    schema
}

/// An llguidance matcher over the model's tokens.
pub struct GuidanceConstraint {
    matcher: Matcher,
    vocab: usize,
    /// The engine's end tokens; the first is the end llguidance knows.
    ends: Arc<[u32]>,
    /// The mask of the current state, once computed (the planner's look and the constraint
    /// stage of one step share it); cleared when the output grows.
    next: Option<TokenMask>,
}

impl GuidanceConstraint {
    fn failed(&self, what: &str) -> Error {
        Error::FormatFailed(format!(
            "{what}: {}",
            self.matcher
                .get_error()
                .map_or_else(|| "no reason given".into(), first_line)
        ))
    }

    /// `token`, or the end llguidance knows where it is another end token.
    fn as_known(&self, token: u32) -> u32 {
        match self.ends.split_first() {
            Some((&eos, others)) if others.contains(&token) => eos,
            _ => token,
        }
    }

    /// `tokens`, each as [`Self::as_known`] gives it.
    fn as_known_all<'a>(&self, tokens: &'a [u32]) -> std::borrow::Cow<'a, [u32]> {
        if tokens.iter().all(|&t| self.as_known(t) == t) {
            std::borrow::Cow::Borrowed(tokens)
        } else {
            tokens.iter().map(|&t| self.as_known(t)).collect()
        }
    }

    /// The matcher's mask now, computed afresh. Every end token is allowed exactly where the
    /// format may end (the matcher accepts, or has stopped), whatever llguidance's mask says
    /// of it: an end token whose bytes are also text (Qwen's `</s>` in a model that counts
    /// it as an end) must not end an output inside a string that admits those bytes.
    fn compute_mask(&mut self) -> Result<TokenMask> {
        let failed = |e: anyhow::Error| Error::FormatFailed(first_line(&e));
        let vob = self.matcher.compute_mask_or_eos().map_err(failed)?;
        let mut mask = TokenMask::from_words(self.vocab, vob.as_slice());
        let may_end = self.matcher.is_stopped() || self.matcher.is_accepting().map_err(failed)?;
        for &end in self.ends.iter() {
            if may_end {
                mask.allow(end);
            } else {
                mask.forbid(end);
            }
        }
        if mask.count() == 0 {
            return Err(self.failed("no token is allowed"));
        }
        Ok(mask)
    }
}

/// Nodes the planner is offered as certain when the next token is forced: the forced run is
/// often longer (a key, its quotes and colon), and the constraint stage feeds exactly the
/// forced tokens, leaving the rest of the room unused.
const FORCED_GUESS: usize = 8;

impl Constraint for GuidanceConstraint {
    fn mask(&mut self) -> Result<TokenMask> {
        if let Some(mask) = &self.next {
            return Ok(mask.clone());
        }
        let mask = self.compute_mask()?;
        self.next = Some(mask.clone());
        Ok(mask)
    }

    fn advance(&mut self, token: u32) -> Result<()> {
        self.next = None;
        self.matcher
            .consume_token(self.as_known(token))
            .map_err(|e| Error::FormatFailed(first_line(&e)))
    }

    fn allowed_prefix(&mut self, tokens: &[u32]) -> Result<usize> {
        let tokens = self.as_known_all(tokens);
        self.matcher
            .validate_tokens(&tokens)
            .map_err(|e| Error::FormatFailed(first_line(&e)))
    }

    fn mask_after(&mut self, tokens: &[u32]) -> Result<TokenMask> {
        if tokens.is_empty() {
            return self.mask();
        }
        let failed = |e: anyhow::Error| Error::FormatFailed(first_line(&e));
        let tokens = self.as_known_all(tokens);
        self.matcher.consume_tokens(&tokens).map_err(failed)?;
        let mask = self.compute_mask();
        self.matcher.rollback(tokens.len()).map_err(failed)?;
        mask
    }

    fn forced_estimate(&mut self) -> usize {
        match self.mask() {
            Ok(mask) if mask.single().is_some() => FORCED_GUESS,
            _ => 0,
        }
    }

    fn fork(&self) -> Box<dyn Constraint> {
        Box::new(GuidanceConstraint {
            matcher: self.matcher.deep_clone(),
            vocab: self.vocab,
            ends: self.ends.clone(),
            next: self.next.clone(),
        })
    }
}

/// The llguidance grammar of `spec`.
fn top_level(spec: &ConstraintSpec) -> Result<TopLevelGrammar> {
    Ok(match spec {
        ConstraintSpec::JsonObject => {
            TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
        }
        ConstraintSpec::JsonSchema(schema) => {
            if depth(schema) > MAX_SCHEMA_DEPTH {
                return Err(Error::Format(format!(
                    "the schema is nested more than {MAX_SCHEMA_DEPTH} levels deep"
                )));
            }
            TopLevelGrammar::from_json_schema(compact(schema.clone()))
        }
        ConstraintSpec::Regex(regex) => TopLevelGrammar::from_regex(regex),
        ConstraintSpec::Lark(grammar) => TopLevelGrammar::from_lark(grammar.clone()),
        ConstraintSpec::Choice(choices) => {
            if choices.is_empty() {
                return Err(Error::Format("choice needs at least one string".into()));
            }
            let alternatives: Vec<String> = choices.iter().map(|c| escape(c)).collect();
            TopLevelGrammar::from_regex(&format!("({})", alternatives.join("|")))
        }
        ConstraintSpec::Framed { frame, inner } => {
            if matches!(**inner, ConstraintSpec::Framed { .. }) {
                return Err(Error::Format("a framed format inside another".into()));
            }
            // The frame first (llguidance starts there), the inner format named for `@inner`.
            let mut grammars = vec![GrammarWithLexer::from_lark(frame.clone())];
            let mut within = top_level(inner)?.grammars;
            if let Some(first) = within.first_mut() {
                first.name = Some("inner".into());
            }
            grammars.extend(within);
            TopLevelGrammar {
                grammars,
                max_tokens: None,
            }
        }
    })
}
