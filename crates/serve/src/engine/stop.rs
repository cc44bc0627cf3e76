//! Stop strings in a growing text: a choice's text is emitted as soon as it cannot be the start
//! of one, and ends where the first one met begins.

/// Finds stop strings in a growing text, holding back the end that may begin one.
#[derive(Debug)]
pub(super) struct StopMatcher {
    stop: Vec<String>,
    held: String,
}

impl StopMatcher {
    pub(super) fn new(stop: &[String]) -> Self {
        Self {
            stop: stop.to_vec(),
            held: String::new(),
        }
    }

    /// Adds `piece`; returns the text now safe to emit, and whether a stop string was met (the
    /// text then ends where it begins, and nothing after it is ever emitted).
    pub(super) fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        let first_stop = self
            .stop
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
            let text = self.held[..at].to_string();
            self.held.clear();
            return (text, true);
        }
        // The longest end of the text that some stop string starts with stays held.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stop.iter().any(|s| s.starts_with(&self.held[i..])))
            .unwrap_or(self.held.len());
        let text = self.held[..keep].to_string();
        self.held.drain(..keep);
        (text, false)
    }

    /// What is held back, when the text ends without a stop string.
    pub(super) fn release(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    /// Feeds `pieces` and returns what was emitted and whether it stopped.
    fn run(stop: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let stop: Vec<String> = stop.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stop);
        let mut out = Vec::new();
        for piece in pieces {
            let (text, stopped) = m.push(piece);
            out.push(text);
            if stopped {
                return (out, true);
            }
        }
        out.push(m.release());
        (out, false)
    }

    #[test]
    fn a_stop_string_split_across_pieces_is_held_back_and_cut() {
        let (out, stopped) = run(&["\n\n"], &["Hello", "\n", "\nWorld"]);
        assert_eq!(out, ["Hello", "", ""]);
        assert!(stopped);
    }

    #[test]
    fn a_false_start_is_released_as_soon_as_it_is_known() {
        let (out, stopped) = run(&["END"], &["the E", "N", "d", " is near"]);
        assert_eq!(out, ["the ", "", "ENd", " is near", ""]);
        assert!(!stopped);
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins() {
        let (out, stopped) = run(&["b", "a"], &["xxab"]);
        assert_eq!(out, ["xx"]);
        assert!(stopped);
    }

    #[test]
    fn text_held_at_the_end_is_released() {
        let (out, stopped) = run(&["stop"], &["a st", "o"]);
        assert_eq!(out, ["a ", "", "sto"]);
        assert!(!stopped);
    }

    #[test]
    fn multi_byte_characters_are_never_split() {
        let (out, _) = run(&["é!"], &["café", " olé"]);
        assert_eq!(out.concat(), "café olé");
    }
}
