//! thicket's scheduler: which sequences run in the next engine step and how many of their
//! tokens, with no prefill or decode phase. Each sequence has tokens *known* (prompt plus
//! output so far, the last one pending) and tokens *computed* (their KV is in the cache); a
//! step lets computed catch up with known within a token budget and a sequence cap. Long
//! prompts are chunked; every running sequence gets a turn every step; waiting sequences are
//! admitted first-come-first-served while blocks allow; under block pressure the most
//! recently admitted sequence is preempted (its KV dropped, recomputed later). The plan is
//! plain data ([`StepPlan`]), so all of this is tested with no model. Token ids only, never
//! tensors; the scheduler owns the [`kvcache::BlockManager`].

#![deny(missing_docs)]

pub mod budget;
mod config;
mod cost_curve;
mod error;
mod plan;
mod scheduler;
mod sequence;

pub use budget::{CostCurve, DraftInputs, DraftOffer};
pub use config::SchedulerConfig;
pub use error::SchedulerError;
pub use kvcache::SeqId;
pub use plan::{Progress, ScheduledSeq, StepPlan};
pub use scheduler::{ResumePoints, Scheduler, SchedulerStats};
pub use sequence::{SeqStatus, Sequence};
