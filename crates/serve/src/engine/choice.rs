//! One choice of a request: the text of its row's tokens, sent as it settles, held back while
//! it may be the start of a stop string, and each token's log-probabilities sent with the text
//! they belong to.

use std::collections::VecDeque;

use tokio::sync::mpsc::UnboundedSender;

use cinder_data::{TextStream, Tokenizer};

use super::job::{Event, Finish, TokenLogprob};
use super::stop::StopMatcher;

/// The client went away: its events have nowhere to go.
pub(super) struct Gone;

/// One choice being generated: its text decoded so far, held back from a stop string.
pub(super) struct Choice<'a> {
    index: usize,
    stream: TextStream<'a>,
    held: StopMatcher,
    finished: bool,
    /// Characters of the choice's text decoded, and sent (the echoed prompt's included).
    decoded: usize,
    sent: usize,
    /// Tokens whose text is not all sent yet, with where their text ends.
    waiting: VecDeque<(TokenLogprob, usize)>,
}

impl<'a> Choice<'a> {
    /// Choice `index` of its request (prompt by prompt, `n` each), ending at any of `stop`;
    /// its text so far is `echoed` characters long (the prompt, with `echo`).
    pub(super) fn new(
        index: usize,
        tokenizer: &'a Tokenizer,
        stop: &[String],
        echoed: usize,
    ) -> Self {
        Self {
            index,
            stream: TextStream::new(tokenizer),
            held: StopMatcher::new(stop),
            finished: false,
            decoded: echoed,
            sent: echoed,
            waiting: VecDeque::new(),
        }
    }

    /// Whether it met a stop string: its row's later tokens are not its text.
    pub(super) fn finished(&self) -> bool {
        self.finished
    }

    fn send(events: &UnboundedSender<Event>, event: Event) -> Result<(), Gone> {
        events.send(event).map_err(|_| Gone)
    }

    /// Sends `text` of choice `index` and the tokens whose text it completes, if there are any,
    /// as of the request's `written` tokens. With `stopped`, the tokens that begin in the text
    /// sent go, and the others (the stop string's) are dropped.
    fn send_text(
        &mut self,
        text: String,
        written: usize,
        stopped: bool,
        events: &UnboundedSender<Event>,
    ) -> Result<(), Gone> {
        self.sent += text.chars().count();
        let mut logprobs = Vec::new();
        while let Some((token, end)) = self.waiting.front() {
            // A token goes with the last of its text; one that holds only part of a character
            // (no text of its own) with that character. With a stop string met, the tokens
            // whose text starts before it go, and the rest are dropped with it.
            let goes = if stopped || *end == token.offset {
                token.offset < self.sent
            } else {
                *end <= self.sent
            };
            if !goes {
                break;
            }
            logprobs.push(self.waiting.pop_front().expect("the front is there").0);
        }
        if stopped {
            self.waiting.clear();
        }
        if text.is_empty() && logprobs.is_empty() {
            return Ok(());
        }
        let index = self.index;
        Self::send(
            events,
            Event::Text {
                index,
                text,
                written,
                logprobs,
            },
        )
    }

    /// Decodes `token`, the request's `written`th (with its log-probabilities, if asked for),
    /// and sends the text it settles.
    pub(super) fn push(
        &mut self,
        token: u32,
        logprob: Option<TokenLogprob>,
        written: usize,
        events: &UnboundedSender<Event>,
    ) -> Result<(), Gone> {
        let piece = self.stream.push(token);
        let start = self.decoded;
        self.decoded += piece.chars().count();
        if let Some(logprob) = logprob {
            self.waiting.push_back((
                TokenLogprob {
                    offset: start,
                    ..logprob
                },
                self.decoded,
            ));
        }
        let (text, stopped) = self.held.push(&piece);
        self.send_text(text, written, stopped, events)?;
        if stopped {
            self.finished = true;
            let (index, reason) = (self.index, Finish::Stop);
            Self::send(events, Event::Finished { index, reason })?;
        }
        Ok(())
    }

    /// Ends a choice that met no stop string: what was held back is text after all (`written`:
    /// the request's tokens).
    pub(super) fn finish(
        mut self,
        written: usize,
        events: &UnboundedSender<Event>,
    ) -> Result<(), Gone> {
        if self.finished {
            return Ok(());
        }
        let (mut text, stopped) = self.held.push(&self.stream.finish());
        if !stopped {
            // Every token's text goes with it.
            text.push_str(&self.held.release());
        }
        self.send_text(text, written, stopped, events)?;
        let index = self.index;
        let reason = if stopped {
            Finish::Stop
        } else {
            Finish::Length
        };
        Self::send(events, Event::Finished { index, reason })
    }
}

#[cfg(test)]
mod tests {
    use cinder::sampling::token_text;
    use cinder_data::bpe::BpeTokenizer;
    use tokio::sync::mpsc::unbounded_channel;

    use super::*;

    /// A byte-level BPE too small to merge "😀": its four bytes are four tokens.
    fn bpe() -> Tokenizer {
        let texts = ["the cat sat on the mat and the hat"; 4];
        Tokenizer::Bpe(BpeTokenizer::train(texts.iter(), 300).unwrap())
    }

    /// The text and tokens of each `Text` event of choice 0 fed `text`'s tokens, ending at
    /// `stop`.
    fn events(tokenizer: &Tokenizer, text: &str, stop: &[&str]) -> Vec<(String, Vec<String>)> {
        let (tx, mut rx) = unbounded_channel();
        let stop: Vec<String> = stop.iter().map(|s| s.to_string()).collect();
        let mut choice = Choice::new(0, tokenizer, &stop, 0);
        for (i, &id) in tokenizer.encode(text).unwrap().iter().enumerate() {
            let logprob = TokenLogprob {
                text: token_text(tokenizer, id),
                logprob: Some(-1.0),
                top: Vec::new(),
                offset: 0,
            };
            choice.push(id, Some(logprob), i + 1, &tx).ok().unwrap();
            if choice.finished() {
                break;
            }
        }
        choice.finish(0, &tx).ok().unwrap();
        drop(tx);
        let mut out = Vec::new();
        while let Ok(event) = rx.try_recv() {
            if let Event::Text { text, logprobs, .. } = event {
                out.push((text, logprobs.into_iter().map(|t| t.text).collect()));
            }
        }
        out
    }

    #[test]
    fn a_character_split_into_byte_tokens_goes_with_all_of_them() {
        let t = bpe();
        let sent = events(&t, "a😀b", &[]);
        let emoji = sent
            .iter()
            .find(|(text, _)| text == "😀")
            .expect("the emoji is sent");
        assert_eq!(emoji.1.len(), 4, "{sent:?}");
        assert!(emoji.1.iter().all(|t| t.starts_with("bytes:")), "{sent:?}");
        assert!(
            sent.iter().all(|(text, _)| !text.is_empty()),
            "no tokens without their text: {sent:?}"
        );
    }

    #[test]
    fn a_stop_string_split_into_byte_tokens_drops_all_of_them() {
        let t = bpe();
        let sent = events(&t, "ab😀c", &["😀"]);
        let text: String = sent.iter().map(|(text, _)| text.as_str()).collect();
        let tokens: Vec<&String> = sent.iter().flat_map(|(_, tokens)| tokens).collect();
        assert_eq!(text, "ab");
        assert!(tokens.iter().all(|t| !t.starts_with("bytes:")), "{sent:?}");
    }
}
