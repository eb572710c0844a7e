//! `BlockHash`: the content key of one full block for the prefix cache. A block's hash
//! covers its own token ids *and* its parent's hash, so equal hashes mean equal whole
//! prefixes, not just equal blocks (a vLLM-style hash chain). A request's cache salt is the
//! parent of its first block, so only requests with the same salt (or with none, for none)
//! share cached blocks. 128 bits of SHA-256: a false
//! hit would silently serve another prompt's KV, so the key is wide enough that it never
//! happens in practice. The token ids are hashed and forgotten; this crate stores none.

use std::hash::{BuildHasherDefault, Hasher};

use sha2::{Digest, Sha256};

/// Hash of a full block and, through its parent, of every block before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

impl BlockHash {
    /// Hash of a block holding `tokens` whose predecessor block hashes to `parent`
    /// (`None` for the first block of a sequence).
    pub fn new(parent: Option<BlockHash>, tokens: &[u32]) -> Self {
        let mut hasher = Sha256::new();
        match parent {
            Some(parent) => {
                hasher.update([1u8]);
                hasher.update(parent.0.to_le_bytes());
            }
            None => hasher.update([0u8]),
        }
        for token in tokens {
            hasher.update(token.to_le_bytes());
        }
        let digest = hasher.finalize();
        let mut first = [0u8; 16];
        first.copy_from_slice(&digest[..16]);
        BlockHash(u128::from_le_bytes(first))
    }

    /// The scope of a cache salt: given as the parent of a salted sequence's first block,
    /// it puts the sequence's whole chain apart from every chain of another salt or of none
    /// (tagged apart from block hashes, so no block's hash can equal it).
    pub fn scope(salt: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update([2u8]);
        hasher.update(salt);
        let digest = hasher.finalize();
        let mut first = [0u8; 16];
        first.copy_from_slice(&digest[..16]);
        BlockHash(u128::from_le_bytes(first))
    }

    /// The hashes of every full block of `tokens` in order (`tokens.len() / block_size`),
    /// under `scope` (a cache salt's, `None` for none).
    pub fn chain(tokens: &[u32], block_size: usize, scope: Option<BlockHash>) -> Vec<BlockHash> {
        let mut parent = scope;
        tokens
            .chunks_exact(block_size)
            .map(|block| {
                let hash = BlockHash::new(parent, block);
                parent = Some(hash);
                hash
            })
            .collect()
    }
}

/// A `HashMap` hasher for keys that are already uniform hashes: it keeps the low 64 bits
/// instead of hashing them again.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PrehashedHasher(u64);

impl Hasher for PrehashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached for keys that are not u128s; fold bytes in so it stays a hash.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u128(&mut self, value: u128) {
        self.0 = value as u64;
    }
}

/// Build-hasher for maps keyed by [`BlockHash`].
pub(crate) type Prehashed = BuildHasherDefault<PrehashedHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_depends_on_tokens_and_whole_prefix() {
        let a = BlockHash::new(None, &[1, 2, 3, 4]);
        assert_eq!(a, BlockHash::new(None, &[1, 2, 3, 4]));
        assert_ne!(a, BlockHash::new(None, &[1, 2, 3, 5]));
        let b = BlockHash::new(Some(a), &[9, 9, 9, 9]);
        let other_parent = BlockHash::new(None, &[0, 2, 3, 4]);
        assert_ne!(b, BlockHash::new(Some(other_parent), &[9, 9, 9, 9]));
        assert_ne!(BlockHash::new(None, &[]), BlockHash::new(Some(a), &[]));
    }

    #[test]
    fn chain_covers_full_blocks_only() {
        let tokens: Vec<u32> = (0..10).collect();
        let chain = BlockHash::chain(&tokens, 4, None);
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[0], BlockHash::new(None, &[0, 1, 2, 3]));
        assert_eq!(chain[1], BlockHash::new(Some(chain[0]), &[4, 5, 6, 7]));
    }

    #[test]
    fn a_salt_sets_a_whole_chain_apart() {
        let tokens: Vec<u32> = (0..8).collect();
        let plain = BlockHash::chain(&tokens, 4, None);
        let a = BlockHash::chain(&tokens, 4, Some(BlockHash::scope(b"tenant-a")));
        let a_again = BlockHash::chain(&tokens, 4, Some(BlockHash::scope(b"tenant-a")));
        let b = BlockHash::chain(&tokens, 4, Some(BlockHash::scope(b"tenant-b")));
        assert_eq!(a, a_again);
        for i in 0..2 {
            assert_ne!(a[i], plain[i]);
            assert_ne!(a[i], b[i]);
        }
        // A scope is never a block's hash: the empty salt is not the empty first block.
        assert_ne!(BlockHash::scope(b""), BlockHash::new(None, &[]));
    }
}
