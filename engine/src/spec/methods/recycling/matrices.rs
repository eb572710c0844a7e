//! Token Recycling's matrices, one per cache salt: requests without a salt share the engine's
//! matrix (the one `--recycling-state` saves and loads); each salt in use gets its own, so a
//! request drafts only from what requests with its salt (or, without one, requests without
//! one) taught. Salted matrices live in memory only, at most [`MAX_SALTED_MATRICES`] at once:
//! past that the least recently used salt's matrix is dropped, and that salt starts cold
//! again.

use std::sync::{Arc, Mutex};

use kvcache::BlockHash;

use super::RecyclingMatrix;

/// Most cache salts with a matrix of their own at once.
pub const MAX_SALTED_MATRICES: usize = 16;

/// The salted matrices, least recently used first.
#[derive(Debug, Default)]
struct Salted {
    /// `(scope, matrix)`, the most recently used last.
    entries: Vec<(BlockHash, Arc<RecyclingMatrix>)>,
}

/// Every matrix of one engine.
#[derive(Debug)]
pub struct RecyclingMatrices {
    unsalted: Arc<RecyclingMatrix>,
    salted: Mutex<Salted>,
}

impl RecyclingMatrices {
    /// `unsalted` for requests without a salt, none yet for any salt.
    pub fn new(unsalted: RecyclingMatrix) -> Self {
        Self {
            unsalted: Arc::new(unsalted),
            salted: Mutex::new(Salted::default()),
        }
    }

    /// The matrix of requests without a salt.
    pub fn unsalted(&self) -> &Arc<RecyclingMatrix> {
        &self.unsalted
    }

    /// The matrix of `scope` (a cache salt's, `None` for none), made cold when the salt has
    /// none yet; the salt becomes the most recently used.
    pub fn get(&self, scope: Option<BlockHash>) -> Arc<RecyclingMatrix> {
        let Some(scope) = scope else {
            return Arc::clone(&self.unsalted);
        };
        let mut salted = self.salted.lock().unwrap_or_else(|e| e.into_inner());
        let entries = &mut salted.entries;
        let matrix = match entries.iter().position(|(s, _)| *s == scope) {
            Some(i) => entries.remove(i).1,
            None => {
                if entries.len() >= MAX_SALTED_MATRICES {
                    entries.remove(0);
                }
                Arc::new(RecyclingMatrix::new(
                    self.unsalted.vocab(),
                    self.unsalted.k(),
                ))
            }
        };
        entries.push((scope, Arc::clone(&matrix)));
        matrix
    }

    /// Whether `scope`'s matrix has no row for `token` yet (so a prompt row feeding it would
    /// teach one).
    pub fn lacks_row(&self, token: u32, scope: Option<BlockHash>) -> bool {
        let matrix = self.get(scope);
        (token as usize) < matrix.vocab() && !matrix.has_row(token)
    }

    /// Salts with a matrix now.
    pub fn salted_len(&self) -> usize {
        self.salted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(best: usize) -> Vec<f32> {
        let mut logits = vec![0.0; 10];
        logits[best] = 1.0;
        logits
    }

    #[test]
    fn each_salt_learns_apart_and_the_least_recent_is_dropped() {
        let m = RecyclingMatrices::new(RecyclingMatrix::new(10, 2));
        let (a, b) = (BlockHash::scope(b"a"), BlockHash::scope(b"b"));
        m.get(Some(a)).update(1, &row(2));
        assert_eq!(m.get(Some(a)).candidate(1, 0), Some(2));
        assert_eq!(m.get(Some(b)).candidate(1, 0), None);
        assert_eq!(m.get(None).candidate(1, 0), None);
        m.get(None).update(1, &row(3));
        assert_eq!(m.unsalted().candidate(1, 0), Some(3));
        assert_eq!(m.get(Some(a)).candidate(1, 0), Some(2));
        // Fill past the bound with other salts, touching a on the way: b goes first.
        for i in 0..MAX_SALTED_MATRICES - 2 {
            m.get(Some(BlockHash::scope(format!("s{i}").as_bytes())));
        }
        m.get(Some(a));
        m.get(Some(BlockHash::scope(b"one more")));
        assert_eq!(m.salted_len(), MAX_SALTED_MATRICES);
        assert_eq!(
            m.get(Some(a)).candidate(1, 0),
            Some(2),
            "a was used recently"
        );
        m.get(Some(b)).update(5, &row(6));
        assert_eq!(
            m.get(Some(b)).candidate(1, 0),
            None,
            "b was dropped and starts cold"
        );
        assert_eq!(m.salted_len(), MAX_SALTED_MATRICES);
    }
}
