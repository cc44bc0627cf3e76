//! The identity of a text: its size and a fast checksum of its bytes, computed while the text is
//! read anyway. A checkpoint records it so that a resumed run can tell that its text changed;
//! prepared datasets can record the identity of their sources the same way.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

/// Size and checksum (XXH3, 64 bits) of a file's bytes, exactly as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextIdentity {
    pub bytes: u64,
    pub xxh3: u64,
}

impl TextIdentity {
    /// The identity of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        let mut h = IdentityHasher::default();
        h.update(bytes);
        h.finish()
    }
}

impl std::fmt::Display for TextIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes, checksum {:016x}", self.bytes, self.xxh3)
    }
}

/// Builds a [`TextIdentity`] from pieces, for a text read in a stream.
#[derive(Default, Clone)]
pub struct IdentityHasher {
    bytes: u64,
    hash: Xxh3,
}

impl IdentityHasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.bytes += bytes.len() as u64;
        self.hash.update(bytes);
    }

    pub fn finish(&self) -> TextIdentity {
        TextIdentity {
            bytes: self.bytes,
            xxh3: self.hash.digest(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_bytes_same_identity_in_pieces_or_whole() {
        let text = "To be, or not to be".repeat(1000);
        let mut h = IdentityHasher::default();
        for piece in text.as_bytes().chunks(77) {
            h.update(piece);
        }
        assert_eq!(h.finish(), TextIdentity::of(text.as_bytes()));
        assert_eq!(h.finish().bytes, text.len() as u64);
    }

    #[test]
    fn one_changed_byte_changes_the_checksum_not_the_size() {
        let a = TextIdentity::of(b"hello world");
        let b = TextIdentity::of(b"hello World");
        assert_eq!(a.bytes, b.bytes);
        assert_ne!(a, b);
        assert!(a.to_string().starts_with("11 bytes, checksum "), "{a}");
    }
}
