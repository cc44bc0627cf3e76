//! The encoded text cut in two: the first part trains, the rest measures generalisation.

use std::sync::Arc;

/// Which part of the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    Train,
    Val,
}

impl Split {
    /// Lower-case name, as in logs.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
        }
    }
}

/// A split too short to hold one training window, or a fraction that leaves a part empty.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SplitError {
    #[error("train_fraction is {0}, but it must be in (0, 1)")]
    Fraction(f64),
    #[error(
        "the {split} split has {len} tokens, but one window needs block_size + 1 = {needed}: \
         use a longer text{}, or change the train fraction",
        lower_block_size(*len)
    )]
    TooShort {
        split: &'static str,
        len: usize,
        needed: usize,
    },
}

/// The advice for a split of `len` tokens: a context that fits it, where one does.
fn lower_block_size(len: usize) -> String {
    match len {
        0 | 1 => String::new(),
        _ => format!(", lower --block-size to {} or less", len - 1),
    }
}

/// The token ids of one part, borrowed: 16-bit (a prepared file of a small vocabulary) or
/// 32-bit.
#[derive(Debug, Clone, Copy)]
pub enum Ids<'a> {
    U16(&'a [u16]),
    U32(&'a [u32]),
}

impl Ids<'_> {
    pub fn len(&self) -> usize {
        match self {
            Ids::U16(ids) => ids.len(),
            Ids::U32(ids) => ids.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends ids `range` to `out`.
    pub fn extend_into(&self, range: std::ops::Range<usize>, out: &mut Vec<u32>) {
        match self {
            Ids::U16(ids) => out.extend(ids[range].iter().map(|&i| u32::from(i))),
            Ids::U32(ids) => out.extend_from_slice(&ids[range]),
        }
    }

    pub fn to_vec(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len());
        self.extend_into(0..self.len(), &mut out);
        out
    }
}

impl<'a> From<&'a [u32]> for Ids<'a> {
    fn from(ids: &'a [u32]) -> Self {
        Ids::U32(ids)
    }
}

impl<'a> From<&'a Vec<u32>> for Ids<'a> {
    fn from(ids: &'a Vec<u32>) -> Self {
        Ids::U32(ids)
    }
}

/// Where one part's ids live: in memory, or in a memory-mapped file of little-endian ids.
#[derive(Debug)]
pub enum Store {
    Owned(Vec<u32>),
    Mapped16(memmap2::Mmap),
    Mapped32(memmap2::Mmap),
}

impl Store {
    pub fn ids(&self) -> Ids<'_> {
        match self {
            Store::Owned(ids) => Ids::U32(ids),
            // The map starts on a page boundary and its length was checked to be a multiple of
            // the width when opened, so the casts cannot fail.
            Store::Mapped16(map) => Ids::U16(bytemuck::cast_slice(map)),
            Store::Mapped32(map) => Ids::U32(bytemuck::cast_slice(map)),
        }
    }
}

/// The token ids of a text, cut in two: training and validation. A clone shares the ids (so
/// that several trainers, measuring shapes side by side, read one copy).
#[derive(Debug, Clone)]
pub struct Splits {
    train: Arc<Store>,
    val: Arc<Store>,
}

impl Splits {
    /// Cuts `ids` after the first `train_fraction` of tokens; both parts must hold at least one
    /// window of `block_size + 1` tokens.
    pub fn new(
        mut ids: Vec<u32>,
        train_fraction: f64,
        block_size: usize,
    ) -> Result<Self, SplitError> {
        if !(train_fraction > 0.0 && train_fraction < 1.0) {
            return Err(SplitError::Fraction(train_fraction));
        }
        let n_train = (ids.len() as f64 * train_fraction) as usize;
        let val = ids.split_off(n_train);
        ids.shrink_to_fit();
        Self::from_parts(Store::Owned(ids), Store::Owned(val), block_size)
    }

    /// The two parts as they are stored; each must hold one window of `block_size + 1`.
    pub fn from_parts(train: Store, val: Store, block_size: usize) -> Result<Self, SplitError> {
        let splits = Self {
            train: Arc::new(train),
            val: Arc::new(val),
        };
        for split in [Split::Train, Split::Val] {
            let len = splits.get(split).len();
            if len < block_size + 1 {
                return Err(SplitError::TooShort {
                    split: split.name(),
                    len,
                    needed: block_size + 1,
                });
            }
        }
        Ok(splits)
    }

    /// The token ids of one part.
    pub fn get(&self, split: Split) -> Ids<'_> {
        match split {
            Split::Train => self.train.ids(),
            Split::Val => self.val.ids(),
        }
    }

    /// Tokens in both parts.
    pub fn len(&self) -> usize {
        self.get(Split::Train).len() + self.get(Split::Val).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ninety_ten_without_overlap() {
        let s = Splits::new((0..100).collect(), 0.9, 4).unwrap();
        assert_eq!(s.get(Split::Train).to_vec(), (0..90).collect::<Vec<_>>());
        assert_eq!(s.get(Split::Val).to_vec(), (90..100).collect::<Vec<_>>());
    }

    #[test]
    fn too_short_split_names_sizes_and_remedy() {
        let err = Splits::new((0..100).collect(), 0.9, 10).unwrap_err();
        assert_eq!(
            err,
            SplitError::TooShort {
                split: "val",
                len: 10,
                needed: 11
            }
        );
        assert!(
            err.to_string().contains("lower --block-size to 9 or less"),
            "{err}"
        );
        // A split of one token has no context to lower to.
        let err = Splits::new((0..20).collect(), 0.95, 3).unwrap_err();
        assert!(!err.to_string().contains("--block-size"), "{err}");
        assert!(Splits::new((0..100).collect(), 1.0, 4).is_err());
    }
}
