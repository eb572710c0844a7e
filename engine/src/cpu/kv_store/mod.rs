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
mod states;
mod value;

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

/// Where a store's head rows lie: values `[kv_head][slot][dim]`, keys in tiles (see the
/// module doc).
#[derive(Debug, Clone, Copy)]
struct Geometry {
    num_slots: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl Geometry {
    /// Offset of `slot`'s value row of KV head `head`.
    fn value_at(&self, head: usize, slot: Slot) -> usize {
        (head * self.num_slots + slot.index()) * self.head_dim
    }

    /// Slots in one KV head's key plane: whole tiles.
    fn key_slots(&self) -> usize {
        self.num_slots.div_ceil(KEY_TILE) * KEY_TILE
    }

    /// Offset of `slot`'s key (dimension 0) of KV head `head`.
    fn key_at(&self, head: usize, slot: Slot) -> usize {
        head * self.key_slots() * self.head_dim + key_at(slot.index(), self.head_dim)
    }
}

/// One layer's K and V of one value type: values `[num_kv_heads][num_slots][head_dim]`, keys
/// in tiles of [`KEY_TILE`] slots per KV head (see the module doc).
#[derive(Debug, Clone)]
pub struct KvRows<T> {
    /// Keys.
    pub k: Vec<T>,
    /// Values.
    pub v: Vec<T>,
}

impl<T: KvValue> KvRows<T> {
    /// Zeroed rows, allocated as zeroed memory: the OS maps the pages when they are first
    /// written, so a multi-GiB pool costs nothing until it is used (`vec![zero; n]` would
    /// write every value up front for a type the standard library cannot tell is zero).
    fn zeroed(g: Geometry) -> Self {
        Self {
            k: bytemuck::zeroed_vec(g.num_kv_heads * g.key_slots() * g.head_dim),
            v: bytemuck::zeroed_vec(g.num_kv_heads * g.num_slots * g.head_dim),
        }
    }

    /// Writes one value in every page back (see [`PagedKvStore::prefault`]).
    fn prefault(&mut self) {
        let step = (PAGE_BYTES / std::mem::size_of::<T>()).max(1);
        for values in [&mut self.k, &mut self.v] {
            for i in (0..values.len()).step_by(step) {
                // `black_box` hides that the value is unchanged, so the write is kept.
                values[i] = std::hint::black_box(values[i]);
            }
        }
    }

    /// `k` and `v` (`[row][kv_head][dim]`) at `slots`.
    fn write(&mut self, g: Geometry, slots: &[Slot], k: &[f32], v: &[f32]) {
        let (d, w) = (g.head_dim, g.num_kv_heads * g.head_dim);
        // A key is converted a few dimensions at a time, then spread over its tile.
        let mut key = [T::zeroed(); KEY_TILE];
        for (row, &slot) in slots.iter().enumerate() {
            for h in 0..g.num_kv_heads {
                let (at, src) = (g.value_at(h, slot), row * w + h * d);
                T::store(&v[src..src + d], &mut self.v[at..at + d]);
                let at = g.key_at(h, slot);
                for (c, part) in k[src..src + d].chunks(KEY_TILE).enumerate() {
                    let key = &mut key[..part.len()];
                    T::store(part, key);
                    for (i, &x) in key.iter().enumerate() {
                        self.k[at + (c * KEY_TILE + i) * KEY_TILE] = x;
                    }
                }
            }
        }
    }

    fn apply_moves(&mut self, g: Geometry, moves: &[KvMove]) {
        let d = g.head_dim;
        for m in moves {
            for h in 0..g.num_kv_heads {
                let (from, to) = (g.value_at(h, m.from), g.value_at(h, m.to));
                self.v.copy_within(from..from + d, to);
                let (from, to) = (g.key_at(h, m.from), g.key_at(h, m.to));
                for i in 0..d {
                    self.k[to + i * KEY_TILE] = self.k[from + i * KEY_TILE];
                }
            }
        }
    }

    /// Keys and values as f32, both `[num_kv_heads][num_slots][head_dim]` (none for rows that
    /// hold none: a layer that keeps rows of its own instead).
    fn to_f32(&self, g: Geometry) -> (Vec<f32>, Vec<f32>) {
        if self.k.is_empty() {
            return (Vec::new(), Vec::new());
        }
        let mut k = Vec::with_capacity(self.v.len());
        for h in 0..g.num_kv_heads {
            for slot in 0..g.num_slots {
                let at = g.key_at(h, Slot(slot as u32));
                k.extend((0..g.head_dim).map(|i| self.k[at + i * KEY_TILE].to_f32()));
            }
        }
        (k, self.v.iter().map(|x| x.to_f32()).collect())
    }
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
    Kv(LayerKv),
    Rows { width: usize, values: Vec<f32> },
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
        for &(group, storage) in layers {
            let g = store.geometry_of(group);
            let data = match (storage, dtype) {
                (LayerStorage::Kv, KvDtype::F16) => LayerData::Kv(LayerKv::F16(KvRows::zeroed(g))),
                (LayerStorage::Kv, KvDtype::F32) => LayerData::Kv(LayerKv::F32(KvRows::zeroed(g))),
                (LayerStorage::Rows(width), _)
                | (LayerStorage::Recurrent { row: width, .. }, _) => LayerData::Rows {
                    width,
                    values: bytemuck::zeroed_vec(g.num_slots * width),
                },
            };
            store.layers.push((group, data));
        }
        store
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
                LayerData::Kv(LayerKv::F16(rows)) => rows.prefault(),
                LayerData::Kv(LayerKv::F32(rows)) => rows.prefault(),
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
        let per_slot = self.row_width() * self.dtype.size();
        self.layers
            .iter()
            .map(|(group, data)| {
                let g = self.geometry_of(*group);
                match data {
                    LayerData::Kv(_) => (g.num_slots + g.key_slots()) * per_slot,
                    LayerData::Rows { values, .. } => values.len() * 4,
                }
            })
            .sum::<usize>()
            + self.states.bytes()
    }

    /// One layer's keys and values (none for a layer that keeps rows).
    pub fn layer(&self, layer: usize) -> LayerView<'_> {
        let (group, data) = &self.layers[layer];
        let kv = match data {
            LayerData::Kv(kv) => kv,
            LayerData::Rows { .. } => &NO_KV,
        };
        LayerView {
            kv,
            geometry: self.geometry_of(*group),
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
        let w = self.row_width();
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
            LayerData::Kv(LayerKv::F16(rows)) => rows.write(g, slots, k, v),
            LayerData::Kv(LayerKv::F32(rows)) => rows.write(g, slots, k, v),
            LayerData::Rows { .. } => {
                return Err(Error::InvalidBatch(format!(
                    "layer {layer} keeps rows, not keys and values"
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
                    LayerData::Kv(LayerKv::F16(rows)) => rows.apply_moves(g, &mine),
                    LayerData::Kv(LayerKv::F32(rows)) => rows.apply_moves(g, &mine),
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
