//! The speculation methods, each a `Drafter` (per sequence) with its `Speculator` (engine-wide
//! state and batched work). A method of one file is a file here; a method of several is a
//! folder whose `mod.rs` holds its drafter and speculator.
//!
//! ```text
//! recycling/      Token Recycling's shared adjacency matrix; context (its rows keyed by
//!                 the last two or three tokens), matrices (one matrix per cache salt)
//! ngram_trie      the n-gram trie of a request's own context
//! prompt_lookup   prompt lookup: continue an earlier occurrence of the last tokens
//! suffix/         the longest match among everything the server has seen: index (one
//!                 suffix index: a sequence's own tokens, or a scope's requests), global
//!                 (the engine's global indexes, one per cache-salt scope)
//! draft_model/    a small draft model; likely_tree (its growing tree of likeliest paths)
//! auto/           one tree per sequence merged from the model-free sources; merged_tree
//!                 (the merge and the calibration that prices its nodes)
//! prediction/     a request's own prediction of its output, which drafts first under any
//!                 method where a request gave one
//! continuations   the weighted trie of continuations that suffix, auto and prediction
//!                 draft through
//! ```
//!
//! Tests that outgrow their module's file live in a `tests.rs` beside the folder's `mod.rs`
//! (`#[cfg(test)] mod tests;`); a module of one file keeps its tests inline. A new method
//! is a new file (or folder) here behind the traits in `crate::spec`.

pub mod auto;
pub mod continuations;
pub mod draft_model;
pub mod ngram_trie;
pub mod prediction;
pub mod prompt_lookup;
pub mod recycling;
pub mod suffix;
