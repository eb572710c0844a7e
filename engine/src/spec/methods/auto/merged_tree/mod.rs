//! `auto`'s one tree per sequence, merged from every source it has: the sequence's own
//! context (a local suffix index), the global suffix index of its cache salt, the request's
//! prediction of its output (where it gave one), and Token Recycling's matrix. The context,
//! the global index and the prediction each propose a weighted trie of continuations (of
//! their longest match; the prediction's, from where the output stands in it); Token
//! Recycling proposes, under the nodes a match proposed (and a few levels past them), the
//! model's top candidates after the end of that node's path (the row keyed by its last three
//! or two tokens where the matrix has one, else its own token's, calibrated apart), so it
//! branches and extends where the matches are thin; where nothing matches it
//! drafts alone a few levels deep, priced apart (its own calibration cells), so the planner
//! keeps those nodes only where they pay. Children proposed by several sources merge into
//! one node.
//!
//! Each source's proposal of a node is priced by [`Calibration`]: the rate at which such
//! proposals were accepted once their parent was (learnt online, engine-wide, from every
//! verified tree, per source, evidence — match length, or the candidate's rank — depth, the
//! node's share of its source's weight there, and which other sources proposed the node too:
//! proposals others agree with are learnt apart from those no other source makes, which are
//! accepted far less often). A node's acceptance is the best of its sources' rates, its
//! path's is the product down from the root, and the
//! tree grows best first by that path probability. Its running sum is what the drafter
//! tells the planner a tree of its first n nodes is expected to accept, so the planner keeps
//! the nodes whose expected gain pays for their rows.

use std::collections::BinaryHeap;
use std::sync::Mutex;

use crate::spec::methods::continuations::ContinuationTree;
use crate::spec::methods::recycling::{PathEnd, RecyclingMatrix};
use crate::spec::{Candidates, SpecMethod};

/// A source of proposals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The sequence's own tokens.
    Context = 0,
    /// The global suffix index.
    Global = 1,
    /// The request's prediction of its output.
    Prediction = 2,
    /// Token Recycling's matrix.
    Recycling = 3,
}

/// Sources.
pub const SOURCES: usize = 4;
/// Sources that propose a trie of continuations (the first ones).
pub const MATCHES: usize = 3;

impl Source {
    /// Every source, in index order.
    pub const ALL: [Source; SOURCES] = [
        Source::Context,
        Source::Global,
        Source::Prediction,
        Source::Recycling,
    ];

    /// The name its drafts are counted under.
    pub fn method(self) -> SpecMethod {
        match self {
            Source::Context => SpecMethod::Context,
            Source::Global => SpecMethod::SuffixIndex,
            Source::Prediction => SpecMethod::Prediction,
            Source::Recycling => SpecMethod::Recycling,
        }
    }
}

const EVIDENCE: usize = 8;
/// Where Token Recycling's evidence starts when it drafts alone (no match above the node),
/// so alone and beside a match it is calibrated apart ([`recycled`]).
const ALONE: usize = 4;
const DEPTHS: usize = 8;
const SHARES: usize = 4;
/// Which other sources proposed the same node too (one bit per other source, none: 0): a
/// source's candidates that others also propose are accepted far more often than those
/// only it proposes (Token Recycling's first candidate is usually a match's continuation
/// too), and more so where the others include the request's own context, so each set of
/// them is calibrated apart.
const AGREEMENT: usize = 1 << (SOURCES - 1);
/// Pseudo-outcomes of a cell's prior.
const PRIOR_WEIGHT: f32 = 2.0;
/// Outcomes a cell remembers: past them the counts halve, so the rates follow the traffic.
const MEMORY: f32 = 2000.0;

/// Token Recycling's evidence for its `rank`-th candidate (the first two ranks apart, the
/// rest with the second) from a row `keyed` by so many of the path's last tokens (one, or
/// more: two and three together), beside a match or alone.
fn recycled(matched: bool, rank: usize, keyed: usize) -> usize {
    let base = if matched { 0 } else { ALONE };
    base + rank.min(1) + 2 * usize::from(keyed > 1)
}

/// One calibration cell: what kind of proposal it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell(u16);

impl Cell {
    /// The cell of `source`'s proposal with `evidence` (match length bucket, or rank), at
    /// `depth` (1: under the root), with `share` of the source's weight under its parent.
    pub fn new(source: Source, evidence: usize, depth: usize, share: f32) -> Self {
        let depth = match depth {
            0..=4 => depth.saturating_sub(1),
            5..=6 => 4,
            7..=9 => 5,
            10..=15 => 6,
            _ => 7,
        };
        let share = match share {
            s if s >= 0.9 => 3,
            s if s >= 0.6 => 2,
            s if s >= 0.3 => 1,
            _ => 0,
        };
        let index = (((source as usize * EVIDENCE + evidence.min(EVIDENCE - 1)) * DEPTHS + depth)
            * SHARES
            + share)
            * AGREEMENT;
        Self(index as u16)
    }

    /// The same proposal where the other sources `proposed_by` (per source, in
    /// [`Source::ALL`]'s order; its own entry is ignored) proposed the node too.
    pub fn agreed(self, proposed_by: [bool; SOURCES]) -> Self {
        let own = self.source() as usize;
        let others = (0..SOURCES)
            .filter(|&s| s != own)
            .enumerate()
            .filter(|&(_, s)| proposed_by[s])
            .fold(0u16, |bits, (bit, _)| bits | 1 << bit);
        Self(self.0 - self.0 % AGREEMENT as u16 + others)
    }

    fn is_agreed(self) -> bool {
        !self.0.is_multiple_of(AGREEMENT as u16)
    }

    fn source(self) -> Source {
        Source::ALL[usize::from(self.0) / (EVIDENCE * DEPTHS * SHARES * AGREEMENT)]
    }

    fn evidence(self) -> usize {
        usize::from(self.0) / (DEPTHS * SHARES * AGREEMENT) % EVIDENCE
    }

    fn share(self) -> usize {
        usize::from(self.0) / AGREEMENT % SHARES
    }
}

/// Acceptance rates per kind of proposal, shared by every `auto` sequence of an engine (the
/// engine thread alone reads and writes it; the lock is never contended).
#[derive(Debug)]
pub struct Calibration {
    /// `(accepted, outcomes)` per cell.
    cells: Mutex<Vec<(f32, f32)>>,
}

impl Default for Calibration {
    fn default() -> Self {
        Self::new()
    }
}

impl Calibration {
    /// No outcome yet: every cell at its prior.
    pub fn new() -> Self {
        Self {
            cells: Mutex::new(vec![
                (0.0, 0.0);
                SOURCES * EVIDENCE * DEPTHS * SHARES * AGREEMENT
            ]),
        }
    }

    /// What a cell is expected to accept before any outcome: a match's continuation by its
    /// share (a longer match a little more), the prediction's higher (a client predicts
    /// its output on purpose), a recycled candidate by its rank; where another source
    /// proposed the node too, a third of what it misses is made up.
    fn prior(cell: Cell) -> f32 {
        let alone = Self::prior_alone(cell);
        if cell.is_agreed() {
            alone + (1.0 - alone) / 3.0
        } else {
            alone
        }
    }

    /// [`Self::prior`] of a proposal no other source made.
    fn prior_alone(cell: Cell) -> f32 {
        let share = [0.15, 0.35, 0.55, 0.7][cell.share()];
        match cell.source() {
            Source::Prediction => {
                let evidence = [0.5, 0.55, 0.65, 0.75, 0.8, 0.9, 0.95, 0.97][cell.evidence()];
                evidence * [0.3, 0.6, 0.85, 1.0][cell.share()]
            }
            Source::Recycling => {
                let evidence = cell.evidence();
                let first = if evidence >= ALONE { 0.2 } else { 0.3 };
                let keyed = if evidence & 2 != 0 { 1.5 } else { 1.0 };
                first * keyed / (1.0 + (evidence & 1) as f32)
            }
            _ => share * (0.7 + 0.05 * cell.evidence() as f32),
        }
    }

    /// The acceptance rate of `cell`'s proposals.
    pub fn rate(&self, cell: Cell) -> f32 {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        rate(&cells, cell)
    }

    /// A proposal of `cell` whose parent was accepted was (or was not) accepted.
    pub fn record(&self, cell: Cell, accepted: bool) {
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((a, n)) = cells.get_mut(usize::from(cell.0)) {
            *a += f32::from(u8::from(accepted));
            *n += 1.0;
            if *n > MEMORY {
                *a /= 2.0;
                *n /= 2.0;
            }
        }
    }
}

/// The acceptance rate of `cell`'s proposals among `cells`.
fn rate(cells: &[(f32, f32)], cell: Cell) -> f32 {
    let (accepted, outcomes) = cells.get(usize::from(cell.0)).copied().unwrap_or_default();
    (accepted + PRIOR_WEIGHT * Calibration::prior(cell)) / (outcomes + PRIOR_WEIGHT)
}

/// A source's proposal of a node: the trie it comes from, where, and its evidence.
#[derive(Debug, Clone, Copy)]
pub struct Proposal<'a> {
    /// The continuations, best first.
    pub trie: &'a ContinuationTree,
    /// The evidence bucket (the match length's).
    pub evidence: usize,
}

/// The proposals of the sources that match (none: the source proposes nothing this step).
#[derive(Debug, Clone, Copy, Default)]
pub struct Proposals<'a> {
    /// The sequence's own tokens.
    pub context: Option<Proposal<'a>>,
    /// The global suffix index.
    pub global: Option<Proposal<'a>>,
    /// The request's prediction.
    pub prediction: Option<Proposal<'a>>,
}

impl<'a> Proposals<'a> {
    /// Per matching source (in [`Source`] order), its proposal.
    fn each(&self) -> [Option<Proposal<'a>>; MATCHES] {
        [self.context, self.global, self.prediction]
    }
}

/// Limits of one merged tree.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most nodes.
    pub max_nodes: usize,
    /// Least path probability a node needs.
    pub floor: f32,
    /// Token Recycling's candidates under a node.
    pub recycling_branch: usize,
    /// Levels Token Recycling proposes below the last node a match proposed.
    pub recycling_depth: usize,
    /// Levels Token Recycling proposes alone where no match proposes anything (0: none).
    pub recycling_alone: usize,
}

const NONE: u32 = u32::MAX;

/// A node waiting to be drafted.
#[derive(Debug, Clone, Copy)]
struct Frontier {
    p: f32,
    token: u32,
    parent: Option<usize>,
    depth: usize,
    /// Per matching source, where the node is in its trie (`NONE`: not there).
    at: [u32; MATCHES],
    cells: [Option<Cell>; SOURCES],
    /// Levels Token Recycling may still add below: [`Limits::recycling_depth`] under a node
    /// a match proposed, one less under each node only it proposed.
    reach: usize,
    /// The last tokens of its path, its own last: the matrix's rows keyed by them.
    path: PathEnd,
    /// Whether a match proposed it or a node above it.
    matched: bool,
}

impl PartialEq for Frontier {
    fn eq(&self, other: &Self) -> bool {
        self.p.total_cmp(&other.p).is_eq()
    }
}
impl Eq for Frontier {}
impl PartialOrd for Frontier {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Frontier {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Higher probability first; then shallower.
        self.p
            .total_cmp(&other.p)
            .then(other.depth.cmp(&self.depth))
    }
}

/// One step's merged tree: the candidates, and per node its path probability and the cells
/// of the sources that proposed it.
#[derive(Debug, Default)]
pub struct MergedTree {
    /// The nodes, best first (parents first).
    pub candidates: Candidates,
    /// Per node, the probability that verification accepts it.
    pub p: Vec<f32>,
    /// Per node, each source's cell where it proposed the node.
    pub cells: Vec<[Option<Cell>; SOURCES]>,
    /// Running sum of `p`: expected accepted tokens of the first n nodes.
    pub expected: Vec<f32>,
    heap: BinaryHeap<Frontier>,
    children: Vec<Frontier>,
}

impl MergedTree {
    /// Forgets the tree.
    pub fn clear(&mut self) {
        self.candidates.clear();
        self.p.clear();
        self.cells.clear();
        self.expected.clear();
        self.heap.clear();
    }

    /// Grows the tree under `tokens`' last (the pending token) from the matching sources'
    /// `proposals` and `matrix` (its rows keyed by the path's last tokens where it has them),
    /// priced by `calibration`.
    pub fn grow(
        &mut self,
        tokens: &[u32],
        proposals: &Proposals<'_>,
        matrix: Option<&RecyclingMatrix>,
        calibration: &Calibration,
        limits: Limits,
    ) {
        self.clear();
        let proposals = proposals.each();
        let cells = calibration.cells.lock().unwrap_or_else(|e| e.into_inner());
        let at = proposals.map(|p| {
            if p.is_some_and(|p| !p.trie.is_empty()) {
                0
            } else {
                NONE
            }
        });
        let matched = at.iter().any(|&a| a != NONE);
        let root = Frontier {
            p: 1.0,
            token: tokens.last().copied().unwrap_or(0),
            parent: None,
            depth: 0,
            at,
            cells: [None; SOURCES],
            reach: if matched {
                limits.recycling_depth
            } else {
                limits.recycling_alone
            },
            matched,
            path: PathEnd::new(tokens),
        };
        self.expand(&root, None, &proposals, matrix, &cells, limits);
        while self.candidates.len() < limits.max_nodes {
            let Some(node) = self.heap.pop() else {
                break;
            };
            let index = self.candidates.push(node.parent, node.token);
            self.p.push(node.p);
            self.cells.push(node.cells);
            let sum = self.expected.last().copied().unwrap_or(0.0) + node.p;
            self.expected.push(sum);
            self.expand(&node, Some(index), &proposals, matrix, &cells, limits);
        }
        self.heap.clear();
    }

    /// Pushes the children of `node` (drafted as `index`; the root: `None`) that clear the
    /// floor.
    fn expand(
        &mut self,
        node: &Frontier,
        index: Option<usize>,
        proposals: &[Option<Proposal<'_>>; MATCHES],
        matrix: Option<&RecyclingMatrix>,
        calibration: &[(f32, f32)],
        limits: Limits,
    ) {
        let depth = node.depth + 1;
        self.children.clear();
        for (which, (proposal, &at)) in proposals.iter().zip(&node.at).enumerate() {
            let (Some(proposal), true) = (proposal, at != NONE) else {
                continue;
            };
            let total = proposal.trie.weight(at);
            if total <= 0.0 {
                continue;
            }
            let source = Source::ALL[which];
            for (child, token) in proposal.trie.children(at) {
                let share = proposal.trie.weight(child) / total;
                let cell = Cell::new(source, proposal.evidence, depth, share);
                let entry = self.child(token, index, node);
                entry.cells[which] = Some(cell);
                entry.at[which] = child;
            }
        }
        // Token Recycling branches beside and extends past what a match proposes; alone
        // (no match above) its candidates are calibrated apart, being accepted less often.
        if let Some(matrix) = matrix.filter(|_| node.reach > 0) {
            for rank in 0..limits.recycling_branch {
                let Some((token, keyed)) = matrix.candidate_in(node.path.tokens(), rank) else {
                    break;
                };
                let evidence = recycled(node.matched, rank, keyed);
                let cell = Cell::new(Source::Recycling, evidence, depth, 0.0);
                let entry = self.child(token, index, node);
                entry.cells[Source::Recycling as usize] = Some(cell);
            }
        }
        for mut child in self.children.drain(..) {
            let proposed_by = child.cells.map(|c| c.is_some());
            for cell in child.cells.iter_mut().flatten() {
                *cell = cell.agreed(proposed_by);
            }
            let proposed = child.at.iter().any(|&a| a != NONE);
            child.matched = node.matched || proposed;
            child.reach = if proposed {
                limits.recycling_depth
            } else {
                node.reach.saturating_sub(1)
            };
            // The best of its sources' rates: where several proposed it, each source's rate
            // was learnt from the nodes it proposed with others, so it holds their agreement.
            let rate = child
                .cells
                .iter()
                .flatten()
                .map(|&c| rate(calibration, c))
                .fold(0.0f32, f32::max);
            child.p = node.p * rate.clamp(0.0, 1.0);
            if child.p >= limits.floor {
                self.heap.push(child);
            }
        }
    }

    /// The child of `node` with `token` among this expansion's, made when new.
    fn child(&mut self, token: u32, index: Option<usize>, node: &Frontier) -> &mut Frontier {
        let at = match self.children.iter().position(|c| c.token == token) {
            Some(at) => at,
            None => {
                let mut path = node.path;
                path.push(token);
                let depth = node.depth + 1;
                self.children.push(Frontier {
                    p: 0.0,
                    token,
                    parent: index,
                    depth,
                    at: [NONE; MATCHES],
                    cells: [None; SOURCES],
                    reach: 0,
                    matched: false,
                    path,
                });
                self.children.len() - 1
            }
        };
        &mut self.children[at]
    }
}

#[cfg(test)]
mod tests;
