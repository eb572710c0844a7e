//! The suffix index: token sequences the server has seen (whole requests, appended in
//! order, a separator after each), and the longest-suffix match of a sequence's recent
//! tokens among them. The same structure indexes one sequence's own tokens (its drafter's
//! local index) and every request of a cache-salt scope (the global indexes, `global`).
//!
//! The structure is a variable-order n-gram hash with position chains, as compressors' match
//! finders keep them: for each order k in [`ORDERS`] a hash table maps the last k tokens to
//! the most recent position they ended at, and each position links back to the previous one
//! whose k-gram hashed alike. A lookup walks the chain of the longest order the query has
//! tokens for (then shorter ones until one matches), verifies each candidate's match
//! backwards token by token (hash collisions cost a comparison, never a wrong draft), and
//! returns the most recent occurrences of the longest match found. Positions are absolute;
//! tokens and links live in fixed-size chunks, so evicting the oldest requests frees whole
//! chunks, and a link into evicted positions simply ends the walk. Memory: 4 bytes a token,
//! 4 a link per order, and hash slots of 4 bytes per order for between a half and one slot
//! per token (the table doubles, re-linking every live position, when tokens exceed twice its
//! slots). Why this structure and not a suffix automaton, tree or array: benches/README.md
//! ("Global suffix index"), measured with `cargo bench --bench suffix_index`.

use std::collections::VecDeque;
use std::ops::Range;

/// The n-gram orders hashed, shortest first.
pub const ORDERS: [usize; 4] = [2, 4, 8, 16];
const N_ORDERS: usize = ORDERS.len();
/// Ends every request; no match or continuation crosses it.
pub const SEPARATOR: u32 = u32::MAX;
/// Longest match verified backwards.
pub const MAX_MATCH: usize = 32;
/// Most chain links a lookup follows per order.
const MAX_WALK: usize = 48;
/// Most occurrences a lookup returns.
pub const MAX_OCCURRENCES: usize = 16;
const CHUNK_BITS: u32 = 14;
const CHUNK: usize = 1 << CHUNK_BITS;
/// Slots of a new index's hash table.
const MIN_SLOTS: usize = 1 << 8;

/// Tokens and back links of [`CHUNK`] consecutive positions.
#[derive(Debug, Clone)]
struct Chunk {
    tokens: Vec<u32>,
    /// Per position and order, how far back the previous position of the same hash slot is
    /// (0: none).
    links: Vec<[u32; N_ORDERS]>,
}

impl Chunk {
    /// An empty chunk; it grows as positions come (a sequence's own index rarely fills one).
    fn new() -> Self {
        Self {
            tokens: Vec::new(),
            links: Vec::new(),
        }
    }

    fn bytes(&self) -> usize {
        self.tokens.capacity() * std::mem::size_of::<u32>()
            + self.links.capacity() * std::mem::size_of::<[u32; N_ORDERS]>()
    }
}

/// The occurrences a lookup found: positions of the last matched token, most recent first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Occurrences {
    /// Tokens matched (0: none found).
    pub len: usize,
    /// Where the match ends, with how long it is, most recent first.
    pub at: Vec<(u64, usize)>,
}

impl Occurrences {
    /// No occurrence.
    pub fn clear(&mut self) {
        self.len = 0;
        self.at.clear();
    }
}

/// A suffix index over whole requests.
#[derive(Debug, Clone)]
pub struct SuffixIndex {
    chunks: VecDeque<Chunk>,
    /// Absolute chunk number of `chunks[0]`.
    first_chunk: u64,
    /// First live position.
    base: u64,
    /// Next position.
    end: u64,
    /// Start of each live request, with when it arrived (the owner's clock), oldest first.
    requests: VecDeque<(u64, u64)>,
    /// Per slot and order, the last position + 1 that hashed there (truncated to 32 bits; 0:
    /// none).
    heads: Vec<[u32; N_ORDERS]>,
    /// The tokens of the request being appended since its start, at most the longest order.
    recent: VecDeque<u32>,
}

impl Default for SuffixIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl SuffixIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self {
            chunks: VecDeque::new(),
            first_chunk: 0,
            base: 0,
            end: 0,
            requests: VecDeque::new(),
            heads: vec![[0; N_ORDERS]; MIN_SLOTS],
            recent: VecDeque::with_capacity(ORDERS[N_ORDERS - 1]),
        }
    }

    /// Live positions (tokens and separators).
    pub fn len(&self) -> usize {
        (self.end - self.base) as usize
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.end == self.base
    }

    /// Live requests.
    pub fn requests(&self) -> usize {
        self.requests.len()
    }

    /// When the oldest live request arrived.
    pub fn oldest_arrival(&self) -> Option<u64> {
        self.requests.front().map(|&(_, at)| at)
    }

    /// Bytes held: tokens, links and hash slots.
    pub fn bytes(&self) -> usize {
        self.chunks.iter().map(Chunk::bytes).sum::<usize>() + std::mem::size_of_val(&self.heads[..])
    }

    /// The token at live position `at`.
    #[inline]
    pub fn token(&self, at: u64) -> u32 {
        let chunk = ((at >> CHUNK_BITS) - self.first_chunk) as usize;
        self.chunks[chunk].tokens[(at as usize) & (CHUNK - 1)]
    }

    #[inline]
    fn links(&self, at: u64) -> &[u32; N_ORDERS] {
        let chunk = ((at >> CHUNK_BITS) - self.first_chunk) as usize;
        &self.chunks[chunk].links[(at as usize) & (CHUNK - 1)]
    }

    /// Appends a whole request's `tokens` and a separator; `arrival` orders it for eviction.
    /// Returns the positions it took.
    pub fn push_request(&mut self, tokens: &[u32], arrival: u64) -> Range<u64> {
        let start = self.end;
        self.requests.push_back((self.end, arrival));
        self.recent.clear();
        for &t in tokens.iter().filter(|&&t| t != SEPARATOR) {
            self.push(t);
        }
        self.push(SEPARATOR);
        self.recent.clear();
        start..self.end
    }

    /// Appends the tokens of a sequence being indexed as it grows (its drafter's local
    /// index): one open request, never separated.
    pub fn extend(&mut self, tokens: &[u32]) {
        if self.requests.is_empty() {
            self.requests.push_back((self.end, 0));
        }
        for &t in tokens.iter().filter(|&&t| t != SEPARATOR) {
            self.push(t);
        }
    }

    fn push(&mut self, token: u32) {
        let at = self.end;
        if (at as usize) & (CHUNK - 1) == 0 {
            self.chunks.push_back(Chunk::new());
        }
        let mut links = [0u32; N_ORDERS];
        if token != SEPARATOR {
            if self.recent.len() == ORDERS[N_ORDERS - 1] {
                self.recent.pop_front();
            }
            self.recent.push_back(token);
            let mask = self.heads.len() - 1;
            for (o, &k) in ORDERS.iter().enumerate() {
                if self.recent.len() < k {
                    break;
                }
                let slot = (gram_hash(self.recent.range(self.recent.len() - k..)) as usize) & mask;
                links[o] = self.link_to(self.heads[slot][o], at);
                self.heads[slot][o] = (at as u32).wrapping_add(1);
            }
        }
        if let Some(chunk) = self.chunks.back_mut() {
            chunk.tokens.push(token);
            chunk.links.push(links);
        }
        self.end += 1;
        if self.len() > 2 * self.heads.len() {
            self.rehash(self.heads.len() * 2);
        }
    }

    /// The back link from `at` to the position a head slot holds (0: none, or not live).
    fn link_to(&self, head: u32, at: u64) -> u32 {
        match self.decode(head, at) {
            Some(prev) => u32::try_from(at - prev).unwrap_or(0),
            None => 0,
        }
    }

    /// The live position a head slot holds, read at position `now` (the next to be written,
    /// or the end): live positions are within 2^32 of it.
    fn decode(&self, head: u32, now: u64) -> Option<u64> {
        if head == 0 || now == 0 {
            return None;
        }
        let back = u64::from((now as u32).wrapping_sub(head.wrapping_sub(1)));
        let at = now.checked_sub(back)?;
        (at >= self.base && at < self.end).then_some(at)
    }

    /// A table of `slots` slots, every live position linked again.
    fn rehash(&mut self, slots: usize) {
        self.heads = vec![[0; N_ORDERS]; slots];
        let mask = slots - 1;
        let mut recent: VecDeque<u32> = VecDeque::with_capacity(ORDERS[N_ORDERS - 1]);
        for at in self.base..self.end {
            let token = self.token(at);
            let mut links = [0u32; N_ORDERS];
            if token == SEPARATOR {
                recent.clear();
            } else {
                if recent.len() == ORDERS[N_ORDERS - 1] {
                    recent.pop_front();
                }
                recent.push_back(token);
                for (o, &k) in ORDERS.iter().enumerate() {
                    if recent.len() < k {
                        break;
                    }
                    let slot = (gram_hash(recent.range(recent.len() - k..)) as usize) & mask;
                    links[o] = self.link_to(self.heads[slot][o], at);
                    self.heads[slot][o] = (at as u32).wrapping_add(1);
                }
            }
            let chunk = ((at >> CHUNK_BITS) - self.first_chunk) as usize;
            self.chunks[chunk].links[(at as usize) & (CHUNK - 1)] = links;
        }
    }

    /// Drops the oldest live request; returns the positions freed (0: none left).
    pub fn evict_oldest(&mut self) -> usize {
        let Some(_) = self.requests.pop_front() else {
            return 0;
        };
        let next = self.requests.front().map_or(self.end, |&(start, _)| start);
        let freed = (next - self.base) as usize;
        self.base = next;
        while self.chunks.len() > 1 && (self.first_chunk + 1) << CHUNK_BITS <= self.base {
            self.chunks.pop_front();
            self.first_chunk += 1;
        }
        if self.is_empty() && (self.end as usize) & (CHUNK - 1) == 0 {
            self.chunks.clear();
            self.first_chunk = self.end >> CHUNK_BITS;
        }
        freed
    }

    /// The most recent occurrences (at most [`MAX_OCCURRENCES`]) of the longest suffix of
    /// `context` (at least the shortest order, at most [`MAX_MATCH`] tokens) that occurs with
    /// at least one token after it, into `out`. Occurrences matching at least three quarters
    /// of the longest match are kept. Occurrences ending in `skip` (a request's own prompt)
    /// are passed over.
    pub fn find(&self, context: &[u32], skip: &Range<u64>, out: &mut Occurrences) {
        out.clear();
        if self.is_empty() {
            return;
        }
        let mask = self.heads.len() - 1;
        for (o, &k) in ORDERS.iter().enumerate().rev() {
            if context.len() < k || context[context.len() - k..].contains(&SEPARATOR) {
                continue;
            }
            let slot = (gram_hash(context[context.len() - k..].iter()) as usize) & mask;
            let mut at = self.decode(self.heads[slot][o], self.end);
            let mut walked = 0;
            while let Some(p) = at {
                walked += 1;
                if p + 1 < self.end && self.token(p + 1) != SEPARATOR && !skip.contains(&p) {
                    let len = self.match_len(context, p);
                    if len >= k {
                        out.len = out.len.max(len);
                        out.at.push((p, len));
                    }
                }
                if walked >= MAX_WALK || out.at.len() >= 4 * MAX_OCCURRENCES {
                    break;
                }
                at = match self.links(p)[o] {
                    0 => None,
                    back => p.checked_sub(u64::from(back)).filter(|&q| q >= self.base),
                };
            }
            if out.len > 0 {
                let keep = (out.len * 3).div_ceil(4).max(k);
                out.at.retain(|&(_, len)| len >= keep);
                out.at.truncate(MAX_OCCURRENCES);
                return;
            }
        }
    }

    /// How many tokens of `context`, from its end backwards, equal the tokens ending at `at`.
    fn match_len(&self, context: &[u32], at: u64) -> usize {
        let mut len = 0;
        while len < MAX_MATCH && len < context.len() && len as u64 <= at - self.base {
            let t = self.token(at - len as u64);
            if t == SEPARATOR || t != context[context.len() - 1 - len] {
                break;
            }
            len += 1;
        }
        len
    }

    /// The tokens after `at`, up to `depth` of them, stopping at a separator or the end.
    pub fn continuation(&self, at: u64, depth: usize) -> impl Iterator<Item = u32> + '_ {
        let stop = self.end.min(at + 1 + depth as u64);
        (at + 1..stop)
            .map(|p| self.token(p))
            .take_while(|&t| t != SEPARATOR)
    }

    /// Every live request's tokens, oldest first (what a saved index holds).
    pub fn live_requests(&self) -> impl Iterator<Item = Vec<u32>> + '_ {
        let starts: Vec<u64> = self.requests.iter().map(|&(s, _)| s).collect();
        (0..starts.len()).map(move |i| {
            let stop = starts.get(i + 1).copied().unwrap_or(self.end);
            (starts[i].max(self.base)..stop)
                .map(|p| self.token(p))
                .filter(|&t| t != SEPARATOR)
                .collect()
        })
    }
}

/// Hash of an n-gram (its order is its length, so orders hash apart).
#[inline]
fn gram_hash<'a>(gram: impl Iterator<Item = &'a u32>) -> u64 {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut n = 0u64;
    for &t in gram {
        h = (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01b3);
        h = h.rotate_left(23);
        n += 1;
    }
    h ^= n.wrapping_mul(0x517c_c1b7_2722_0a95);
    h = (h ^ (h >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^ (h >> 29)
}

#[cfg(test)]
pub(crate) mod tests;
