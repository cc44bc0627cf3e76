//! A prepared dataset: texts encoded once, streaming, into token files that training
//! memory-maps, so that neither the text nor its ids are ever held whole in memory.
//!
//! The folder holds `train.bin` and `val.bin` (little-endian token ids, 16-bit when the
//! vocabulary fits, else 32-bit), the tokenizer (`tokenizer.json` for BPE; a character
//! vocabulary is inline in the meta file) and `meta.json`: the tokenizer record, the id width,
//! the token and byte counts of each split (bytes of normalised UTF-8 text, for bits per byte)
//! and the identity of each source text.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bpe::BpeTokenizer;
use crate::corpus::CorpusError;
use crate::identity::TextIdentity;
use crate::source::{Cut, Piece, Sources, count_chars};
use crate::split::{Split, SplitError, Splits, Store};
use crate::tokenizer::{DocumentBreak, EncodeError, Tokenizer, TokenizerRecord};

pub const META: &str = "meta.json";
pub const TRAIN_BIN: &str = "train.bin";
pub const VAL_BIN: &str = "val.bin";
/// The layout written; read up to this version.
pub const FORMAT_VERSION: u32 = 1;

/// One source text of a prepared dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceRecord {
    pub path: PathBuf,
    #[serde(flatten)]
    pub identity: TextIdentity,
}

/// The counts of one split.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SplitCounts {
    pub tokens: u64,
    /// Bytes of normalised UTF-8 text the tokens encode.
    pub bytes: u64,
}

/// `meta.json` of a prepared dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreparedMeta {
    pub format_version: u32,
    pub tokenizer: TokenizerRecord,
    /// Bytes per token id in the `.bin` files: 2 or 4.
    pub token_bytes: u8,
    pub train_fraction: f64,
    pub train: SplitCounts,
    pub val: SplitCounts,
    /// The identity of all the sources together (as a checkpoint records it).
    pub identity: TextIdentity,
    pub sources: Vec<SourceRecord>,
}

impl PreparedMeta {
    pub fn counts(&self, split: Split) -> SplitCounts {
        match split {
            Split::Train => self.train,
            Split::Val => self.val,
        }
    }
}

/// Why a dataset could not be prepared or opened.
#[derive(Debug, thiserror::Error)]
pub enum PreparedError {
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} already holds a prepared dataset: choose another --out, or move it away first",
        .0.display()
    )]
    Exists(PathBuf),
    #[error(
        "{} exists, and prepare never replaces a file: choose another --out, or move it away \
         first",
        .0.display()
    )]
    WouldReplace(PathBuf),
    #[error("{} is not a prepared dataset: it has no {META} (make one with `prepare`)", .0.display())]
    NotPrepared(PathBuf),
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("prepared dataset {}: {reason}", dir.display())]
    Damaged { dir: PathBuf, reason: String },
    #[error(transparent)]
    Split(#[from] SplitError),
}

/// Trains a byte-level BPE of `vocab_size` tokens on the training part of `sources` (the text
/// before the cut after `train_fraction` of its characters), streaming.
pub fn train_bpe(
    sources: &Sources,
    train_fraction: f64,
    vocab_size: usize,
) -> Result<BpeTokenizer, PreparedError> {
    let total = count_chars(sources, 0)?;
    let mut cut = Cut::new(total, train_fraction, 0);
    let failed = std::sync::Mutex::new(None);
    let texts = sources.pieces().map_while(|piece| match piece {
        Ok(piece) => match cut.route(piece) {
            (Some(Piece::Text(t)), _) => Some(t),
            _ => Some(String::new()),
        },
        Err(e) => {
            *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
            None
        }
    });
    let bpe = BpeTokenizer::train(texts, vocab_size).map_err(EncodeError::from)?;
    if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e.into());
    }
    Ok(bpe)
}

/// Bytes per id for a vocabulary of `vocab_size` tokens.
pub fn token_bytes(vocab_size: usize) -> u8 {
    if vocab_size <= 1 << 16 { 2 } else { 4 }
}

/// Refuses `out` where it holds a prepared dataset, or a file [`prepare`] would write (the token
/// files, and the tokenizer's file `tokenizer_file`): a user's own files of these names (a
/// nanoGPT data folder's train.bin, say) stay as they are.
pub fn check_new(out: &Path, tokenizer_file: Option<&str>) -> Result<(), PreparedError> {
    if out.join(META).exists() {
        return Err(PreparedError::Exists(out.to_path_buf()));
    }
    for name in [TRAIN_BIN, VAL_BIN].into_iter().chain(tokenizer_file) {
        let path = out.join(name);
        if path.symlink_metadata().is_ok() {
            return Err(PreparedError::WouldReplace(path));
        }
    }
    Ok(())
}

/// Encodes `sources` with `tokenizer` into the folder `out` (created; refused if it holds a
/// prepared dataset), cutting the normalised text after `train_fraction` of its characters.
/// `progress(done, total)` is called with characters as they are encoded.
pub fn prepare(
    sources: &Sources,
    tokenizer: &Tokenizer,
    train_fraction: f64,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<PreparedMeta, PreparedError> {
    let record = tokenizer.record();
    check_new(out, record.file())?;
    let write_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PreparedError::Write { path, source }
    };
    std::fs::create_dir_all(out).map_err(write_err(out))?;
    let brk = tokenizer.document_break();
    let break_chars = match brk {
        DocumentBreak::Text(t) => t.chars().count() as u64,
        DocumentBreak::Token(_) => 0,
    };
    let total = count_chars(sources, break_chars)?;
    let width = token_bytes(tokenizer.vocab_size());
    let mut files = Vec::new();
    for name in [TRAIN_BIN, VAL_BIN] {
        let tmp = out.join(format!(".{name}.tmp"));
        let file = File::create(&tmp).map_err(write_err(&tmp))?;
        files.push((tmp, BufWriter::with_capacity(1 << 20, file)));
    }
    let mut counts = [SplitCounts::default(); 2];
    let mut cut = Cut::new(total, train_fraction, break_chars);
    let mut ids = Vec::new();
    let mut done = 0u64;
    for piece in sources.pieces() {
        let piece = piece?;
        if let Piece::Text(t) = &piece {
            done += t.chars().count() as u64;
        }
        let (train, val) = cut.route(piece);
        for (i, part) in [train, val].into_iter().enumerate() {
            let Some(part) = part else { continue };
            ids.clear();
            match (part, brk) {
                (Piece::Text(t), _) => {
                    tokenizer.encode_into(&t, &mut ids)?;
                    counts[i].bytes += t.len() as u64;
                }
                (Piece::Break, DocumentBreak::Token(id)) => ids.push(id),
                (Piece::Break, DocumentBreak::Text(t)) => {
                    tokenizer.encode_into(t, &mut ids)?;
                    counts[i].bytes += t.len() as u64;
                }
            }
            counts[i].tokens += ids.len() as u64;
            let (path, w) = &mut files[i];
            write_ids(w, &ids, width).map_err(write_err(path))?;
        }
        progress(done, total);
    }
    for ((tmp, w), name) in files.into_iter().zip([TRAIN_BIN, VAL_BIN]) {
        let file = w.into_inner().map_err(|e| PreparedError::Write {
            path: tmp.clone(),
            source: e.into_error(),
        })?;
        file.sync_all().map_err(write_err(&tmp))?;
        std::fs::rename(&tmp, out.join(name)).map_err(write_err(&tmp))?;
    }
    if let (Some(name), Some(json)) = (record.file(), tokenizer.file_json()) {
        std::fs::write(out.join(name), json).map_err(write_err(&out.join(name)))?;
    }
    let meta = PreparedMeta {
        format_version: FORMAT_VERSION,
        tokenizer: record,
        token_bytes: width,
        train_fraction,
        train: counts[0],
        val: counts[1],
        identity: sources.identity(),
        sources: sources
            .identities()
            .into_iter()
            .map(|(path, identity)| SourceRecord { path, identity })
            .collect(),
    };
    let json = serde_json::to_vec_pretty(&meta).expect("metadata serialises");
    // Written last: a folder without it is not a dataset, whatever else it holds.
    std::fs::write(out.join(META), json).map_err(write_err(&out.join(META)))?;
    Ok(meta)
}

fn write_ids(w: &mut impl Write, ids: &[u32], width: u8) -> std::io::Result<()> {
    for &id in ids {
        if width == 2 {
            w.write_all(&(id as u16).to_le_bytes())?;
        } else {
            w.write_all(&id.to_le_bytes())?;
        }
    }
    Ok(())
}

/// Whether `dir` is a prepared dataset.
pub fn is_prepared(dir: &Path) -> bool {
    dir.join(META).is_file()
}

/// A prepared dataset, opened: its metadata, tokenizer and memory-mapped splits.
pub struct Prepared {
    pub dir: PathBuf,
    pub meta: PreparedMeta,
    pub tokenizer: Tokenizer,
    pub splits: Splits,
}

impl Prepared {
    /// Opens `dir`, checking the token files against the metadata; each split must hold one
    /// window of `block_size + 1` tokens.
    pub fn open(dir: &Path, block_size: usize) -> Result<Self, PreparedError> {
        let damaged = |reason: String| PreparedError::Damaged {
            dir: dir.to_path_buf(),
            reason,
        };
        let meta_path = dir.join(META);
        if !meta_path.is_file() {
            return Err(PreparedError::NotPrepared(dir.to_path_buf()));
        }
        let read = |path: &Path| {
            let path = path.to_path_buf();
            move |source| PreparedError::Read { path, source }
        };
        let bytes = std::fs::read(&meta_path).map_err(read(&meta_path))?;
        let meta: PreparedMeta = serde_json::from_slice(&bytes)
            .map_err(|e| damaged(format!("{META} is not valid ({e})")))?;
        if meta.format_version > FORMAT_VERSION {
            return Err(damaged(format!(
                "format version {} is newer than this cinder reads ({FORMAT_VERSION}): upgrade cinder",
                meta.format_version
            )));
        }
        let tokenizer = meta.tokenizer.load_from(dir).map_err(damaged)?;
        let vocab = tokenizer.vocab_size();
        let width = meta.token_bytes;
        if width != 2 && width != 4 {
            return Err(damaged(format!(
                "token_bytes is {width}, but must be 2 or 4"
            )));
        }
        if width == 2 && vocab > 1 << 16 {
            return Err(damaged(format!(
                "its tokenizer has {vocab} tokens, more than 16-bit ids can hold"
            )));
        }
        let mut stores = Vec::new();
        for (name, counts) in [(TRAIN_BIN, meta.train), (VAL_BIN, meta.val)] {
            let path = dir.join(name);
            let file = File::open(&path).map_err(read(&path))?;
            let len = file.metadata().map_err(read(&path))?.len();
            if len != counts.tokens * u64::from(width) {
                return Err(damaged(format!(
                    "{name} has {len} bytes, but {} tokens of {width} bytes are recorded \
                     (truncated or from another preparation?): prepare it again",
                    counts.tokens
                )));
            }
            // SAFETY: the map is read-only; a file changed by another process while we train is
            // the hazard every memory-mapped reader accepts. Ids are checked below.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(read(&path))?;
            let store = if width == 2 {
                Store::Mapped16(map)
            } else {
                Store::Mapped32(map)
            };
            stores.push(store);
        }
        let val = stores.pop().expect("two stores");
        let train = stores.pop().expect("two stores");
        let splits = Splits::from_parts(train, val, block_size)?;
        for split in [Split::Train, Split::Val] {
            if let Some(bad) = max_id(splits.get(split)).filter(|&m| m as usize >= vocab) {
                return Err(damaged(format!(
                    "its {} tokens hold id {bad}, but the tokenizer has {vocab} tokens: the \
                     token files and the tokenizer do not belong together; prepare it again",
                    split.name()
                )));
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            meta,
            tokenizer,
            splits,
        })
    }
}

/// The largest id, or `None` for no ids.
fn max_id(ids: crate::split::Ids<'_>) -> Option<u32> {
    match ids {
        crate::split::Ids::U16(ids) => ids.iter().max().map(|&m| u32::from(m)),
        crate::split::Ids::U32(ids) => ids.iter().max().copied(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batcher::Batcher;
    use crate::chars::CharTokenizer;

    const TEXT: &str =
        "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n";

    fn texts(dir: &Path) -> Sources {
        let a = dir.join("a.txt");
        let b = dir.join("b.txt");
        std::fs::write(&a, TEXT.repeat(30)).unwrap();
        std::fs::write(&b, "Ünïcödé 🦀 text\r\n".repeat(20)).unwrap();
        Sources::open(&[a, b]).unwrap()
    }

    fn chars_of(sources: &Sources) -> Tokenizer {
        let mut all = String::from("\n");
        for piece in sources.pieces() {
            if let Piece::Text(t) = piece.unwrap() {
                all.push_str(&t);
            }
        }
        Tokenizer::Char(CharTokenizer::from_chars(all.chars()))
    }

    #[test]
    fn a_prepared_folder_gives_the_batches_of_in_memory_encoding() {
        let dir = tempfile::tempdir().unwrap();
        let sources = texts(dir.path());
        let tokenizer = chars_of(&sources);
        // In memory: the documents joined with a blank line, encoded, cut after 90% of ids.
        let mut ids = Vec::new();
        for piece in sources.pieces() {
            match piece.unwrap() {
                Piece::Text(t) => tokenizer.encode_into(&t, &mut ids).unwrap(),
                Piece::Break => tokenizer.encode_into("\n\n", &mut ids).unwrap(),
            }
        }
        let memory = Splits::new(ids, 0.9, 16).unwrap();
        let out = dir.path().join("prepared");
        let meta = prepare(&sources, &tokenizer, 0.9, &out, &mut |_, _| {}).unwrap();
        assert_eq!(meta.token_bytes, 2);
        let prepared = Prepared::open(&out, 16).unwrap();
        assert_eq!(prepared.tokenizer, tokenizer);
        let batcher = Batcher::new(5, 4, 16);
        for split in [Split::Train, Split::Val] {
            assert_eq!(
                prepared.splits.get(split).to_vec(),
                memory.get(split).to_vec()
            );
            for i in 0..10 {
                assert_eq!(
                    batcher.batch(prepared.splits.get(split), split, 0, i),
                    batcher.batch(memory.get(split), split, 0, i)
                );
            }
        }
        let bytes = meta.train.bytes + meta.val.bytes;
        let text_bytes = (TEXT.len() * 30 + "Ünïcödé 🦀 text\n".len() * 20 + 2) as u64;
        assert_eq!(bytes, text_bytes);
        assert!(matches!(
            prepare(&sources, &tokenizer, 0.9, &out, &mut |_, _| {}),
            Err(PreparedError::Exists(_))
        ));
        // A folder without meta.json but with a file prepare would write (a nanoGPT data
        // folder's train.bin): refused, the file as it was.
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::write(theirs.join(VAL_BIN), "mine").unwrap();
        let refused = prepare(&sources, &tokenizer, 0.9, &theirs, &mut |_, _| {});
        assert!(
            matches!(&refused, Err(PreparedError::WouldReplace(p)) if p.ends_with(VAL_BIN)),
            "{refused:?}"
        );
        assert_eq!(
            std::fs::read_to_string(theirs.join(VAL_BIN)).unwrap(),
            "mine"
        );
        assert!(!theirs.join(TRAIN_BIN).exists());
    }

    #[test]
    fn bpe_splits_before_encoding_and_separates_documents_with_end_of_text() {
        let dir = tempfile::tempdir().unwrap();
        let sources = texts(dir.path());
        let bpe = BpeTokenizer::train(TEXT.lines(), 300).unwrap();
        let eot = bpe.end_of_text().unwrap();
        let tokenizer = Tokenizer::Bpe(bpe);
        let out = dir.path().join("bpe");
        let meta = prepare(&sources, &tokenizer, 0.5, &out, &mut |_, _| {}).unwrap();
        let prepared = Prepared::open(&out, 8).unwrap();
        let (train, val) = (
            prepared.splits.get(Split::Train).to_vec(),
            prepared.splits.get(Split::Val).to_vec(),
        );
        // The first document is more than half the text: the break falls in the validation part.
        assert!(!train.contains(&eot) && val.iter().filter(|&&i| i == eot).count() == 1);
        let decoded = tokenizer.decode(&train) + &tokenizer.decode(&val);
        let want = TEXT.repeat(30) + "<|endoftext|>" + &"Ünïcödé 🦀 text\n".repeat(20);
        assert_eq!(decoded, want);
        assert_eq!(meta.train.tokens as usize, train.len());
        assert!(out.join("tokenizer.json").is_file());
    }

    #[test]
    fn damaged_or_mismatched_folders_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let sources = texts(dir.path());
        let tokenizer = chars_of(&sources);
        let out = dir.path().join("p");
        prepare(&sources, &tokenizer, 0.9, &out, &mut |_, _| {}).unwrap();
        let err = |dir: &Path| Prepared::open(dir, 16).err().unwrap().to_string();

        // A truncated token file.
        let val = out.join(VAL_BIN);
        let good = std::fs::read(&val).unwrap();
        std::fs::write(&val, &good[..good.len() - 1]).unwrap();
        assert!(err(&out).contains("val.bin has"), "{}", err(&out));
        std::fs::write(&val, &good).unwrap();

        // Token files from another tokenizer: an id the vocabulary lacks.
        let meta_path = out.join(META);
        let meta_text = std::fs::read_to_string(&meta_path).unwrap();
        let mut meta: PreparedMeta = serde_json::from_str(&meta_text).unwrap();
        meta.tokenizer = TokenizerRecord::Chars(CharTokenizer::from_chars("ab".chars()));
        std::fs::write(&meta_path, serde_json::to_string(&meta).unwrap()).unwrap();
        assert!(
            err(&out).contains("do not belong together"),
            "{}",
            err(&out)
        );

        // A vocabulary too large for the 16-bit ids recorded.
        let big: String = (0x4E00u32..0x4E00 + 70_000)
            .filter_map(char::from_u32)
            .collect();
        meta.tokenizer = TokenizerRecord::Chars(CharTokenizer::from_chars(big.chars()));
        std::fs::write(&meta_path, serde_json::to_string(&meta).unwrap()).unwrap();
        assert!(err(&out).contains("more than 16-bit ids"), "{}", err(&out));

        // No meta file: not a dataset.
        std::fs::remove_file(&meta_path).unwrap();
        assert!(
            err(&out).contains("not a prepared dataset"),
            "{}",
            err(&out)
        );
    }
}
