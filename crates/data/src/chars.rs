//! The character tokenizer: the vocabulary is the sorted set of characters of the training text,
//! and a character's id is its position in that set.

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

/// Text that the vocabulary cannot encode.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the vocabulary has no {}: {}", plural(.0.len()), list(.0))]
pub struct TokenizerError(
    /// The unknown characters, each once, in order of first appearance.
    pub Vec<char>,
);

fn plural(n: usize) -> &'static str {
    if n == 1 { "character" } else { "characters" }
}

fn list(chars: &[char]) -> String {
    chars
        .iter()
        .map(|c| format!("{c:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A character-level vocabulary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<char>", into = "Vec<char>")]
pub struct CharTokenizer {
    chars: Vec<char>,
    #[serde(skip)]
    ascii: [Option<u32>; 128],
    #[serde(skip)]
    ids: HashMap<char, u32>,
}

impl CharTokenizer {
    /// The vocabulary of the given characters.
    pub fn from_chars(chars: impl IntoIterator<Item = char>) -> Self {
        // ASCII through a table: a corpus of gigabytes is mostly ASCII.
        let mut ascii = [false; 128];
        let mut other = BTreeSet::new();
        for c in chars {
            match ascii.get_mut(c as usize) {
                Some(seen) => *seen = true,
                None => {
                    other.insert(c);
                }
            }
        }
        let ascii = (0u8..128).filter(|&b| ascii[b as usize]).map(char::from);
        Self::from_sorted(ascii.chain(other).collect())
    }

    fn from_sorted(chars: Vec<char>) -> Self {
        let mut ascii = [None; 128];
        let mut ids = HashMap::new();
        for (i, &c) in chars.iter().enumerate() {
            match ascii.get_mut(c as usize) {
                Some(slot) => *slot = Some(i as u32),
                None => {
                    ids.insert(c, i as u32);
                }
            }
        }
        Self { chars, ascii, ids }
    }

    /// Number of distinct characters.
    pub fn vocab_size(&self) -> usize {
        self.chars.len()
    }

    /// The characters, sorted; a character's id is its index here.
    pub fn chars(&self) -> &[char] {
        &self.chars
    }

    /// The id of one character, if it is in the vocabulary.
    pub fn id(&self, c: char) -> Option<u32> {
        match self.ascii.get(c as usize) {
            Some(&id) => id,
            None => self.ids.get(&c).copied(),
        }
    }

    /// Ids of every character, or an error listing the characters the vocabulary lacks.
    pub fn encode(
        &self,
        chars: impl IntoIterator<Item = char>,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        self.encode_into(chars, &mut ids)?;
        Ok(ids)
    }

    /// [`encode`](Self::encode), appending to `ids`: with their capacity reserved beforehand, a
    /// text of gigabytes is encoded without the transient second copy a growing vector makes.
    /// On error `ids` is left as it was.
    pub fn encode_into(
        &self,
        chars: impl IntoIterator<Item = char>,
        ids: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        let before = ids.len();
        let mut unknown = Vec::new();
        for c in chars {
            match self.id(c) {
                Some(id) => ids.push(id),
                None if !unknown.contains(&c) => unknown.push(c),
                None => {}
            }
        }
        if unknown.is_empty() {
            Ok(())
        } else {
            ids.truncate(before);
            Err(TokenizerError(unknown))
        }
    }

    /// The characters with the given ids. Panics on an id outside the vocabulary (a model's
    /// output never is).
    pub fn decode(&self, ids: &[u32]) -> String {
        ids.iter().map(|&i| self.chars[i as usize]).collect()
    }
}

impl TryFrom<Vec<char>> for CharTokenizer {
    type Error = String;

    fn try_from(chars: Vec<char>) -> Result<Self, Self::Error> {
        if chars.windows(2).any(|w| w[0] >= w[1]) {
            return Err("the vocabulary must be sorted characters without repeats".into());
        }
        Ok(Self::from_sorted(chars))
    }
}

impl From<CharTokenizer> for Vec<char> {
    fn from(t: CharTokenizer) -> Self {
        t.chars
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_is_sorted_unique_characters_not_bytes() {
        let t = CharTokenizer::from_chars("héllo wörld".chars());
        assert_eq!(t.chars(), &[' ', 'd', 'h', 'l', 'o', 'r', 'w', 'é', 'ö']);
        assert_eq!(t.id('é'), Some(7));
    }

    #[test]
    fn round_trip() {
        let text = "To be, or not to be: that is the question.\n";
        let t = CharTokenizer::from_chars(text.chars());
        let ids = t.encode(text.chars()).unwrap();
        assert_eq!(ids.len(), text.chars().count());
        assert_eq!(t.decode(&ids), text);
    }

    #[test]
    fn encoding_into_a_sized_vector_never_regrows_it() {
        let text = "abcab".repeat(1000);
        let t = CharTokenizer::from_chars(text.chars());
        let mut ids = Vec::with_capacity(text.chars().count());
        let before = ids.as_ptr();
        t.encode_into(text.chars(), &mut ids).unwrap();
        assert_eq!((ids.len(), ids.capacity()), (5000, 5000));
        assert_eq!(ids.as_ptr(), before, "no reallocation: one copy of the ids");
    }

    #[test]
    fn unknown_characters_are_named_once_each() {
        let t = CharTokenizer::from_chars("abc".chars());
        let err = t.encode("abzxz".chars()).unwrap_err();
        assert_eq!(err.0, vec!['z', 'x']);
        assert_eq!(
            err.to_string(),
            "the vocabulary has no characters: 'z', 'x'"
        );
    }

    #[test]
    fn a_failed_encoding_leaves_the_vector_as_it_was() {
        let t = CharTokenizer::from_chars("abc".chars());
        let mut ids = vec![7];
        t.encode_into("abzc".chars(), &mut ids).unwrap_err();
        assert_eq!(ids, vec![7]);
    }

    #[test]
    fn serde_round_trip_and_rejects_unsorted() {
        let t = CharTokenizer::from_chars("hello".chars());
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, r#"["e","h","l","o"]"#);
        let back: CharTokenizer = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.id('o'), Some(3));
        assert!(serde_json::from_str::<CharTokenizer>(r#"["b","a"]"#).is_err());
    }
}
