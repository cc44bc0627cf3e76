//! The encoded text cut in two: the first part trains, the rest measures generalisation.

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
        "the {split} split has {len} characters, but one window needs block_size + 1 = {needed}: \
         use a longer text, lower --block-size below {len}, or change the train fraction"
    )]
    TooShort {
        split: &'static str,
        len: usize,
        needed: usize,
    },
}

/// The token ids of a text, held once, with the index where validation begins.
#[derive(Debug, Clone)]
pub struct Splits {
    ids: Vec<u32>,
    n_train: usize,
}

impl Splits {
    /// Cuts `ids` after the first `train_fraction` of tokens; both parts must hold at least one
    /// window of `block_size + 1` tokens.
    pub fn new(ids: Vec<u32>, train_fraction: f64, block_size: usize) -> Result<Self, SplitError> {
        if !(train_fraction > 0.0 && train_fraction < 1.0) {
            return Err(SplitError::Fraction(train_fraction));
        }
        let n_train = (ids.len() as f64 * train_fraction) as usize;
        let splits = Self { ids, n_train };
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
    pub fn get(&self, split: Split) -> &[u32] {
        match split {
            Split::Train => &self.ids[..self.n_train],
            Split::Val => &self.ids[self.n_train..],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ninety_ten_without_overlap() {
        let s = Splits::new((0..100).collect(), 0.9, 4).unwrap();
        assert_eq!(s.get(Split::Train), (0..90).collect::<Vec<_>>());
        assert_eq!(s.get(Split::Val), (90..100).collect::<Vec<_>>());
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
        assert!(err.to_string().contains("--block-size"));
        assert!(Splits::new((0..100).collect(), 1.0, 4).is_err());
    }
}
