//! What the tests share, with no tests of its own: fixtures (the default model loaded once per
//! test binary, tiny random models, prompts, logits helpers), the plain greedy decoder the
//! engine's outputs are checked against, and the real `thicket` binary run as a child.

pub mod fixtures;
pub mod plain_greedy;
pub mod processes;
