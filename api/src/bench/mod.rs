//! `thicket bench ...`: the measurements. In-process, on a loaded model: [`forward`] (the
//! cost of one forward by new-token count), [`engine`] (throughput at several concurrencies),
//! [`spec`] (speculation methods on Spec-Bench-shaped questions, with its workload, table and
//! charts) and [`edits`] (whole-file code edits with and without the file as the
//! prediction), the last two over the [`harness`] they share. Against any OpenAI-compatible
//! server, as a client: [`serve`] (load under an arrival process, with its HTTP client,
//! prompt sets and statistics), [`sweep`] (`serve` over concurrencies and speculation
//! settings) and [`tot`] (tree-of-thought on GSM8K). [`plot`] draws the charts of both.

pub mod edits;
pub mod engine;
pub mod forward;
pub mod harness;
pub mod plot;
pub mod serve;
pub mod spec;
pub mod sweep;
pub mod tot;
