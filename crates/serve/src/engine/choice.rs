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
            let goes = if stopped {
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
