//! The speculation methods, one file per draft source, each a `Drafter` (per sequence) with
//! its `Speculator` (engine-wide state and batched work): Token Recycling's shared adjacency
//! matrix (`recycling`), the n-gram trie of a request's own context (`ngram_trie`), prompt
//! lookup (`prompt_lookup`), the longest match among everything the server has seen
//! (`suffix`, over the global `suffix_indexes` of `suffix_index`es, drafting through a weighted
//! trie of `continuations`), a small draft model (`draft_model`, growing trees of its
//! likeliest paths with `likely_tree`), `auto`, which picks per request among the
//! model-free sources, and a request's own prediction of its output (`prediction`), which
//! drafts first under any of them where a request gave one. A new method is a new file here behind the traits in `crate::spec`.

pub mod auto;
pub mod continuations;
pub mod draft_model;
pub mod likely_tree;
pub mod merged_tree;
pub mod ngram_trie;
pub mod prediction;
pub mod prompt_lookup;
pub mod recycling;
pub mod recycling_context;
pub mod recycling_matrices;
pub mod suffix;
pub mod suffix_index;
pub mod suffix_indexes;
