//! What the tests share, with no tests of its own: fixtures (the default model loaded once per
//! test binary, tiny random models, prompts, logits helpers), the plain greedy decoder the
//! engine's outputs are checked against, the real `thicket` binary run as a child, a
//! streamed chat answer put back together, openai-harmony (gpt-oss's reference) for
//! checks run from Python, and files from llama.cpp's source tree.

pub mod chat_stream;
pub mod fixtures;
pub mod harmony;
pub mod llamacpp_sdist;
pub mod plain_greedy;
pub mod processes;
