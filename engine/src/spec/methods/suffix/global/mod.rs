//! The global suffix indexes of one engine, one per cache-salt scope: requests without a
//! salt share one index (the one `--suffix-index-state` saves and loads), and each salt in
//! use gets its own, so a request drafts only from what requests of its scope sent and
//! received. Every request's prompt is learnt at admission and its output (after the last
//! tokens of its prompt) when it leaves. Together the indexes hold at most a budget of
//! tokens (`--suffix-index-tokens`; 0 turns them off): past it, whole requests are evicted
//! oldest first whatever their scope. At most [`MAX_SALTED_INDEXES`] salts have an index at
//! once; past that the least recently taught one is dropped. The engine thread alone uses
//! them (the lock is never contended).

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use kvcache::BlockHash;

use super::index::{SuffixIndex, MAX_MATCH, SEPARATOR};
use crate::{Error, Result};

/// Most cache salts with an index of their own at once.
pub const MAX_SALTED_INDEXES: usize = 16;
/// Tokens the indexes hold by default (about 34 MB: 33-34 bytes a token, benches/README.md).
pub const DEFAULT_BUDGET: usize = 1 << 20;
/// Recent prompts whose place in their index is remembered.
const PROMPTS_KEPT: usize = 4096;
/// Prompt tokens learnt again before an output, so a match can run from the prompt's end
/// into the output.
const OUTPUT_CONTEXT: usize = MAX_MATCH;

const MAGIC: &[u8; 8] = b"THKSUFX1";

/// Counts published as metrics (`crate::metrics::spec::SUFFIX_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexCounts {
    /// Live positions across every index.
    pub tokens: usize,
    /// Live requests across every index.
    pub requests: usize,
    /// Bytes held.
    pub bytes: usize,
    /// Requests evicted so far.
    pub evictions: u64,
}

/// Every scope's index.
#[derive(Debug)]
pub struct SuffixIndexes {
    budget: usize,
    unsalted: SuffixIndex,
    /// `(scope, index)`, the most recently taught last.
    salted: Vec<(BlockHash, SuffixIndex)>,
    clock: u64,
    evictions: u64,
    state: Option<PathBuf>,
    /// Where recent prompts lie in their scope's index, by [`prompt_key`], oldest first in
    /// `prompt_order`: a sequence's drafter passes over its own prompt there (its local
    /// index has it), so the two sources stay independent.
    prompts: HashMap<u64, (Option<BlockHash>, Range<u64>)>,
    prompt_order: VecDeque<u64>,
}

/// The key of a prompt of a scope.
fn prompt_key(prompt: &[u32], scope: Option<BlockHash>) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    prompt.hash(&mut hasher);
    scope.hash(&mut hasher);
    hasher.finish()
}

impl SuffixIndexes {
    /// Indexes holding at most `budget` tokens (0: off), the unsalted one reloaded from
    /// `state` where that file exists (a file that cannot be read is logged and ignored).
    pub fn new(budget: usize, state: Option<PathBuf>) -> Self {
        let mut indexes = Self {
            budget,
            unsalted: SuffixIndex::new(),
            salted: Vec::new(),
            clock: 0,
            evictions: 0,
            state,
            prompts: HashMap::new(),
            prompt_order: VecDeque::new(),
        };
        if let Some(path) = indexes.state.clone().filter(|p| p.exists()) {
            match read_requests(&path) {
                Ok(requests) => {
                    for tokens in requests {
                        let _ = indexes.learn(&tokens, None);
                    }
                    indexes.evictions = 0;
                    tracing::info!(
                        "suffix index: {} tokens reloaded from {}",
                        indexes.unsalted.len(),
                        path.display()
                    );
                }
                Err(e) => tracing::warn!("suffix index: not reloaded: {e}"),
            }
        }
        indexes
    }

    /// Whether the indexes learn anything.
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// The index of `scope` (`None`: requests without a salt), if it has one.
    pub fn get(&self, scope: Option<BlockHash>) -> Option<&SuffixIndex> {
        match scope {
            None => Some(&self.unsalted),
            Some(scope) => self.salted.iter().find(|(s, _)| *s == scope).map(|e| &e.1),
        }
    }

    /// Learns an admitted request's `prompt` for `scope`, remembering where it lies.
    pub fn learn_prompt(&mut self, prompt: &[u32], scope: Option<BlockHash>) {
        let Some(range) = self.learn(prompt, scope) else {
            return;
        };
        let key = prompt_key(prompt, scope);
        if self.prompts.insert(key, (scope, range)).is_none() {
            self.prompt_order.push_back(key);
            if self.prompt_order.len() > PROMPTS_KEPT {
                if let Some(old) = self.prompt_order.pop_front() {
                    self.prompts.remove(&old);
                }
            }
        }
    }

    /// Where the last admitted request with `prompt` in `scope` lies in that scope's index
    /// (empty: nowhere known).
    pub fn own_prompt(&self, prompt: &[u32], scope: Option<BlockHash>) -> Range<u64> {
        self.prompts
            .get(&prompt_key(prompt, scope))
            .map_or(0..0, |(_, r)| r.clone())
    }

    /// Learns a request's `tokens` for `scope`, then evicts the oldest requests while the
    /// indexes hold more than the budget. Returns where they lie in the scope's index.
    pub fn learn(&mut self, tokens: &[u32], scope: Option<BlockHash>) -> Option<Range<u64>> {
        if self.budget == 0 || tokens.is_empty() {
            return None;
        }
        // A request longer than the budget keeps its end.
        let tokens = &tokens[tokens.len().saturating_sub(self.budget - 1)..];
        self.clock += 1;
        let clock = self.clock;
        let index = match scope {
            None => &mut self.unsalted,
            Some(scope) => {
                let at = match self.salted.iter().position(|(s, _)| *s == scope) {
                    Some(i) => i,
                    None => {
                        if self.salted.len() >= MAX_SALTED_INDEXES {
                            let (gone, dropped) = self.salted.remove(0);
                            self.evictions += dropped.requests() as u64;
                            self.prompts.retain(|_, (s, _)| *s != Some(gone));
                        }
                        self.salted.push((scope, SuffixIndex::new()));
                        self.salted.len() - 1
                    }
                };
                let entry = self.salted.remove(at);
                self.salted.push(entry);
                let last = self.salted.len() - 1;
                &mut self.salted[last].1
            }
        };
        let range = index.push_request(tokens, clock);
        self.evict_to_budget();
        Some(range)
    }

    /// Learns the output of a request that left: the last prompt tokens and the output.
    pub fn learn_output(&mut self, tokens: &[u32], prompt_len: usize, scope: Option<BlockHash>) {
        if prompt_len >= tokens.len() {
            return;
        }
        self.learn(&tokens[prompt_len.saturating_sub(OUTPUT_CONTEXT)..], scope);
    }

    fn evict_to_budget(&mut self) {
        while self.counts().tokens > self.budget {
            let oldest = std::iter::once(&mut self.unsalted)
                .chain(self.salted.iter_mut().map(|e| &mut e.1))
                .filter(|i| i.requests() > 0)
                .min_by_key(|i| i.oldest_arrival());
            let freed = oldest.map_or(0, |index| index.evict_oldest());
            if freed == 0 {
                break;
            }
            self.evictions += 1;
        }
        let emptied: Vec<BlockHash> = self
            .salted
            .iter()
            .filter(|(_, i)| i.is_empty())
            .map(|(s, _)| *s)
            .collect();
        if !emptied.is_empty() {
            self.salted.retain(|(_, i)| !i.is_empty());
            self.prompts
                .retain(|_, (s, _)| s.is_none_or(|s| !emptied.contains(&s)));
        }
    }

    /// Sizes, for metrics.
    pub fn counts(&self) -> IndexCounts {
        let all = std::iter::once(&self.unsalted).chain(self.salted.iter().map(|e| &e.1));
        let mut counts = IndexCounts {
            evictions: self.evictions,
            ..IndexCounts::default()
        };
        for index in all {
            counts.tokens += index.len();
            counts.requests += index.requests();
            counts.bytes += index.bytes();
        }
        counts
    }

    /// Writes the unsalted index to its state file, if one was given (salted indexes live
    /// in memory only).
    pub fn save(&self) {
        let Some(path) = &self.state else {
            return;
        };
        match write_requests(path, self.unsalted.live_requests()) {
            Ok(()) => tracing::info!(
                "suffix index: {} tokens saved to {}",
                self.unsalted.len(),
                path.display()
            ),
            Err(e) => tracing::warn!("suffix index: not saved: {e}"),
        }
    }
}

/// Writes `requests` to `path` (through a temporary file, renamed).
fn write_requests(path: &Path, requests: impl Iterator<Item = Vec<u32>>) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let io = |e: std::io::Error| Error::Metadata(format!("{}: {e}", path.display()));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    out.write_all(MAGIC).map_err(io)?;
    for tokens in requests {
        for t in tokens.iter().chain(std::iter::once(&SEPARATOR)) {
            out.write_all(&t.to_le_bytes()).map_err(io)?;
        }
    }
    out.into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// The requests a state file holds.
fn read_requests(path: &Path) -> Result<Vec<Vec<u32>>> {
    let bad = |why: String| Error::Metadata(format!("{}: {why}", path.display()));
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| bad(e.to_string()))?;
    let body = bytes
        .strip_prefix(MAGIC.as_slice())
        .ok_or_else(|| bad("not a suffix index state file".into()))?;
    if body.len() % 4 != 0 {
        return Err(bad("truncated".into()));
    }
    let mut requests = Vec::new();
    let mut current = Vec::new();
    for word in body.chunks_exact(4) {
        let t = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        if t == SEPARATOR {
            requests.push(std::mem::take(&mut current));
        } else {
            current.push(t);
        }
    }
    Ok(requests)
}

#[cfg(test)]
mod tests;
