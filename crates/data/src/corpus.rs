//! Reading a training text from disk.
//!
//! The file is memory-mapped, so a corpus of gigabytes is never copied into memory as text: only
//! its token ids are held. Text must be UTF-8; a leading byte-order mark is skipped and Windows
//! line endings (`\r\n`) are read as `\n`, so the same text trains the same model either way.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::identity::TextIdentity;

const BOM: &str = "\u{feff}";

/// Why a text file could not be used as a corpus.
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error("text file {} does not exist", .0.display())]
    NotFound(PathBuf),
    #[error("{} is a folder, not a text file", .0.display())]
    IsDirectory(PathBuf),
    #[error("cannot read text file {}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("text file {} is empty: give a file with some text in it", .0.display())]
    Empty(PathBuf),
    #[error(
        "{} is not valid UTF-8: the byte at offset {offset} (0x{byte:02x}) does not start a \
         character. Convert the file first, for example: iconv -f latin1 -t utf-8 {} > converted.txt",
        path.display(),
        path.display()
    )]
    NotUtf8 {
        path: PathBuf,
        offset: usize,
        byte: u8,
    },
    #[error(
        "text file {} changed while it was being read (it is no longer the UTF-8 text it was \
         when opened): wait until whatever writes it has finished, then run again",
        .0.display()
    )]
    ChangedWhileRead(PathBuf),
}

/// A text file, memory-mapped and checked to be non-empty UTF-8.
pub struct Corpus {
    path: PathBuf,
    map: Mmap,
    identity: TextIdentity,
}

impl Corpus {
    /// Opens and checks `path`.
    pub fn open(path: &Path) -> Result<Self, CorpusError> {
        let unreadable = |source| CorpusError::Unreadable {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => CorpusError::NotFound(path.to_path_buf()),
            _ => unreadable(e),
        })?;
        if meta.is_dir() {
            return Err(CorpusError::IsDirectory(path.to_path_buf()));
        }
        let file = File::open(path).map_err(unreadable)?;
        if meta.len() == 0 {
            return Err(CorpusError::Empty(path.to_path_buf()));
        }
        // SAFETY: the map is read-only; a file truncated by another process while we train is the
        // same hazard every memory-mapped reader accepts.
        let map = unsafe { Mmap::map(&file) }.map_err(unreadable)?;
        if let Err(e) = std::str::from_utf8(&map) {
            let offset = e.valid_up_to();
            return Err(CorpusError::NotUtf8 {
                path: path.to_path_buf(),
                offset,
                byte: map[offset],
            });
        }
        let identity = TextIdentity::of(&map);
        let corpus = Self {
            path: path.to_path_buf(),
            map,
            identity,
        };
        if corpus.text()?.is_empty() {
            return Err(CorpusError::Empty(path.to_path_buf()));
        }
        Ok(corpus)
    }

    /// The size and checksum of the file's bytes when it was opened.
    pub fn identity(&self) -> TextIdentity {
        self.identity
    }

    /// The whole text, as stored (byte-order mark removed). The file was checked to be UTF-8 when
    /// opened, but the map shows later writes by other programs: checked again here, an error
    /// rather than a wrong text.
    pub fn text(&self) -> Result<&str, CorpusError> {
        let text = std::str::from_utf8(&self.map)
            .map_err(|_| CorpusError::ChangedWhileRead(self.path.clone()))?;
        Ok(text.strip_prefix(BOM).unwrap_or(text))
    }

    /// The characters the model sees: the text with `\r\n` read as `\n`.
    pub fn chars(&self) -> Result<impl Iterator<Item = char> + '_, CorpusError> {
        Ok(normalized_chars(self.text()?))
    }
}

/// The characters of `text` as the model sees them: a leading byte-order mark dropped and every
/// `\r\n` read as `\n` (a lone `\r` stays).
pub fn normalized_chars(text: &str) -> impl Iterator<Item = char> + '_ {
    let text = text.strip_prefix(BOM).unwrap_or(text);
    let mut chars = text.chars().peekable();
    std::iter::from_fn(move || {
        let c = chars.next()?;
        if c == '\r' && chars.peek() == Some(&'\n') {
            chars.next()
        } else {
            Some(c)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("text.txt");
        File::create(&path).unwrap().write_all(bytes).unwrap();
        (dir, path)
    }

    #[test]
    fn crlf_and_bom_read_like_plain_text() {
        let (_d, path) = file_with("\u{feff}a\r\nb\rc\r\n".as_bytes());
        let corpus = Corpus::open(&path).unwrap();
        assert_eq!(corpus.chars().unwrap().collect::<String>(), "a\nb\rc\n");
    }

    #[test]
    fn identity_is_of_the_bytes_as_stored() {
        let bytes = "\u{feff}a\r\nb".as_bytes();
        let (_d, path) = file_with(bytes);
        let corpus = Corpus::open(&path).unwrap();
        assert_eq!(corpus.identity(), TextIdentity::of(bytes));
    }

    #[test]
    fn a_text_changed_under_the_map_is_an_error_not_an_empty_text() {
        let (_d, path) = file_with(b"hello world");
        let corpus = Corpus::open(&path).unwrap();
        // Another program overwrites the file in place (same inode): the map shows it.
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all(b"\xff\xfe").unwrap();
        f.sync_all().unwrap();
        let err = corpus.text().unwrap_err();
        assert!(matches!(err, CorpusError::ChangedWhileRead(_)), "{err}");
        assert!(err.to_string().contains("text.txt"), "{err}");
        assert!(corpus.chars().is_err());
    }

    #[test]
    fn latin1_names_the_byte_offset() {
        let (_d, path) = file_with(b"caf\xe9 au lait");
        let err = Corpus::open(&path).err().unwrap().to_string();
        assert!(err.contains("offset 3"), "{err}");
        assert!(err.contains("iconv"), "{err}");
    }

    #[test]
    fn empty_missing_and_folder_are_refused() {
        let (d, path) = file_with(b"");
        assert!(matches!(Corpus::open(&path), Err(CorpusError::Empty(_))));
        let (_e, bom_only) = file_with("\u{feff}".as_bytes());
        assert!(matches!(
            Corpus::open(&bom_only),
            Err(CorpusError::Empty(_))
        ));
        assert!(matches!(
            Corpus::open(d.path()),
            Err(CorpusError::IsDirectory(_))
        ));
        let missing = d.path().join("nope.txt");
        let err = Corpus::open(&missing).err().unwrap();
        assert!(err.to_string().contains("nope.txt"), "{err}");
    }
}
