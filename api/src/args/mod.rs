//! The flag groups every command that loads a model or runs the engine shares, and what they
//! become: [`ModelArgs`] the model and how it loads ([`engine::LoadOptions`]), [`EngineArgs`]
//! the KV cache, scheduler and speculation ([`engine::EngineConfig`]), and [`spawn`] the
//! engine thread over a loaded model. The commands, the batch runner and the in-process
//! benches flatten them into their own flags.

mod engine;
mod model;
mod task;

pub use self::engine::{spawn, EngineArgs, KvArgs, SpecArgs};
pub use self::model::ModelArgs;
pub use self::task::{task_value, TaskArg};
