//! `CpuBackend`: the model over a paged KV store in host memory. On the CPU the forward is
//! thicket's own one-pass forward over the layers with its quantized matmuls and paged tree
//! attention (`crate::cpu`); a model on a GPU shape the CUDA backend does not take runs
//! candle's ops on its device with attention and KV on the host.

use kvcache::KvMove;

use super::Backend;
use crate::cpu::kv_store::PagedKvStore;
use crate::model::Model;
use crate::tree_batch::TreeBatch;
use crate::Result;

/// The model over a host paged KV store: on the CPU, thicket's one-pass forward and kernels;
/// on a device [`super::for_model`] has no kernels for, candle's ops there with attention on
/// the host.
#[derive(Debug)]
pub struct CpuBackend {
    model: Model,
    store: PagedKvStore,
}

impl CpuBackend {
    /// `model` with a zeroed KV store of `num_slots` rows.
    pub fn new(model: Model, num_slots: usize) -> Self {
        Self::with_spaces(model, num_slots, None)
    }

    /// `model` with a zeroed KV store of `num_slots` rows, and `window_slots` rows for the
    /// windowed layers where they have a space of their own.
    pub fn with_spaces(model: Model, num_slots: usize, window_slots: Option<usize>) -> Self {
        let store = model.new_kv_store_with(num_slots, window_slots);
        Self { model, store }
    }
}

impl Backend for CpuBackend {
    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn num_slots(&self) -> usize {
        self.store.num_slots()
    }

    fn describe(&self) -> String {
        let device = match self.model.device() {
            candle_core::Device::Cpu => "cpu".to_string(),
            other => format!("{other:?}").to_lowercase(),
        };
        let path = if self.model.is_fused() {
            "fused CPU pass"
        } else {
            "candle ops"
        };
        let kernel = match self.model.quant_kernel() {
            Some(crate::model::linear::QuantKernel::Thicket) => {
                format!(
                    "thicket kernel, {} path",
                    crate::cpu::qgemm::process_isa().name()
                )
            }
            Some(crate::model::linear::QuantKernel::Candle) => "candle kernel".to_string(),
            None => "dense weights".to_string(),
        };
        let kv = self.model.kv_dtype().name();
        format!("{device}, {path}, {kernel}, host KV ({kv})")
    }

    fn profiles_parts(&self) -> bool {
        self.model.is_fused()
    }

    fn forward(&mut self, batch: &TreeBatch) -> Result<Vec<Vec<f32>>> {
        self.model
            .forward_output(batch, &mut self.store)?
            .into_rows(batch)
    }

    fn returns_states(&self) -> bool {
        true
    }

    fn move_kv(&mut self, moves: &[KvMove]) -> Result<()> {
        self.store.apply_moves(moves)
    }

    fn state_bytes_per_sequence(&self) -> usize {
        self.model.state_bytes_per_sequence()
    }

    fn prefault_kv(&mut self) {
        self.store.prefault();
    }

    fn prefault_states(&mut self, slots: usize) {
        self.store.prefault_states(slots);
    }
}
