//! The request lines, checked before rmcp parses them.
//!
//! serde_json keeps the last of two equal keys, and rmcp has parsed a
//! message by the time a tool sees its arguments: `{"worker_identities":
//! ["w-1"], "worker_identities": ["w-1", "w-2", "w-3"]}` reads as one worker
//! to a person or a log and as three to the server. So every line that
//! arrives on stdin is parsed strictly first, as `profiles.json` is
//! (`crate::jsonfile::parse_strict`). A line with a key given twice in any
//! object never reaches rmcp: a request gets a JSON-RPC `invalid request`
//! error naming the key and its place, anything else is dropped with a
//! warning. Lines that are not JSON go on unchanged, for rmcp to treat as it
//! always does. A line longer than rmcp reads is dropped, as rmcp would, but
//! a request whose `id` comes within its first 64 KiB is answered
//! (`request_too_long`), so its client does not wait for ever.

use rmcp::model::{ErrorData, RequestId};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::async_rw::{AsyncRwTransport, DEFAULT_MAX_LINE_LENGTH};
use rmcp::transport::Transport;
use rmcp::RoleServer;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{json, Value as Json};
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;

/// A line that did not go on to rmcp.
#[derive(Debug, PartialEq)]
struct Refusal {
    /// The request's id; `None` when it has none or gives it twice.
    id: Option<RequestId>,
    /// Whether it was a request (has a `method` and an `id`).
    request: bool,
    /// The strict parser's words: the duplicated key and where it is.
    why: String,
    /// The error's `reason_code`.
    reason_code: &'static str,
}

/// The transport `serve` speaks over stdin and stdout.
pub type StdioTransport =
    Checked<AsyncRwTransport<RoleServer, CheckedLines<tokio::io::Stdin>, tokio::io::Stdout>>;

/// rmcp's stdio transport, reading through [`CheckedLines`].
pub fn stdio() -> StdioTransport {
    let (stdin, stdout) = rmcp::transport::stdio();
    let (refused, refusals) = mpsc::unbounded_channel();
    Checked {
        inner: AsyncRwTransport::new_server(CheckedLines::new(stdin, refused), stdout),
        refusals,
    }
}

/// Why `line` may not go on to rmcp, or `None` when it may.
fn check(line: &[u8]) -> Option<Refusal> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // rmcp skips a byte-order mark; the text after it is what it parses.
    let line = line.strip_prefix(b"\xef\xbb\xbf").unwrap_or(line);
    let text = std::str::from_utf8(line).ok()?;
    let lenient: Json = serde_json::from_str(text).ok()?;
    let why = crate::jsonfile::parse_strict(text).err()?;
    let ids = ids_until_error(text.as_bytes());
    let id = match ids.as_slice() {
        [one] => serde_json::from_value::<RequestId>(one.clone()).ok(),
        _ => None,
    };
    Some(Refusal {
        id,
        request: lenient.get("method").is_some() && !ids.is_empty(),
        why,
        reason_code: "duplicate_key",
    })
}

/// The top-level `id` values met before the text ends or stops being JSON
/// (an over-long line is cut short: its id usually comes before its
/// parameters).
fn ids_until_error(text: &[u8]) -> Vec<Json> {
    let found = std::cell::RefCell::new(Vec::new());
    let _ = serde_json::Deserializer::from_slice(text).deserialize_map(IdsInto(&found));
    found.into_inner()
}

struct IdsInto<'f>(&'f std::cell::RefCell<Vec<Json>>);

impl<'de> Visitor<'de> for IdsInto<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if key == "id" {
                let id = map.next_value::<Json>()?;
                self.0.borrow_mut().push(id);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// How much of an over-long line is kept to find its id.
const ID_PREFIX: usize = 64 << 10;

/// The JSON-RPC error that answers a refused request.
fn answer(refusal: Refusal) -> TxJsonRpcMessage<RoleServer> {
    let message = format!("request refused, nothing was done: {}", refusal.why);
    TxJsonRpcMessage::<RoleServer>::error(
        ErrorData::invalid_request(message, Some(json!({"reason_code": refusal.reason_code}))),
        refusal.id,
    )
}

/// An `AsyncRead` over stdin that hands on only lines that pass [`check`],
/// and sends a [`Refusal`] for each one that does not. A line longer than
/// rmcp's own limit is dropped here, as rmcp would drop it, so memory stays
/// bounded.
pub struct CheckedLines<R> {
    inner: R,
    /// The line being read.
    line: Vec<u8>,
    /// Whether the rest of an over-long line is being skipped.
    skipping: bool,
    /// Checked bytes not yet handed on, from `handed`.
    out: Vec<u8>,
    handed: usize,
    refused: mpsc::UnboundedSender<Refusal>,
}

impl<R> CheckedLines<R> {
    fn new(inner: R, refused: mpsc::UnboundedSender<Refusal>) -> Self {
        CheckedLines {
            inner,
            line: Vec::new(),
            skipping: false,
            out: Vec::new(),
            handed: 0,
            refused,
        }
    }

    /// Take bytes read from stdin, checking each line they complete.
    fn take(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let end = bytes.iter().position(|b| *b == b'\n').map(|i| i + 1);
            let (part, rest) = bytes.split_at(end.unwrap_or(bytes.len()));
            bytes = rest;
            if !self.skipping && self.line.len() + part.len() > DEFAULT_MAX_LINE_LENGTH {
                tracing::warn!(
                    "a request line is longer than {DEFAULT_MAX_LINE_LENGTH} bytes; dropped"
                );
                self.line
                    .extend_from_slice(&part[..part.len().min(ID_PREFIX)]);
                self.refuse_over_long();
                self.line.clear();
                self.skipping = true;
            }
            if !self.skipping {
                self.line.extend_from_slice(part);
            }
            if end.is_some() {
                if !self.skipping {
                    self.finish_line();
                }
                self.skipping = false;
            }
        }
    }

    /// Answer an over-long request whose id comes early enough in it to be
    /// read (a client otherwise waits for ever); a line without one is
    /// dropped unanswered, as it may be a notification.
    fn refuse_over_long(&mut self) {
        let start = &self.line[..self.line.len().min(ID_PREFIX)];
        let ids = ids_until_error(start);
        let [one] = ids.as_slice() else { return };
        let Ok(id) = serde_json::from_value::<RequestId>(one.clone()) else {
            return;
        };
        let _ = self.refused.send(Refusal {
            id: Some(id),
            request: true,
            why: format!(
                "the request is longer than {DEFAULT_MAX_LINE_LENGTH} bytes, the most one line \
                 may hold; send smaller arguments (page through plans with cursors)"
            ),
            reason_code: "request_too_long",
        });
    }

    fn finish_line(&mut self) {
        match check(&self.line) {
            None => self.out.extend_from_slice(&self.line),
            Some(refusal) => {
                tracing::warn!("refused a request line: {}", refusal.why);
                if refusal.request {
                    let _ = self.refused.send(refusal);
                }
            }
        }
        self.line.clear();
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for CheckedLines<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            if me.handed < me.out.len() {
                let n = (me.out.len() - me.handed).min(buf.remaining());
                buf.put_slice(&me.out[me.handed..me.handed + n]);
                me.handed += n;
                return Poll::Ready(Ok(()));
            }
            me.out.clear();
            me.handed = 0;
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut me.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                // End of input. An unterminated last line is not handed on:
                // rmcp drops one at the end of input too.
                return Poll::Ready(Ok(()));
            }
            me.take(read.filled());
        }
    }
}

/// A server transport that answers the requests [`CheckedLines`] refused,
/// and otherwise is `inner`.
pub struct Checked<T> {
    inner: T,
    refusals: mpsc::UnboundedReceiver<Refusal>,
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for Checked<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            let refusal = tokio::select! {
                biased;
                Some(refusal) = self.refusals.recv() => refusal,
                message = self.inner.receive() => {
                    if message.is_none() {
                        // The input ended: answer what it refused on the way.
                        while let Ok(refusal) = self.refusals.try_recv() {
                            let _ = self.inner.send(answer(refusal)).await;
                        }
                    }
                    return message;
                }
            };
            // rmcp may drop this future for another event; the answer is
            // sent on a task of its own so it is never cut short.
            let sending = self.inner.send(answer(refusal));
            tokio::spawn(async move {
                if let Err(e) = sending.await {
                    tracing::warn!("could not answer a refused request: {e}");
                }
            });
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duplicated_key_anywhere_is_refused_and_named() {
        let line = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","arguments":{"a":[1],"a":[1,2]}}}"#;
        let r = check(line).unwrap();
        assert_eq!(r.id, Some(RequestId::Number(7)));
        assert!(r.request);
        assert!(
            r.why
                .contains("duplicate key \"a\" at $.params.arguments.a"),
            "{}",
            r.why
        );
        // The id given twice: answered with a null id.
        let r = check(br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#).unwrap();
        assert_eq!((r.id, r.request), (None, true));
        // A notification is dropped, not answered.
        let r = check(br#"{"jsonrpc":"2.0","method":"n","params":{"k":1,"k":2}}"#).unwrap();
        assert!(!r.request);
    }

    #[test]
    fn other_lines_go_on_unchanged() {
        assert_eq!(
            check(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\r\n"),
            None
        );
        assert_eq!(check(b"\xef\xbb\xbf{\"a\":1}\n"), None);
        assert_eq!(check(b"not json\n"), None);
        assert_eq!(check(b"\n"), None);
        assert_eq!(check(b"{\"a\":\xff}\n"), None);
    }

    #[tokio::test]
    async fn lines_are_checked_across_reads_and_over_long_ones_dropped() {
        use tokio::io::AsyncReadExt;
        let mut input = Vec::new();
        input.extend_from_slice(b"{\"id\":1,\"method\":\"a\"}\n");
        input.extend_from_slice(b"{\"id\":2,\"method\":\"b\",\"x\":1,\"x\":2}\n");
        input.push(b'"');
        input.extend(std::iter::repeat_n(b'y', DEFAULT_MAX_LINE_LENGTH));
        input.extend_from_slice(b"\"\n{\"id\":3,\"method\":\"c\"}\n{\"id\":4}");
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut lines = CheckedLines::new(&input[..], tx);
        let mut out = Vec::new();
        lines.read_to_end(&mut out).await.unwrap();
        assert_eq!(
            out,
            b"{\"id\":1,\"method\":\"a\"}\n{\"id\":3,\"method\":\"c\"}\n"
        );
        let refused = rx.try_recv().unwrap();
        assert_eq!(refused.id, Some(RequestId::Number(2)));
        // The over-long line has no id: dropped unanswered.
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn an_over_long_request_is_answered_by_its_id() {
        use tokio::io::AsyncReadExt;
        let mut input = Vec::new();
        input.extend_from_slice(
            b"{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"tools/call\",\"params\":\"",
        );
        input.extend(std::iter::repeat_n(b'y', DEFAULT_MAX_LINE_LENGTH));
        input.extend_from_slice(b"\"}\n{\"id\":3,\"method\":\"c\"}\n");
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut lines = CheckedLines::new(&input[..], tx);
        let mut out = Vec::new();
        lines.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, b"{\"id\":3,\"method\":\"c\"}\n");
        let refused = rx.try_recv().unwrap();
        assert_eq!(refused.id, Some(RequestId::Number(9)));
        assert_eq!(refused.reason_code, "request_too_long");
        assert!(rx.try_recv().is_err());
    }
}
