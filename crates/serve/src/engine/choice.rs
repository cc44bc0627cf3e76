//! One choice of a request: the text of its row's tokens, sent as it settles, held back while
//! it may be the start of a stop string, and each token's log-probabilities sent with the text
//! they belong to. After its first text, a choice sends what settled at most every [`gap`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use cinder_data::{TextStream, Tokenizer};

use super::job::{Event, Finish, TokenLogprob};
use super::stop::StopMatcher;

/// The least time between two messages of text of a choice, after its first (its end goes at
/// once), with `rows` texts decoding in all: [`LEAST_GAP`], and with more than 10 texts long
/// enough that all their choices together send about [`MESSAGES_PER_S`] messages a second, up
/// to [`MOST_GAP`] from 50 texts. Each message wakes a client's connection, makes a chunk of its
/// stream and takes a read of the client: with one every 20 ms, 32 streams took a tenth of two
/// cores, beside the decoding (BENCHMARKS.md sections 36 and 39).
pub(super) fn gap(rows: usize) -> Duration {
    let rows = u32::try_from(rows).unwrap_or(u32::MAX);
    (Duration::from_secs(1) * rows / MESSAGES_PER_S).clamp(LEAST_GAP, MOST_GAP)
}

/// A choice's text goes at most this often, whatever the load ([`gap`]).
const LEAST_GAP: Duration = Duration::from_millis(20);
/// Under any load, a choice's text goes at least this often ([`gap`]): 10 times a second.
const MOST_GAP: Duration = Duration::from_millis(100);
/// The messages a second that all the choices decoding send at most, from 10 texts to 50
/// ([`gap`]).
const MESSAGES_PER_S: u32 = 500;

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
    /// Text settled and not yet sent (waiting for the gap), and its tokens.
    unsent: Option<(String, Vec<TokenLogprob>)>,
    /// When text was last sent (none yet: the first goes at once).
    last_sent: Option<Instant>,
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
            unsent: None,
            last_sent: None,
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
    /// as of the request's `written` tokens, with the text not sent yet: at once the first time,
    /// then once `gap` ([`gap`]) has passed since the last, else it waits for a later call
    /// (which may settle no text) or [`Choice::flush`]. With `stopped`, the tokens that begin
    /// in the text sent go, and the others (the stop string's) are dropped.
    fn send_text(
        &mut self,
        text: String,
        written: usize,
        stopped: bool,
        gap: Duration,
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
        if !text.is_empty() || !logprobs.is_empty() {
            let unsent = self.unsent.get_or_insert_default();
            unsent.0.push_str(&text);
            unsent.1.extend(logprobs);
        }
        match self.last_sent {
            Some(last) if last.elapsed() < gap => Ok(()),
            _ => self.flush(written, events),
        }
    }

    /// Sends the text not sent yet, if any, as of the request's `written` tokens.
    pub(super) fn flush(
        &mut self,
        written: usize,
        events: &UnboundedSender<Event>,
    ) -> Result<(), Gone> {
        let Some((text, logprobs)) = self.unsent.take() else {
            return Ok(());
        };
        self.last_sent = Some(Instant::now());
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
    /// and sends the text it settles, once `gap` has passed since it last sent.
    pub(super) fn push(
        &mut self,
        token: u32,
        logprob: Option<TokenLogprob>,
        written: usize,
        gap: Duration,
        events: &UnboundedSender<Event>,
    ) -> Result<(), Gone> {
        // Where a byte held back from an earlier token never became a character, its U+FFFD
        // is that token's text, before this one's.
        let (earlier, piece) = self.stream.push_split(token);
        let start = self.decoded + earlier;
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
        // At a stop string, what settled goes at once, before the finish reason.
        let gap = if stopped { Duration::ZERO } else { gap };
        self.send_text(text, written, stopped, gap, events)?;
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
        self.send_text(text, written, stopped, Duration::ZERO, events)?;
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
    /// `stop`, each sent as it settles.
    fn events(tokenizer: &Tokenizer, text: &str, stop: &[&str]) -> Vec<(String, Vec<String>)> {
        events_apart(tokenizer, text, stop, Duration::ZERO).0
    }

    /// [`events`], with text sent at most every `gap`, and the finish reason sent after them.
    fn events_apart(
        tokenizer: &Tokenizer,
        text: &str,
        stop: &[&str],
        gap: Duration,
    ) -> (Vec<(String, Vec<String>)>, Option<Finish>) {
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
            choice
                .push(id, Some(logprob), i + 1, gap, &tx)
                .ok()
                .unwrap();
            if choice.finished() {
                break;
            }
        }
        choice.finish(0, &tx).ok().unwrap();
        drop(tx);
        let (mut out, mut finish) = (Vec::new(), None);
        while let Ok(event) = rx.try_recv() {
            match event {
                Event::Text { text, logprobs, .. } => {
                    assert!(finish.is_none(), "text after the finish reason");
                    out.push((text, logprobs.into_iter().map(|t| t.text).collect()));
                }
                Event::Finished { reason, .. } => finish = Some(reason),
                _ => {}
            }
        }
        (out, finish)
    }

    #[test]
    fn after_its_first_text_a_choice_sends_what_settles_once_the_gap_has_passed_and_at_its_end() {
        let t = bpe();
        // No gap: a message per token's text; an hour: the first, then the rest at the end,
        // before the finish reason, its tokens with it.
        let hour = Duration::from_secs(3600);
        let each = events(&t, "the cat sat", &[]);
        assert!(each.len() > 2, "{each:?}");
        let (apart, finish) = events_apart(&t, "the cat sat", &[], hour);
        let rest: String = each[1..].iter().map(|e| e.0.as_str()).collect();
        let rest_tokens: Vec<String> = each[1..].iter().flat_map(|e| e.1.clone()).collect();
        assert_eq!(apart, [each[0].clone(), (rest, rest_tokens)]);
        assert!(matches!(finish, Some(Finish::Length)), "{finish:?}");
        // A stop string met: what settled before it goes, then the reason.
        let (stopped, finish) = events_apart(&t, "the cat sat on", &[" sat"], hour);
        let text: String = stopped.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(text, "the cat", "{stopped:?}");
        assert_eq!(
            stopped.len(),
            2,
            "the first text, then the rest at the stop: {stopped:?}"
        );
        assert!(matches!(finish, Some(Finish::Stop)), "{finish:?}");
    }

    #[test]
    fn the_gap_spreads_500_messages_a_second_over_the_rows_between_20_and_100_ms() {
        let ms = Duration::from_millis;
        for (rows, expected) in [(1, 20), (10, 20), (16, 32), (32, 64), (50, 100), (64, 100)] {
            assert_eq!(gap(rows), ms(expected), "{rows} rows");
        }
        assert_eq!(gap(usize::MAX), MOST_GAP);
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
    fn a_byte_that_never_decodes_goes_with_its_replacement_character() {
        // Two starts of characters, neither continued, then an 'a': each start's U+FFFD is its
        // own text, sent with it, and the next token's text starts after it.
        let t = bpe();
        let byte = |b: u8| {
            (0..t.vocab_size() as u32)
                .find(|&id| t.token_bytes(id) == [b])
                .unwrap()
        };
        let (tx, mut rx) = unbounded_channel();
        let mut choice = Choice::new(0, &t, &[], 0);
        for (i, id) in [byte(b'x'), byte(0xD6), byte(0xCA), byte(b'a')]
            .into_iter()
            .enumerate()
        {
            let logprob = TokenLogprob {
                text: token_text(&t, id),
                logprob: Some(-1.0),
                top: Vec::new(),
                offset: 0,
            };
            let zero = Duration::ZERO;
            choice
                .push(id, Some(logprob), i + 1, zero, &tx)
                .ok()
                .unwrap();
        }
        choice.finish(0, &tx).ok().unwrap();
        drop(tx);
        let mut sent = Vec::new();
        while let Ok(event) = rx.try_recv() {
            if let Event::Text { text, logprobs, .. } = event {
                let tokens: Vec<_> = logprobs.into_iter().map(|t| (t.text, t.offset)).collect();
                sent.push((text, tokens));
            }
        }
        let token = |text: &str, offset: usize| (text.to_string(), offset);
        assert_eq!(
            sent,
            [
                ("x".into(), vec![token("x", 0)]),
                ("\u{fffd}".into(), vec![token("bytes:\\xd6", 1)]),
                (
                    "\u{fffd}a".into(),
                    vec![token("bytes:\\xca", 2), token("a", 3)]
                ),
            ]
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
