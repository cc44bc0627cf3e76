//! The texts a run reads: one file, several, or a folder of `.txt` files, taken as one sequence
//! of documents, and walked in pieces of normalised text so that no text is ever held whole.

use std::path::{Path, PathBuf};

use crate::corpus::{Corpus, CorpusError, normalized_chars};
use crate::identity::{IdentityHasher, TextIdentity};

/// Why the inputs could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    #[error("folder {} has no .txt files: put the texts to train on in it, or name files", .0.display())]
    EmptyFolder(PathBuf),
    #[error("cannot list folder {}: {source}", path.display())]
    List {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A piece of the documents' text, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Normalised text, cut only after a newline that a non-space character follows, so that
    /// a byte-level BPE encodes the pieces exactly as it would the whole text.
    Text(String),
    /// The boundary between two documents.
    Break,
}

/// Text pieces hold about this many bytes.
const PIECE_BYTES: usize = 1 << 20;

/// The documents of a run, memory-mapped.
pub struct Sources {
    docs: Vec<(PathBuf, Corpus)>,
}

impl Sources {
    /// Opens each path: a text file, or a folder whose `.txt` files (by name) are documents.
    pub fn open(paths: &[PathBuf]) -> Result<Self, SourceError> {
        let mut docs = Vec::new();
        for path in paths {
            if path.is_dir() {
                let list = |source| SourceError::List {
                    path: path.clone(),
                    source,
                };
                let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                    .map_err(list)?
                    .map(|e| e.map(|e| e.path()))
                    .collect::<Result<_, _>>()
                    .map_err(list)?;
                files.retain(|f| f.is_file() && f.extension().is_some_and(|e| e == "txt"));
                files.sort();
                if files.is_empty() {
                    return Err(SourceError::EmptyFolder(path.clone()));
                }
                for file in files {
                    let corpus = Corpus::open(&file)?;
                    docs.push((file, corpus));
                }
            } else {
                docs.push((path.clone(), Corpus::open(path)?));
            }
        }
        Ok(Self { docs })
    }

    /// The documents' files, in order.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.docs.iter().map(|(p, _)| p.as_path())
    }

    /// Each document's size and checksum.
    pub fn identities(&self) -> Vec<(PathBuf, TextIdentity)> {
        self.docs
            .iter()
            .map(|(p, c)| (p.clone(), c.identity()))
            .collect()
    }

    /// One identity for all the documents: the document's own when there is one, else the
    /// total size and a checksum of the documents' checksums in order.
    pub fn identity(&self) -> TextIdentity {
        if let [(_, doc)] = self.docs.as_slice() {
            return doc.identity();
        }
        let mut h = IdentityHasher::default();
        let mut bytes = 0;
        for (_, doc) in &self.docs {
            let id = doc.identity();
            bytes += id.bytes;
            h.update(&id.bytes.to_le_bytes());
            h.update(&id.xxh3.to_le_bytes());
        }
        TextIdentity {
            bytes,
            ..h.finish()
        }
    }

    /// The documents' normalised text in pieces, in order, with a [`Piece::Break`] between
    /// documents. An error (a file changed while read) ends the pieces.
    pub fn pieces(&self) -> impl Iterator<Item = Result<Piece, CorpusError>> + Send + '_ {
        let mut docs = self.docs.iter().enumerate();
        let mut chars: Option<std::iter::Peekable<Box<dyn Iterator<Item = char> + Send + '_>>> =
            None;
        let mut pending_break = false;
        let mut failed = false;
        std::iter::from_fn(move || {
            if failed {
                return None;
            }
            loop {
                if pending_break {
                    pending_break = false;
                    return Some(Ok(Piece::Break));
                }
                let Some(current) = chars.as_mut() else {
                    let (i, (_, doc)) = docs.next()?;
                    match doc.text() {
                        Ok(text) => {
                            let it: Box<dyn Iterator<Item = char> + Send + '_> =
                                Box::new(normalized_chars(text));
                            chars = Some(it.peekable());
                            if i > 0 {
                                pending_break = true;
                            }
                            continue;
                        }
                        Err(e) => {
                            failed = true;
                            return Some(Err(e));
                        }
                    }
                };
                let mut buf = String::with_capacity(PIECE_BYTES + 4096);
                while let Some(c) = current.next() {
                    buf.push(c);
                    let at_boundary =
                        c == '\n' && current.peek().is_some_and(|next| !next.is_whitespace());
                    if buf.len() >= PIECE_BYTES && at_boundary {
                        return Some(Ok(Piece::Text(buf)));
                    }
                }
                chars = None;
                if !buf.is_empty() {
                    return Some(Ok(Piece::Text(buf)));
                }
            }
        })
    }
}

/// Routes pieces to the training part until `cut` characters (breaks counting `break_chars`
/// each) have passed, and to the validation part after: the split is made on the text, before
/// encoding, so that a tokenizer never sees the two parts joined.
pub struct Cut {
    pub cut: u64,
    pub break_chars: u64,
    seen: u64,
}

impl Cut {
    pub fn new(total_chars: u64, train_fraction: f64, break_chars: u64) -> Self {
        Self {
            cut: (total_chars as f64 * train_fraction) as u64,
            break_chars,
            seen: 0,
        }
    }

    /// Splits `piece` at the cut: `(train part, val part)`, either possibly absent.
    pub fn route(&mut self, piece: Piece) -> (Option<Piece>, Option<Piece>) {
        match piece {
            Piece::Break => {
                let train = self.seen < self.cut;
                self.seen += self.break_chars;
                if train {
                    (Some(piece), None)
                } else {
                    (None, Some(piece))
                }
            }
            Piece::Text(mut text) => {
                let start = self.seen;
                let n = text.chars().count() as u64;
                self.seen += n;
                if self.seen <= self.cut {
                    (Some(Piece::Text(text)), None)
                } else if start >= self.cut {
                    (None, Some(Piece::Text(text)))
                } else {
                    let at = text
                        .char_indices()
                        .nth((self.cut - start) as usize)
                        .map_or(text.len(), |(i, _)| i);
                    let val = text.split_off(at);
                    (Some(Piece::Text(text)), Some(Piece::Text(val)))
                }
            }
        }
    }
}

/// Characters of the documents' normalised text, breaks counting `break_chars` each.
pub fn count_chars(sources: &Sources, break_chars: u64) -> Result<u64, CorpusError> {
    let mut n = 0u64;
    for piece in sources.pieces() {
        n += match piece? {
            Piece::Text(t) => t.chars().count() as u64,
            Piece::Break => break_chars,
        };
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn pieces(sources: &Sources) -> Vec<String> {
        sources
            .pieces()
            .map(|p| match p.unwrap() {
                Piece::Text(t) => t,
                Piece::Break => "|".into(),
            })
            .collect()
    }

    #[test]
    fn a_folder_is_its_txt_files_by_name_with_breaks_between() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "b.txt", "second\r\n");
        write(dir.path(), "a.txt", "first");
        write(dir.path(), "notes.md", "not a document");
        let sources = Sources::open(&[dir.path().to_path_buf()]).unwrap();
        assert_eq!(pieces(&sources), ["first", "|", "second\n"]);
        assert_eq!(count_chars(&sources, 2).unwrap(), 5 + 2 + 7);
        let empty = tempfile::tempdir().unwrap();
        let err = Sources::open(&[empty.path().to_path_buf()]).err().unwrap();
        assert!(err.to_string().contains("has no .txt files"), "{err}");
    }

    #[test]
    fn one_file_keeps_its_own_identity_several_combine() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(dir.path(), "a.txt", "first");
        let b = write(dir.path(), "b.txt", "second");
        let one = Sources::open(std::slice::from_ref(&a)).unwrap();
        assert_eq!(one.identity(), TextIdentity::of(b"first"));
        let ab = Sources::open(&[a.clone(), b.clone()]).unwrap().identity();
        let ba = Sources::open(&[b, a]).unwrap().identity();
        assert_eq!(ab.bytes, 11);
        assert_ne!(ab, ba, "the order of documents is part of the identity");
    }

    #[test]
    fn the_cut_splits_a_piece_at_a_character_boundary() {
        let text = |s: &str| Piece::Text(s.to_string());
        let mut cut = Cut::new(10, 0.5, 2);
        assert_eq!(cut.route(text("ab")), (Some(text("ab")), None));
        assert_eq!(
            cut.route(text("cé€fg")),
            (Some(text("cé€")), Some(text("fg")))
        );
        assert_eq!(cut.route(Piece::Break), (None, Some(Piece::Break)));
    }
}
