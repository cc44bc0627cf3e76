//! A completion as server-sent events: a state machine from the worker's events to chunks.
//!
//! The events the worker has sent meanwhile are read together, and each choice's text among
//! them goes as one chunk: a client (or a server) that falls behind under load catches up in
//! fewer, longer chunks, instead of paying an event's cost for every token (the worker itself
//! sends a choice's text at most every 20 ms after the first, and less often under load:
//! `engine::choice::gap`). A choice's text always goes before its `finish_reason`.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::time::Instant;

use axum::response::sse::Event as SseEvent;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::mpsc::error::TryRecvError;

use crate::api::{ApiError, Header, StreamUsage, Usage};
use crate::engine::{EngineError, Event, Finish, TokenLogprob};
use crate::log::{Logged, log_line};

/// Events taken from the worker at once, at most: a stream that fell behind catches up in
/// steps of this many, so that one stream does not hold a runtime thread for long.
const CATCH_UP: usize = 256;

/// A completion as server-sent events: a chunk per piece of text, one with each choice's
/// `finish_reason`, the usage where `usage` asks for it, then `[DONE]`; with `logprobs`, each
/// chunk carries the log-probabilities of the tokens whose text it holds. It logs its request's
/// line when it is dropped.
pub fn stream(
    rx: UnboundedReceiver<Event>,
    header: Header,
    prompt_tokens: usize,
    usage: StreamUsage,
    logprobs: bool,
    logged: Logged,
) -> impl futures_util::Stream<Item = Result<SseEvent, Infallible>> {
    let start = StreamState {
        rx,
        pending: VecDeque::new(),
        texts: BTreeMap::new(),
        logprobs,
        written: 0,
        ended: false,
        header,
        prompt_tokens,
        sends_usage: usage,
        logged,
        since: Instant::now(),
        failed: None,
    };
    futures_util::stream::unfold(start, |mut s| async move {
        loop {
            if let Some(event) = s.pending.pop_front() {
                return Some((Ok(event), s));
            }
            if s.ended {
                return None;
            }
            let first = s.rx.recv().await;
            s.read(first);
            // What else has come meanwhile, up to the stream's end.
            for _ in 1..CATCH_UP {
                if s.ended {
                    break;
                }
                match s.rx.try_recv() {
                    Ok(event) => s.read(Some(event)),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => s.read(None),
                }
            }
            s.flush(None);
        }
    })
}

/// A stream's state between the worker's events and the chunks sent.
struct StreamState {
    rx: UnboundedReceiver<Event>,
    pending: VecDeque<SseEvent>,
    /// Each choice's text read and not yet sent, and its tokens.
    texts: BTreeMap<usize, (String, Vec<TokenLogprob>)>,
    /// Whether chunks carry log-probabilities.
    logprobs: bool,
    /// The request's tokens written, as of the last text read.
    written: usize,
    ended: bool,
    header: Header,
    prompt_tokens: usize,
    sends_usage: StreamUsage,
    logged: Logged,
    since: Instant,
    /// The status of the error that ended it, if one did.
    failed: Option<u16>,
}

/// One log line per stream, when it is dropped: 200 if it ran to [DONE], the error's status if
/// one ended it, else 499 (the client closed it).
impl Drop for StreamState {
    fn drop(&mut self) {
        let status = match (self.ended, self.failed) {
            (true, Some(status)) => status,
            (true, None) => 200,
            (false, _) => 499,
        };
        log_line("POST", "/v1/completions", status, &self.logged, self.since);
    }
}

fn data(value: serde_json::Value) -> SseEvent {
    SseEvent::default().data(value.to_string())
}

impl StreamState {
    fn usage(&self, completion_tokens: usize) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens,
        }
    }

    /// Queues a chunk of choice `index`: its text and tokens, or its end.
    fn send(&mut self, index: usize, text: &str, tokens: &[TokenLogprob], finish: Option<Finish>) {
        let usage = self
            .sends_usage
            .on_every_chunk
            .then(|| self.usage(self.written));
        let tokens = self.logprobs.then_some(tokens);
        let chunk = self.header.chunk(index, text, tokens, finish, usage);
        self.pending.push_back(data(chunk));
    }

    /// Queues the text read of choice `index` (of every choice, in order: `None`), if any.
    fn flush(&mut self, index: Option<usize>) {
        let texts: Vec<(usize, (String, Vec<TokenLogprob>))> = match index {
            Some(index) => self.texts.remove_entry(&index).into_iter().collect(),
            None => std::mem::take(&mut self.texts).into_iter().collect(),
        };
        for (index, (text, tokens)) in texts {
            self.send(index, &text, &tokens, None);
        }
    }

    /// Takes one of the worker's events (`None`: the worker is gone).
    fn read(&mut self, event: Option<Event>) {
        match event {
            Some(Event::Started { .. }) => {}
            Some(Event::Text {
                index,
                text,
                written,
                logprobs,
            }) => {
                let (waiting, tokens) = self.texts.entry(index).or_default();
                waiting.push_str(&text);
                tokens.extend(logprobs);
                self.written = written;
            }
            Some(Event::Finished { index, reason }) => {
                self.flush(Some(index));
                self.send(index, "", &[], Some(reason));
            }
            Some(Event::Done { completion_tokens }) => {
                self.flush(None);
                if self.sends_usage.at_end {
                    let usage = self.usage(completion_tokens);
                    self.pending.push_back(data(self.header.usage_chunk(usage)));
                }
                self.pending.push_back(SseEvent::default().data("[DONE]"));
                self.ended = true;
                self.logged.tokens = Some(completion_tokens);
            }
            Some(Event::Failed(e)) => self.fail(e.into()),
            None => self.fail(EngineError::WorkerGone.into()),
        }
    }

    /// Ends the stream with `e`'s error event, after the text read.
    fn fail(&mut self, e: ApiError) {
        self.flush(None);
        self.ended = true;
        self.failed = Some(e.status.as_u16());
        self.pending.push_back(data(e.body()));
    }
}

#[cfg(test)]
mod tests {
    use axum::response::IntoResponse;
    use axum::response::sse::Sse;
    use serde_json::json;
    use tokio::sync::mpsc::unbounded_channel;

    use super::*;

    /// The stream of a request of 2 prompt tokens whose worker sends `rx`.
    fn test_stream(
        rx: UnboundedReceiver<Event>,
        usage: StreamUsage,
        logprobs: bool,
    ) -> impl futures_util::Stream<Item = Result<SseEvent, Infallible>> {
        let header = Header {
            id: "cmpl-0".into(),
            created: 0,
            model: "m".into(),
        };
        stream(rx, header, 2, usage, logprobs, Logged::default())
    }

    /// The data of each event of `events`, sent before the stream is read: what a client that
    /// fell behind receives. Usage is asked for at the end, and on every chunk if `continuous`.
    async fn read_behind(events: Vec<Event>, continuous: bool) -> Vec<serde_json::Value> {
        read_behind_with(events, continuous, false).await
    }

    /// [`read_behind`], with log-probabilities asked for if `logprobs`.
    async fn read_behind_with(
        events: Vec<Event>,
        continuous: bool,
        logprobs: bool,
    ) -> Vec<serde_json::Value> {
        let (tx, rx) = unbounded_channel();
        for event in events {
            tx.send(event).unwrap();
        }
        drop(tx);
        let usage = StreamUsage {
            at_end: true,
            on_every_chunk: continuous,
        };
        let events = test_stream(rx, usage, logprobs);
        let body = axum::body::to_bytes(Sse::new(events).into_response().into_body(), 1 << 20)
            .await
            .unwrap();
        let body = String::from_utf8(body.to_vec()).unwrap();
        body.split("\n\n")
            .filter_map(|event| event.strip_prefix("data: "))
            .map(|data| serde_json::from_str(data).unwrap_or(json!(data)))
            .collect()
    }

    fn text(index: usize, text: &str, written: usize) -> Event {
        text_with(index, text, written, Vec::new())
    }

    fn text_with(index: usize, text: &str, written: usize, logprobs: Vec<TokenLogprob>) -> Event {
        Event::Text {
            index,
            text: text.into(),
            written,
            logprobs,
        }
    }

    fn finished(index: usize, reason: Finish) -> Event {
        Event::Finished { index, reason }
    }

    /// (index, text, finish_reason, usage's completion_tokens) of each chunk with a choice.
    fn choices(
        data: &[serde_json::Value],
    ) -> Vec<(u64, String, serde_json::Value, serde_json::Value)> {
        data.iter()
            .filter(|d| d["choices"].as_array().is_some_and(|c| !c.is_empty()))
            .map(|d| {
                let c = &d["choices"][0];
                let text = c["text"].as_str().unwrap().to_string();
                let index = c["index"].as_u64().unwrap();
                (
                    index,
                    text,
                    c["finish_reason"].clone(),
                    d["usage"]["completion_tokens"].clone(),
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn a_stream_behind_sends_each_choices_waiting_text_as_one_chunk_before_its_end() {
        let data = read_behind(
            vec![
                Event::Started { prompt_tokens: 2 },
                text(0, "a", 1),
                text(0, "b", 3),
                text(1, "x", 4),
                text(0, "c", 5),
                text(0, "é", 7),
                finished(0, Finish::Length),
                text(1, "y", 8),
                finished(1, Finish::Stop),
                Event::Done {
                    completion_tokens: 8,
                },
            ],
            false,
        )
        .await;
        let null = serde_json::Value::Null;
        assert_eq!(
            choices(&data),
            [
                (0, "abcé".into(), null.clone(), null.clone()),
                (0, "".into(), json!("length"), null.clone()),
                (1, "xy".into(), null.clone(), null.clone()),
                (1, "".into(), json!("stop"), null.clone()),
            ]
        );
        assert_eq!(data[data.len() - 2]["usage"]["completion_tokens"], 8);
        assert_eq!(data[data.len() - 2]["choices"], json!([]));
        assert_eq!(data[data.len() - 1], "[DONE]");
    }

    /// A token and its log-probability, at `offset`.
    fn token(text: &str, logprob: f32, offset: usize) -> TokenLogprob {
        TokenLogprob {
            text: text.into(),
            logprob: Some(logprob),
            top: vec![(text.into(), logprob)],
            offset,
        }
    }

    #[tokio::test]
    async fn merged_chunks_carry_the_log_probabilities_of_their_tokens_in_order() {
        let with = text_with;
        let data = read_behind_with(
            vec![
                Event::Started { prompt_tokens: 2 },
                with(0, "a", 1, vec![token("a", -0.5, 0)]),
                with(1, "x", 2, vec![token("x", -0.1, 0)]),
                with(0, "", 3, vec![token("bytes:\\xc3", -1.0, 1)]),
                with(0, "é", 3, vec![token("bytes:\\xa9", -0.2, 1)]),
                finished(0, Finish::Length),
                finished(1, Finish::Length),
                Event::Done {
                    completion_tokens: 4,
                },
            ],
            false,
            true,
        )
        .await;
        assert_eq!(data[0]["choices"][0]["text"], "aé");
        assert_eq!(
            data[0]["choices"][0]["logprobs"],
            json!({
                "tokens": ["a", "bytes:\\xc3", "bytes:\\xa9"],
                "token_logprobs": [-0.5, -1.0, -0.2],
                "top_logprobs": [{"a": -0.5}, {"bytes:\\xc3": -1.0}, {"bytes:\\xa9": -0.2}],
                "text_offset": [0, 1, 1],
            })
        );
        assert_eq!(data[2]["choices"][0]["text"], "x");
        assert_eq!(data[2]["choices"][0]["logprobs"]["tokens"], json!(["x"]));
        // Without logprobs asked for, chunks carry none.
        let plain = read_behind(
            vec![with(0, "a", 1, vec![]), finished(0, Finish::Length)],
            false,
        )
        .await;
        assert_eq!(plain[0]["choices"][0]["logprobs"], serde_json::Value::Null);
    }

    #[tokio::test]
    async fn continuous_usage_puts_the_tokens_written_so_far_on_every_chunk() {
        let data = read_behind(
            vec![
                Event::Started { prompt_tokens: 2 },
                text(0, "ab", 2),
                finished(0, Finish::Length),
                Event::Done {
                    completion_tokens: 2,
                },
            ],
            true,
        )
        .await;
        assert_eq!(
            choices(&data),
            [
                (0, "ab".into(), serde_json::Value::Null, json!(2)),
                (0, "".into(), json!("length"), json!(2)),
            ]
        );
        assert_eq!(data[0]["usage"]["prompt_tokens"], 2);
        assert_eq!(data[data.len() - 1], "[DONE]");
    }

    #[tokio::test]
    async fn a_stream_whose_worker_is_gone_ends_with_an_error_after_its_text() {
        let data = read_behind(
            vec![Event::Started { prompt_tokens: 2 }, text(0, "ab", 2)],
            false,
        )
        .await;
        assert_eq!(data.len(), 2, "{data:?}");
        assert_eq!(data[0]["choices"][0]["text"], "ab", "{data:?}");
        assert!(data[1]["error"].is_object(), "{data:?}");
    }
}
