//! The real `thicket` binary run as a process: `serve`'s log and shutdown, security defaults,
//! hostile requests, overload and a soak, and tool calls on a real model (a forced one that
//! must be complete or cut); `generate` on a
//! model without a chat template; `batch`; the `bench` commands; Gemma 3 270M served and in a
//! batch.

mod batch;
mod batch_pooling;
mod bench;
mod chat_template;
mod forced_tool_call;
mod gemma3;
mod generate;
mod hostile_requests;
mod logs_and_drain;
mod overload_and_soak;
mod reasoning;
mod security;
mod tool_calls;
mod tool_formats;
