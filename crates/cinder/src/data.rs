//! What a run trains on: texts encoded in memory (characters), or a prepared dataset of token
//! files, memory-mapped (any tokenizer; a BPE run prepares one in its run folder by itself);
//! and batches turned into tensors.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use cinder_data::prepared::{self, Prepared, PreparedError};
use cinder_data::source::{Piece, count_chars};
use cinder_data::{
    Batch, CharTokenizer, CorpusError, DocumentBreak, EncodeError, SourceError, Sources, Split,
    SplitError, Splits, TextIdentity, Tokenizer,
};

use crate::config::{TokenizerKind, TrainConfig};
use crate::storage::names::PREPARED;

/// Why the data could not be made ready for training.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    #[error(transparent)]
    Split(#[from] SplitError),
    #[error(transparent)]
    Prepared(#[from] PreparedError),
    #[error("{path} does not fit the tokenizer: {source}")]
    Vocabulary { source: EncodeError, path: String },
    #[error(
        "{} is a prepared dataset, but it was prepared with another tokenizer than the \
         checkpoint's: prepare the text again with the checkpoint's tokenizer, or train a new model",
        .0.display()
    )]
    OtherTokenizer(PathBuf),
    #[error(
        "{} was prepared with a {has} tokenizer, but the run asks for {asked}: a prepared \
         dataset brings its own tokenizer, so drop --tokenizer (and `tokenizer` from the \
         config), or prepare the text again with the one you want",
        .dir.display()
    )]
    PreparedWithOther {
        dir: PathBuf,
        has: String,
        asked: String,
    },
    #[error(transparent)]
    Bpe(#[from] cinder_data::BpeError),
    #[error("{0}")]
    Tokenizer(String),
}

/// Which tokenizer a run uses: for a new run, `tokenizer` and `vocab_size` of the config; a
/// resumed or fine-tuned run keeps its checkpoint's.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenizerChoice {
    /// This one (a checkpoint's).
    Keep(Box<Tokenizer>),
    /// A new one, made from the training text or read from a file.
    New(TokenizerKind),
}

impl TokenizerChoice {
    /// The choice a config makes (checked by [`TrainConfig::validate`]).
    pub fn of(config: &TrainConfig) -> Self {
        TokenizerChoice::New(config.tokenizer_kind())
    }
}

impl TokenizerChoice {
    /// The tokenizer this choice makes for `sources`: their characters, a BPE trained on their
    /// first `train_fraction` (reported through `progress`), or the file named.
    pub fn make(
        &self,
        sources: &Sources,
        train_fraction: f64,
        progress: &mut dyn FnMut(&str, u64, u64),
    ) -> Result<Tokenizer, DataError> {
        Ok(match self {
            TokenizerChoice::Keep(tokenizer) => tokenizer.as_ref().clone(),
            TokenizerChoice::New(TokenizerKind::Char) => Tokenizer::Char(char_vocabulary(sources)?),
            TokenizerChoice::New(TokenizerKind::Bpe(vocab_size)) => {
                progress("training the BPE tokenizer", 0, 1);
                let bpe = prepared::train_bpe(sources, train_fraction, *vocab_size)?;
                progress("training the BPE tokenizer", 1, 1);
                Tokenizer::Bpe(bpe)
            }
            TokenizerChoice::New(TokenizerKind::File(path)) => {
                Tokenizer::Bpe(cinder_data::BpeTokenizer::from_file(path)?)
            }
        })
    }
}

/// A run's data ready for training. A clone shares the token ids ([`Splits`]).
#[derive(Clone)]
pub struct TrainingData {
    /// What was given: text files and folders of them, or one prepared folder.
    pub paths: Vec<PathBuf>,
    pub tokenizer: Tokenizer,
    pub splits: Splits,
    /// The size and checksum of the source texts, recorded in checkpoints.
    pub identity: TextIdentity,
    /// The `tokenizer.json` of a prepared folder given as the data: the BPE it brings, which
    /// the run trains with ([`TrainingData::settle`]).
    pub tokenizer_file: Option<PathBuf>,
}

impl TrainingData {
    /// The data of a run. `paths` are text files and folders of them, or a single prepared
    /// folder. The tokenizer is made as `choice` says (a prepared folder brings its own: a
    /// checkpoint's kept, a BPE or a tokenizer.json asked for must agree with it). Characters
    /// are encoded in memory; any other
    /// tokenizer goes through token files prepared in `run_dir`/data (`run_dir` `None`: an
    /// error for a tokenizer that needs them).
    pub fn open(
        paths: &[PathBuf],
        choice: &TokenizerChoice,
        config: &TrainConfig,
        run_dir: Option<&Path>,
        progress: &mut dyn FnMut(&str, u64, u64),
    ) -> Result<Self, DataError> {
        let (fraction, block) = (config.train_fraction, config.block_size);
        if let [dir] = paths
            && prepared::is_prepared(dir)
        {
            let p = Prepared::open(dir, block)?;
            if let TokenizerChoice::Keep(t) = choice
                && **t != p.tokenizer
            {
                return Err(DataError::OtherTokenizer(dir.clone()));
            }
            // A prepared folder brings its tokenizer, which replaces the default characters; a
            // BPE asked for must be of its kind, and a tokenizer.json asked for must be its own.
            let conflict = match (choice, &p.tokenizer) {
                (TokenizerChoice::New(TokenizerKind::Bpe(_)), Tokenizer::Char(_)) => {
                    Some("a BPE (--tokenizer bpe)".to_string())
                }
                (TokenizerChoice::New(TokenizerKind::File(path)), prepared) => {
                    let asked = cinder_data::BpeTokenizer::from_file(path)?;
                    (!matches!(prepared, Tokenizer::Bpe(t) if *t == asked))
                        .then(|| format!("the tokenizer in {}", path.display()))
                }
                _ => None,
            };
            if let Some(asked) = conflict {
                let has = match &p.tokenizer {
                    Tokenizer::Char(_) => "character",
                    Tokenizer::Bpe(_) => "BPE",
                };
                return Err(DataError::PreparedWithOther {
                    dir: dir.clone(),
                    has: format!("{has} ({} tokens)", p.tokenizer.vocab_size()),
                    asked,
                });
            }
            let file = p.meta.tokenizer.file().map(|f| dir.join(f));
            return Ok(Self {
                tokenizer_file: file,
                ..Self::from_prepared(paths.to_vec(), p)
            });
        }
        let sources = Sources::open(paths)?;
        let tokenizer = choice.make(&sources, fraction, progress)?;
        match tokenizer {
            Tokenizer::Char(_) => Self::in_memory(paths, &sources, tokenizer, fraction, block),
            Tokenizer::Bpe(_) => {
                let Some(run_dir) = run_dir else {
                    return Err(DataError::Tokenizer(
                        "a BPE tokenizer reads prepared token files: make them with `prepare`"
                            .into(),
                    ));
                };
                let dir = run_dir.join(PREPARED);
                let mut report = |done, total| progress("encoding", done, total);
                prepared::prepare(&sources, &tokenizer, fraction, &dir, &mut report)?;
                let p = Prepared::open(&dir, block)?;
                Ok(Self {
                    paths: vec![dir],
                    ..Self::from_prepared(paths.to_vec(), p)
                })
            }
        }
    }

    /// Makes `config` name the tokenizer this data trains with, where a prepared folder's BPE
    /// replaced what it said (the default characters, or a BPE to train): its tokenizer.json,
    /// by an absolute path, so that the run's `config.toml` says what the run is.
    pub fn settle(&self, config: &mut TrainConfig) {
        if let Some(file) = &self.tokenizer_file
            && !config.tokenizer_is_file()
        {
            let file = std::path::absolute(file).unwrap_or_else(|_| file.clone());
            config.tokenizer = file.display().to_string();
            config.vocab_size = 0;
        }
    }

    fn from_prepared(paths: Vec<PathBuf>, p: Prepared) -> Self {
        Self {
            paths,
            tokenizer: p.tokenizer,
            splits: p.splits,
            identity: p.meta.identity,
            tokenizer_file: None,
        }
    }

    /// Characters, in memory: the documents joined by a blank line, encoded once into ids sized
    /// exactly, then cut (the same cut as on the text: one character is one id).
    fn in_memory(
        paths: &[PathBuf],
        sources: &Sources,
        tokenizer: Tokenizer,
        fraction: f64,
        block: usize,
    ) -> Result<Self, DataError> {
        let brk = match tokenizer.document_break() {
            DocumentBreak::Text(t) => t,
            DocumentBreak::Token(_) => unreachable!("characters break documents with text"),
        };
        let total = count_chars(sources, brk.chars().count() as u64)?;
        let mut ids = Vec::with_capacity(total as usize);
        let vocabulary = |source| DataError::Vocabulary {
            source,
            path: paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        };
        for piece in sources.pieces() {
            match piece? {
                Piece::Text(t) => tokenizer.encode_into(&t, &mut ids),
                Piece::Break => tokenizer.encode_into(brk, &mut ids),
            }
            .map_err(vocabulary)?;
        }
        let splits = Splits::new(ids, fraction, block)?;
        Ok(Self {
            paths: paths.to_vec(),
            tokenizer,
            splits,
            identity: sources.identity(),
            tokenizer_file: None,
        })
    }

    /// Tokens of one split.
    pub fn tokens(&self, split: Split) -> usize {
        self.splits.get(split).len()
    }
}

/// The vocabulary of the documents' characters, with the blank line that joins them.
pub fn char_vocabulary(sources: &Sources) -> Result<CharTokenizer, CorpusError> {
    // A pass to collect the set: the vocabulary is built from it without holding the text.
    let mut seen = std::collections::BTreeSet::new();
    let mut ascii = [false; 128];
    for piece in sources.pieces() {
        let text = match piece? {
            Piece::Text(t) => t,
            Piece::Break => "\n\n".into(),
        };
        for c in text.chars() {
            match ascii.get_mut(c as usize) {
                Some(a) => *a = true,
                None => {
                    seen.insert(c);
                }
            }
        }
    }
    let ascii = (0u8..128).filter(|&b| ascii[b as usize]).map(char::from);
    Ok(CharTokenizer::from_chars(ascii.chain(seen)))
}

/// Token ids `[B, T]` as an integer tensor on `device`.
pub fn ids_tensor(ids: &[u32], shape: [usize; 2], device: &Device) -> Tensor<2, Int> {
    let data: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    Tensor::from_data(TensorData::new(data, shape), device)
}

/// Inputs and targets of a batch, `[B, T]` each.
pub fn batch_tensors(batch: &Batch, device: &Device) -> (Tensor<2, Int>, Tensor<2, Int>) {
    let shape = [batch.batch_size, batch.block_size];
    (
        ids_tensor(&batch.inputs, shape, device),
        ids_tensor(&batch.targets, shape, device),
    )
}
