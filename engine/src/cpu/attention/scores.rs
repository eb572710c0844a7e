//! Attention scores with the keys in vector lanes. The store keeps each KV head's keys in
//! tiles of sixteen slots, dimension-major (`kv_store::KEY_TILE`), so sixteen keys' dimension
//! `d` is one run: a query's score against sixteen keys is one chain of fused multiply-adds
//! over its dimensions, `acc = q[d] * key[d] + acc` for `d` in increasing order from zero,
//! then times the scale, in sixteen lanes at once. No horizontal sum, no transpose at read
//! time. The keys of a call go in runs of consecutive slots within one tile (a context's whole
//! tiles; a chain's or a tree's rows in shorter runs); up to four runs are scored at a time
//! for every query of the call, six queries by four tiles in registers, each run as its whole
//! tile with only its own lanes kept. Every score is that one chain whoever computes it, so
//! the AVX-512 loop and the portable one give the same bits, and a query's scores never
//! depend on the other queries, keys or rows of the call.

use super::slots::KeySlots;
use crate::cpu::kv_store::{key_at, KvValue, KEY_TILE};

/// Tiles scored together.
const TILES_AT_ONCE: usize = 4;

/// Queries scored together against them (six by four tiles: 24 accumulators in registers).
#[cfg(target_arch = "x86_64")]
const QUERIES_AT_ONCE: usize = 6;

/// Tests set this to run the portable loop on any CPU (both loops give the same bits, so
/// other tests running meanwhile are unaffected).
#[cfg(test)]
static PORTABLE_ONLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the portable loop must run whatever the CPU has (only ever in tests).
fn portable_only() -> bool {
    #[cfg(test)]
    return PORTABLE_ONLY.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(test))]
    false
}

/// Keys `first..first + len` of a call: consecutive slots within one tile, from lane `lane`.
#[derive(Clone, Copy, Default)]
struct Run {
    /// Offset of the tile in the key plane.
    tile: usize,
    lane: usize,
    first: usize,
    len: usize,
}

/// The run of keys from `first` on: the longest stretch of consecutive slots that stays in
/// the first key's tile.
fn run_at(slots: &[usize], first: usize, hd: usize) -> Run {
    let start = slots[first];
    let lane = start % KEY_TILE;
    let window = &slots[first..slots.len().min(first + KEY_TILE - lane)];
    // A context's keys fill whole tiles: checked at once without early exit (vectorised),
    // then key by key only where the run breaks.
    let whole = window
        .iter()
        .enumerate()
        .fold(true, |all, (i, &s)| all & (s == start + i));
    let len = if whole {
        window.len()
    } else {
        window
            .iter()
            .enumerate()
            .take_while(|&(i, &s)| s == start + i)
            .count()
    };
    Run {
        tile: key_at(start - lane, hd),
        lane,
        first,
        len,
    }
}

/// `scores[g * stride + j] = score(queries[g], key j) * scale` for every query `g` (the query
/// heads of the rows that share one KV head and these keys), `k` being that head's key plane.
/// The keys go in runs of consecutive slots within a tile (a context's whole tiles, a chain's
/// rows): each run is scored as its whole tile, and only its lanes are kept.
pub fn key_scores<T: KvValue>(
    queries: &[&[f32]],
    k: &[T],
    keys: KeySlots<'_>,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
) {
    let (hd, len) = (keys.width, keys.len());
    assert!(queries.iter().all(|q| q.len() == hd));
    assert!(len <= stride);
    assert!(queries.is_empty() || (queries.len() - 1) * stride + len <= scores.len());
    assert!(keys.store <= k.len());
    if queries.is_empty() || len == 0 {
        return;
    }
    let tile_len = KEY_TILE * hd;
    let mut first = 0;
    let mut runs = [Run::default(); TILES_AT_ONCE];
    while first < len {
        let mut count = 0;
        let mut end = first;
        while count < TILES_AT_ONCE && end < len {
            runs[count] = run_at(keys.slots, end, hd);
            end += runs[count].len;
            count += 1;
        }
        // The tiles after these, asked for while these are scored.
        let mut next = [None; TILES_AT_ONCE];
        for (next, &slot) in next
            .iter_mut()
            .zip(keys.slots.iter().skip(end).step_by(KEY_TILE))
        {
            *next = Some(&k[key_at(slot - slot % KEY_TILE, hd)..][..tile_len]);
        }
        let mut tiles: [&[T]; TILES_AT_ONCE] = [&[]; TILES_AT_ONCE];
        for (tile, run) in tiles.iter_mut().zip(&runs[..count]) {
            *tile = &k[run.tile..run.tile + tile_len];
        }
        let runs = &runs[..count];
        score_tiles(queries, &tiles[..count], runs, &next, scale, scores, stride);
        first = end;
    }
}

/// Scores of every query against the keys of `runs`, run `r` in `tiles[r]` (`[dim][lane]`,
/// one tile), written scaled to `scores[g * stride + run.first..][..run.len]` from the run's
/// lanes; the tile's other lanes are computed and dropped. The AVX-512 loop asks for the
/// `next` tiles as it goes, a cache line of each per dimension (asking for them all at once
/// fills the core's miss queue and stalls it).
fn score_tiles<T: KvValue>(
    queries: &[&[f32]],
    tiles: &[&[T]],
    runs: &[Run],
    next: &[Option<&[T]>],
    scale: f32,
    scores: &mut [f32],
    stride: usize,
) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = next;
    #[cfg(target_arch = "x86_64")]
    if super::avx512() && !portable_only() {
        // SAFETY: AVX-512F and FMA were detected; every query holds `hd` values, every tile
        // `16 * hd`, at most four tiles, and every run's scores lie inside `scores` (checked
        // by `key_scores`: `(queries - 1) * stride + len` values).
        unsafe { x86::score_tiles(queries, tiles, runs, next, scale, scores, stride) };
        return;
    }
    for (g, q) in queries.iter().enumerate() {
        for (tile, run) in tiles.iter().zip(runs) {
            let mut acc = [0f32; KEY_TILE];
            for (d, &x) in q.iter().enumerate() {
                let keys = &tile[d * KEY_TILE..(d + 1) * KEY_TILE];
                for (a, key) in acc.iter_mut().zip(keys) {
                    *a = x.mul_add(key.to_f32(), *a);
                }
            }
            let out = &mut scores[g * stride + run.first..][..run.len];
            for (s, a) in out.iter_mut().zip(&acc[run.lane..]) {
                *s = a * scale;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{KvValue, Run, KEY_TILE, QUERIES_AT_ONCE};

    /// `super::score_tiles` in blocks of up to six queries by the call's tiles (six by four:
    /// measured on an Intel Xeon, one core, 64 rows over 900 keys, attention went from 1633
    /// to 1563 us a layer against blocks of four).
    ///
    /// # Safety
    /// As `super::score_tiles` says, on a CPU with AVX-512F and FMA.
    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn score_tiles<T: KvValue>(
        queries: &[&[f32]],
        tiles: &[&[T]],
        runs: &[Run],
        next: &[Option<&[T]>],
        scale: f32,
        scores: &mut [f32],
        stride: usize,
    ) {
        let hd = queries[0].len();
        // The next tiles, a line of each asked for in each dimension's step.
        let mut ahead = Ahead {
            tiles: [std::ptr::null(); 4],
            count: 0,
            lines_per_tile: 0,
        };
        for (slot, tile) in ahead.tiles.iter_mut().zip(next.iter().flatten()) {
            *slot = tile.as_ptr() as *const i8;
            ahead.count += 1;
            ahead.lines_per_tile = std::mem::size_of_val(*tile).div_ceil(64);
        }
        let mut g = 0;
        while g < queries.len() {
            let at = |i: usize| queries[g + i].as_ptr();
            let out = scores.as_mut_ptr().add(g * stride);
            // The first queries ask for the next tiles; the others find this group in cache.
            let job = Job {
                tiles,
                runs,
                ahead: if g == 0 {
                    ahead
                } else {
                    Ahead { count: 0, ..ahead }
                },
                hd,
                scale,
                out,
                stride,
            };
            match queries.len() - g {
                1 => job.by_tiles::<1>([at(0)]),
                2 => job.by_tiles::<2>([at(0), at(1)]),
                3 => job.by_tiles::<3>([at(0), at(1), at(2)]),
                4 => job.by_tiles::<4>([at(0), at(1), at(2), at(3)]),
                5 => job.by_tiles::<5>([at(0), at(1), at(2), at(3), at(4)]),
                _ => job.by_tiles::<6>([at(0), at(1), at(2), at(3), at(4), at(5)]),
            }
            g += QUERIES_AT_ONCE;
        }
    }

    /// One block's tiles and where its scores go.
    /// Tiles to ask for: `count` tiles of `lines_per_tile` cache lines, line `d` of each in
    /// dimension `d`'s step.
    #[derive(Clone, Copy)]
    struct Ahead {
        tiles: [*const i8; 4],
        count: usize,
        lines_per_tile: usize,
    }

    struct Job<'a, T> {
        tiles: &'a [&'a [T]],
        runs: &'a [Run],
        ahead: Ahead,
        hd: usize,
        scale: f32,
        out: *mut f32,
        stride: usize,
    }

    impl<T: KvValue> Job<'_, T> {
        #[inline]
        #[target_feature(enable = "avx512f,fma")]
        unsafe fn by_tiles<const G: usize>(&self, q: [*const f32; G]) {
            let at = |t: usize| self.tiles[t].as_ptr();
            match self.tiles.len() {
                1 => self.block::<G, 1>(q, [at(0)]),
                2 => self.block::<G, 2>(q, [at(0), at(1)]),
                3 => self.block::<G, 3>(q, [at(0), at(1), at(2)]),
                _ => self.block::<G, 4>(q, [at(0), at(1), at(2), at(3)]),
            }
        }

        /// `G` queries against `B` tiles: one accumulator per (query, tile), each the chain
        /// over the dimensions; each tile's dimension read once for all `G` queries.
        #[inline]
        #[target_feature(enable = "avx512f,fma")]
        unsafe fn block<const G: usize, const B: usize>(
            &self,
            q: [*const f32; G],
            tiles: [*const T; B],
        ) {
            let mut acc = [[_mm512_setzero_ps(); B]; G];
            // The next tiles' lines spread evenly over the dimensions (a tile has at most
            // `hd` lines: 16 keys of `hd` values of at most 4 bytes), so that the requests
            // keep pace with memory instead of queueing up.
            let ahead = &self.ahead;
            let every = (self.hd / ahead.lines_per_tile.max(1)).max(1);
            let (mut line, mut wait) = (0, 0);
            for d in 0..self.hd {
                if wait == 0 && line < ahead.lines_per_tile {
                    for tile in &ahead.tiles[..ahead.count] {
                        _mm_prefetch::<_MM_HINT_T0>(tile.wrapping_add(64 * line));
                    }
                    line += 1;
                    wait = every;
                }
                wait -= 1;
                let keys: [__m512; B] =
                    std::array::from_fn(|t| T::load16(tiles[t].add(d * KEY_TILE)));
                for (acc, q) in acc.iter_mut().zip(&q) {
                    let x = _mm512_set1_ps(*q.add(d));
                    for (a, key) in acc.iter_mut().zip(&keys) {
                        *a = _mm512_fmadd_ps(x, *key, *a);
                    }
                }
            }
            let scale = _mm512_set1_ps(self.scale);
            for (g, acc) in acc.iter().enumerate() {
                for (a, run) in acc.iter().zip(self.runs) {
                    // Lanes `run.lane..run.lane + run.len` to the run's scores: the store's
                    // base sits `run.lane` values before them, and only those lanes are
                    // written.
                    let mask = (((1u32 << run.len) - 1) << run.lane) as u16;
                    let dst = self
                        .out
                        .wrapping_add(g * self.stride + run.first)
                        .wrapping_sub(run.lane);
                    _mm512_mask_storeu_ps(dst, mask, _mm512_mul_ps(*a, scale));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::attention::tests::values;
    use half::f16;

    /// A key plane of `slots` keys of `hd` values, tiled as the store tiles it, and the same
    /// keys row by row.
    fn plane<T: KvValue>(
        slots: usize,
        hd: usize,
        seed: u32,
        cast: fn(f32) -> T,
    ) -> (Vec<T>, Vec<f32>) {
        let rows = values(slots * hd, seed);
        let mut tiled = vec![cast(0.0); slots.div_ceil(KEY_TILE) * KEY_TILE * hd];
        let mut widened = vec![0.0; slots * hd];
        for slot in 0..slots {
            for d in 0..hd {
                let x = cast(rows[slot * hd + d]);
                tiled[key_at(slot, hd) + d * KEY_TILE] = x;
                widened[slot * hd + d] = x.to_f32();
            }
        }
        (tiled, widened)
    }

    /// The score's definition: one fused chain over the dimensions from zero, then the scale.
    fn chain(q: &[f32], key: &[f32], scale: f32) -> f32 {
        q.iter()
            .zip(key)
            .fold(0.0f32, |acc, (&x, &k)| x.mul_add(k, acc))
            * scale
    }

    #[test]
    fn scores_are_one_chain_per_key_whatever_the_keys_and_queries() {
        for portable in [false, true] {
            PORTABLE_ONLY.store(portable, std::sync::atomic::Ordering::Relaxed);
            for hd in [64, 128, 40] {
                check::<f32>(hd, |x| x);
                check::<f16>(hd, f16::from_f32);
            }
        }
        PORTABLE_ONLY.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    fn check<T: KvValue>(hd: usize, cast: fn(f32) -> T) {
        let (k, rows) = plane::<T>(160, hd, hd as u32, cast);
        let kind = std::any::type_name::<T>();
        // Whole tiles (a context), a partial tile at the end, tiles that start mid-way, and
        // scattered slots (a tree's own keys), in runs longer and shorter than four tiles.
        let runs: Vec<Vec<usize>> = vec![
            (0..100).collect(),
            (32..37).collect(),
            (5..90).collect(),
            (0..80).map(|i| (i * 37 + 11) % 160).collect(),
            vec![150, 3, 77],
            (16..160).collect(),
        ];
        for slots in &runs {
            let keys = KeySlots::new(slots, hd, k.len()).unwrap();
            for nq in [1, 2, 3, 4, 5, 7, 9, 13] {
                let qs: Vec<Vec<f32>> = (0..nq).map(|g| values(hd, 7 + g as u32)).collect();
                let q_refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
                let stride = slots.len() + 3;
                let mut scores = vec![f32::NAN; nq * stride];
                key_scores(&q_refs, &k, keys, 0.125, &mut scores, stride);
                for (g, q) in qs.iter().enumerate() {
                    for (j, &slot) in slots.iter().enumerate() {
                        let key = &rows[slot * hd..(slot + 1) * hd];
                        let got = scores[g * stride + j];
                        let want = chain(q, key, 0.125);
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{kind} hd {hd}, {nq} queries, query {g}, key {j}"
                        );
                        let exact: f64 =
                            q.iter().zip(key).map(|(&a, &b)| a as f64 * b as f64).sum();
                        assert!((got as f64 - exact * 0.125).abs() < 1e-5, "{kind}");
                    }
                    // Past the keys, nothing is written.
                    assert!(scores[g * stride + slots.len()..(g + 1) * stride]
                        .iter()
                        .all(|x| x.is_nan()));
                }
            }
        }
    }
}
