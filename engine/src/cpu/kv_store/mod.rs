//! `PagedKvStore`: the K and V rows of every layer, addressed by `kvcache::Slot`. One row is
//! `num_kv_heads * head_dim` values; a layer keeps each KV head's values apart, so the
//! attention kernel, which works on one KV head at a time, reads a sequence's context straight
//! from its blocks with no gather copy. Values are laid out `[kv_head][slot][dim]`: a block of
//! B slots is B consecutive head rows. Keys are laid out in tiles of [`KEY_TILE`] slots,
//! `[kv_head][slot / 16][dim][slot % 16]`: dimension `d` of sixteen consecutive slots is one
//! run, so attention scores sixteen keys at once with the keys in vector lanes and never
//! transposes at read time (each key plane is padded to whole tiles). Values are stored as
//! f16 (the default: half the memory and half the bytes attention streams per step; rounded
//! to nearest on write, and clamped to f16's range so that nothing overflows to infinity) or
//! as f32 (the reference arithmetic's choice); `KvValue` says how each type is written and
//! read. Which slots belong to whom is `kvcache`'s business; this type only stores rows and
//! copies them for compaction. A model with sliding-window layers keeps those layers in a
//! second, smaller slot space (`kvcache::KvGroup::Window`): each layer belongs to one space
//! and is sized and addressed by it. A layer whose token mixer is not attention keeps
//! instead one f32 row of its own width per slot (`LayerStorage::Rows`: a short
//! convolution's inputs, which its next positions read back), in either space, copied by
//! compaction like K and V.

use half::f16;
use kvcache::{KvGroup, KvMove, Slot};

use crate::{Error, Result};

mod half_rows;
mod rows;
mod states;
mod value;

use rows::Geometry;
pub use rows::KvRows;
use states::RecurrentStates;
pub use states::StateMut;
pub use value::KvValue;

#[cfg(test)]
use half_rows::F16_MAX;

/// How K and V values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// IEEE half precision: 11 significant bits, values up to 65504.
    #[default]
    F16,
    /// Single precision, exactly the values the forward computed.
    F32,
}

impl KvDtype {
    /// Parses `--kv-cache-dtype`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f16" => Some(Self::F16),
            "f32" => Some(Self::F32),
            _ => None,
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::F32 => "f32",
        }
    }

    /// Bytes per value.
    pub fn size(self) -> usize {
        match self {
            Self::F16 => 2,
            Self::F32 => 4,
        }
    }
}

/// Slots per key tile: dimension `d` of this many consecutive slots lie side by side.
pub const KEY_TILE: usize = 16;

/// Bytes of the smallest memory page the OS maps (larger pages are touched more than once).
const PAGE_BYTES: usize = 4096;

/// Offset of `slot`'s key, dimension 0, within one KV head's key plane of `head_dim`-wide
/// keys; dimension `d` lies `d * KEY_TILE` further on.
#[inline]
pub fn key_at(slot: usize, head_dim: usize) -> usize {
    slot / KEY_TILE * KEY_TILE * head_dim + slot % KEY_TILE
}

/// K and V rows of one layer, in the store's value type.
#[derive(Debug, Clone)]
pub enum LayerKv {
    /// Stored as f16.
    F16(KvRows<f16>),
    /// Stored as f32.
    F32(KvRows<f32>),
}

/// One layer's keys and values with the geometry to read them: what attention reads.
#[derive(Debug, Clone, Copy)]
pub struct LayerView<'a> {
    /// The layer's storage.
    pub kv: &'a LayerKv,
    geometry: Geometry,
}

impl LayerView<'_> {
    /// Every key and value as f32, both `[num_kv_heads][num_slots][head_dim]`.
    pub fn to_f32(&self) -> (Vec<f32>, Vec<f32>) {
        match self.kv {
            LayerKv::F16(rows) => rows.to_f32(self.geometry),
            LayerKv::F32(rows) => rows.to_f32(self.geometry),
        }
    }
}

/// What one layer keeps per slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LayerStorage {
    /// Keys and values of the store's heads and type (attention).
    #[default]
    Kv,
    /// Keys and values of this many KV heads of this width (a layer whose heads differ from
    /// the store's).
    KvOf {
        /// KV heads.
        kv_heads: usize,
        /// Values per head.
        head_dim: usize,
    },
    /// Nothing: the layer reads the keys and values of the earlier layer it names.
    Shared(usize),
    /// One f32 row of this many values (a token mixer's per-position inputs).
    Rows(usize),
    /// One f32 row of `row` values per slot, and per sequence a recurrent state of `state`
    /// values (`states.rs`).
    Recurrent {
        /// Values per position.
        row: usize,
        /// Values per sequence.
        state: usize,
    },
}

/// One layer's storage.
#[derive(Debug, Clone)]
enum LayerData {
    /// Keys and values of `heads` KV heads of `dim` values.
    Kv {
        kv: LayerKv,
        heads: usize,
        dim: usize,
    },
    Rows {
        width: usize,
        values: Vec<f32>,
    },
    /// The keys and values of the layer named.
    Shared(usize),
}

/// K/V storage for all layers of one model.
#[derive(Debug, Clone)]
pub struct PagedKvStore {
    /// The full-attention space's geometry.
    geometry: Geometry,
    /// The windowed space's rows, where there is one.
    window_slots: Option<usize>,
    dtype: KvDtype,
    layers: Vec<(KvGroup, LayerData)>,
    /// The recurrent layers' per-sequence states.
    states: RecurrentStates,
}

/// Keys and values of no slot: what a layer that keeps rows shows attention.
static NO_KV: LayerKv = LayerKv::F32(KvRows {
    k: Vec::new(),
    v: Vec::new(),
});

impl PagedKvStore {
    /// Zeroed storage for `num_slots` rows of `num_kv_heads` heads of `head_dim` values in
    /// each of `num_layers`.
    pub fn new(num_layers: usize, num_slots: usize, heads: (usize, usize), dtype: KvDtype) -> Self {
        Self::grouped(
            &vec![KvGroup::Full; num_layers],
            num_slots,
            None,
            heads,
            dtype,
        )
    }

    /// Zeroed storage for layers in the spaces `groups` names: `num_slots` rows for a full
    /// layer, `window_slots` for a windowed one.
    pub fn grouped(
        groups: &[KvGroup],
        num_slots: usize,
        window_slots: Option<usize>,
        heads: (usize, usize),
        dtype: KvDtype,
    ) -> Self {
        let layers: Vec<(KvGroup, LayerStorage)> =
            groups.iter().map(|&g| (g, LayerStorage::Kv)).collect();
        Self::with_layers(&layers, num_slots, window_slots, heads, dtype)
    }

    /// Zeroed storage for layers each in the space and of the kind `layers` names:
    /// `num_slots` rows for a full layer, `window_slots` for a windowed one.
    pub fn with_layers(
        layers: &[(KvGroup, LayerStorage)],
        num_slots: usize,
        window_slots: Option<usize>,
        (num_kv_heads, head_dim): (usize, usize),
        dtype: KvDtype,
    ) -> Self {
        let geometry = Geometry {
            num_slots,
            num_kv_heads,
            head_dim,
        };
        let mut store = Self {
            geometry,
            window_slots,
            dtype,
            layers: Vec::with_capacity(layers.len()),
            states: RecurrentStates::new(layers.iter().map(|(_, s)| match s {
                LayerStorage::Recurrent { state, .. } => *state,
                _ => 0,
            })),
        };
        // Each layer allocated zeroed on its own (not cloned from one), so the pages are
        // mapped lazily by the OS instead of copied up front: start-up stays instant for a
        // multi-GiB pool.
        for (index, &(group, storage)) in layers.iter().enumerate() {
            let g = store.geometry_of(group);
            let kv = |heads: usize, dim: usize| {
                let g = Geometry {
                    num_kv_heads: heads,
                    head_dim: dim,
                    ..g
                };
                let kv = match dtype {
                    KvDtype::F16 => LayerKv::F16(KvRows::zeroed(g)),
                    KvDtype::F32 => LayerKv::F32(KvRows::zeroed(g)),
                };
                LayerData::Kv { kv, heads, dim }
            };
            let data = match storage {
                LayerStorage::Kv => kv(num_kv_heads, head_dim),
                LayerStorage::KvOf { kv_heads, head_dim } => kv(kv_heads, head_dim),
                LayerStorage::Rows(width) | LayerStorage::Recurrent { row: width, .. } => {
                    LayerData::Rows {
                        width,
                        values: bytemuck::zeroed_vec(g.num_slots * width),
                    }
                }
                // A layer may only read an earlier one that keeps keys and values of its own
                // in the same space; any other is stored as an empty layer of its own.
                LayerStorage::Shared(from) => match store.layers.get(from) {
                    Some((source, LayerData::Kv { .. })) if from < index && *source == group => {
                        LayerData::Shared(from)
                    }
                    _ => kv(0, head_dim),
                },
            };
            store.layers.push((group, data));
        }
        store
    }

    /// The geometry of layer `layer`'s keys and values and where they lie (its own, or those
    /// of the layer it shares).
    fn kv_of(&self, layer: usize) -> Option<(Geometry, &LayerKv)> {
        let holder = match self.layers.get(layer)? {
            (_, LayerData::Shared(from)) => *from,
            _ => layer,
        };
        match self.layers.get(holder)? {
            (group, LayerData::Kv { kv, heads, dim }) => Some((
                Geometry {
                    num_kv_heads: *heads,
                    head_dim: *dim,
                    ..self.geometry_of(*group)
                },
                kv,
            )),
            _ => None,
        }
    }

    /// The geometry of `group`'s space (a windowed layer without its own space uses the
    /// full one).
    fn geometry_of(&self, group: KvGroup) -> Geometry {
        match (group, self.window_slots) {
            (KvGroup::Window, Some(num_slots)) => Geometry {
                num_slots,
                ..self.geometry
            },
            _ => self.geometry,
        }
    }

    /// Writes one value of every memory page back, unchanged, so that the OS maps all the
    /// pool's pages now rather than while the first requests that reach them are running.
    pub fn prefault(&mut self) {
        for (_, layer) in &mut self.layers {
            match layer {
                LayerData::Kv {
                    kv: LayerKv::F16(rows),
                    ..
                } => rows.prefault(),
                LayerData::Kv {
                    kv: LayerKv::F32(rows),
                    ..
                } => rows.prefault(),
                LayerData::Shared(_) => {}
                LayerData::Rows { values, .. } => {
                    for i in (0..values.len()).step_by(PAGE_BYTES / 4) {
                        values[i] = std::hint::black_box(values[i]);
                    }
                }
            }
        }
    }

    /// Rows per full-attention layer.
    pub fn num_slots(&self) -> usize {
        self.geometry.num_slots
    }

    /// Rows per windowed layer, where the windowed layers have their own space.
    pub fn window_slots(&self) -> Option<usize> {
        self.window_slots
    }

    /// The space layer `layer` lives in.
    pub fn group(&self, layer: usize) -> KvGroup {
        self.layers[layer].0
    }

    /// Values per row (every KV head's).
    pub fn row_width(&self) -> usize {
        self.geometry.num_kv_heads * self.geometry.head_dim
    }

    /// How values are stored.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Bytes held (each key plane padded to whole tiles).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(group, data)| {
                let g = self.geometry_of(*group);
                match data {
                    LayerData::Kv { heads, dim, .. } => {
                        (g.num_slots + g.key_slots()) * heads * dim * self.dtype.size()
                    }
                    LayerData::Rows { values, .. } => values.len() * 4,
                    LayerData::Shared(_) => 0,
                }
            })
            .sum::<usize>()
            + self.states.bytes()
    }

    /// One layer's keys and values, its own or those of the layer it shares (none for a
    /// layer that keeps rows).
    pub fn layer(&self, layer: usize) -> LayerView<'_> {
        match self.kv_of(layer) {
            Some((geometry, kv)) => LayerView { kv, geometry },
            None => LayerView {
                kv: &NO_KV,
                geometry: self.geometry_of(self.layers[layer].0),
            },
        }
    }

    /// Values per row of layer `layer`'s keys (or values): its KV heads' (0 where it keeps
    /// none of its own).
    pub fn layer_row_width(&self, layer: usize) -> usize {
        match self.layers.get(layer) {
            Some((_, LayerData::Kv { heads, dim, .. })) => heads * dim,
            _ => 0,
        }
    }

    /// A layer's rows (`LayerStorage::Rows`), `[slot][width]`, with their width.
    pub fn rows(&self, layer: usize) -> Result<(&[f32], usize)> {
        match &self.layers.get(layer).map(|(_, d)| d) {
            Some(LayerData::Rows { width, values }) => Ok((values, *width)),
            _ => Err(Error::InvalidBatch(format!(
                "layer {layer} keeps no rows of its own"
            ))),
        }
    }

    /// Writes `values` (`slots.len()` rows of the layer's width) into a layer that keeps
    /// rows, at `slots` (of the layer's space).
    pub fn write_rows(&mut self, layer: usize, slots: &[Slot], values: &[f32]) -> Result<()> {
        let width = self.rows(layer)?.1;
        if values.len() != slots.len() * width {
            return Err(Error::InvalidBatch(format!(
                "a write of {} rows with {} values (row width {width})",
                slots.len(),
                values.len()
            )));
        }
        self.fill_rows(layer, slots, width, |i, row| {
            row.copy_from_slice(&values[i * width..(i + 1) * width])
        })
    }

    /// Has `fill(i, row)` write the `i`th of `slots`' rows of `layer` (of `width` values) in
    /// place, with no copy of the rows in between.
    pub fn fill_rows(
        &mut self,
        layer: usize,
        slots: &[Slot],
        width: usize,
        mut fill: impl FnMut(usize, &mut [f32]),
    ) -> Result<()> {
        let group = self.group(layer);
        self.check_slots_in(group, slots.iter().copied())?;
        let Some((
            _,
            LayerData::Rows {
                width: held,
                values: store,
            },
        )) = self.layers.get_mut(layer)
        else {
            return Err(Error::InvalidBatch(format!(
                "layer {layer} keeps no rows of its own"
            )));
        };
        let w = *held;
        if w != width {
            return Err(Error::InvalidBatch(format!(
                "rows of {width} values written to layer {layer}, whose rows hold {w}"
            )));
        }
        for (i, slot) in slots.iter().enumerate() {
            let at = slot.index() * w;
            fill(i, &mut store[at..at + w]);
        }
        Ok(())
    }

    /// Writes `k` and `v` (`slots.len()` rows each, row-major) into `layer` at `slots` (of
    /// the layer's space).
    pub fn write(&mut self, layer: usize, slots: &[Slot], k: &[f32], v: &[f32]) -> Result<()> {
        if !matches!(self.layers.get(layer), Some((_, LayerData::Kv { .. }))) {
            return Err(Error::InvalidBatch(format!(
                "layer {layer} keeps no keys and values of its own"
            )));
        }
        let w = self.layer_row_width(layer);
        if k.len() != slots.len() * w || v.len() != slots.len() * w {
            return Err(Error::InvalidBatch(format!(
                "kv write of {} rows with {} / {} values (row width {w})",
                slots.len(),
                k.len(),
                v.len()
            )));
        }
        let group = self.group(layer);
        self.check_slots_in(group, slots.iter().copied())?;
        let g = self.geometry_of(group);
        match &mut self.layers[layer].1 {
            LayerData::Kv { kv, heads, dim } => {
                let g = Geometry {
                    num_kv_heads: *heads,
                    head_dim: *dim,
                    ..g
                };
                match kv {
                    LayerKv::F16(rows) => rows.write(g, slots, k, v),
                    LayerKv::F32(rows) => rows.write(g, slots, k, v),
                }
            }
            LayerData::Rows { .. } | LayerData::Shared(_) => {
                return Err(Error::InvalidBatch(format!(
                    "layer {layer} keeps no keys and values of its own"
                )))
            }
        }
        Ok(())
    }

    /// Copies rows in order, in every layer of each move's space (compaction of an accepted
    /// draft path; the caller orders moves so that no source is overwritten before it is
    /// read).
    pub fn apply_moves(&mut self, moves: &[KvMove]) -> Result<()> {
        for group in [KvGroup::Full, KvGroup::Window] {
            let mine: Vec<KvMove> = moves.iter().filter(|m| m.group == group).copied().collect();
            if mine.is_empty() {
                continue;
            }
            if group == KvGroup::Window && self.window_slots.is_none() {
                return Err(Error::InvalidBatch(
                    "a windowed KV move for a store without a windowed space".into(),
                ));
            }
            self.check_slots_in(group, mine.iter().flat_map(|m| [m.from, m.to]))?;
            let g = self.geometry_of(group);
            for (layer_group, layer) in &mut self.layers {
                // A windowed layer lives in the full space when there is no windowed one.
                if self.window_slots.is_some() && *layer_group != group {
                    continue;
                }
                match layer {
                    LayerData::Kv { kv, heads, dim } => {
                        let g = Geometry {
                            num_kv_heads: *heads,
                            head_dim: *dim,
                            ..g
                        };
                        match kv {
                            LayerKv::F16(rows) => rows.apply_moves(g, &mine),
                            LayerKv::F32(rows) => rows.apply_moves(g, &mine),
                        }
                    }
                    LayerData::Shared(_) => {}
                    LayerData::Rows { width, values } => {
                        let w = *width;
                        for m in &mine {
                            let (from, to) = (m.from.index() * w, m.to.index() * w);
                            values.copy_within(from..from + w, to);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Errors when any slot is outside the full-attention space.
    pub fn check_slots(&self, slots: impl Iterator<Item = Slot>) -> Result<()> {
        self.check_slots_in(KvGroup::Full, slots)
    }

    /// Errors when any slot is outside `group`'s space.
    pub fn check_slots_in(
        &self,
        group: KvGroup,
        mut slots: impl Iterator<Item = Slot>,
    ) -> Result<()> {
        let num_slots = self.geometry_of(group).num_slots;
        match slots.find(|s| s.index() >= num_slots) {
            Some(bad) => Err(Error::InvalidBatch(format!(
                "slot {} outside KV store of {num_slots} slots",
                bad.0
            ))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
