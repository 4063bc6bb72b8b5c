//! The Connect protocol as envd's clients speak it: JSON codec, no compression. Unary
//! calls are plain JSON; streams are enveloped messages (`flags | u32 length | JSON`), a
//! server stream ending with an end-of-stream envelope (`{}` or `{"error": …}`).

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::errors::RpcErr;

const FLAG_COMPRESSED: u8 = 0x01;
const FLAG_END: u8 = 0x02;
/// Envelopes a stream response buffers before the client reads them.
const STREAM_DEPTH: usize = 64;

/// One enveloped message.
pub fn envelope(flags: u8, json: &Value) -> Bytes {
    let payload = serde_json::to_vec(json).unwrap_or_else(|_| b"{}".to_vec());
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    Bytes::from(out)
}

/// Splits enveloped messages off a byte stream as they complete.
#[derive(Default)]
pub struct Frames {
    buf: Vec<u8>,
}

impl Frames {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete message: `(end_of_stream, json)`; messages over `limit` bytes
    /// and compressed ones are refused.
    pub fn next(&mut self, limit: usize) -> Result<Option<(bool, Value)>, RpcErr> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > limit {
            return Err(RpcErr::new(
                super::errors::Code::ResourceExhausted,
                format!("message of {len} bytes exceeds {limit}"),
            ));
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err(RpcErr::invalid("compressed messages are not accepted"));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let rest = self.buf.split_off(5 + len);
        let payload = std::mem::replace(&mut self.buf, rest).split_off(5);
        let json = if payload.is_empty() {
            Value::Object(Default::default())
        } else {
            serde_json::from_slice(&payload)
                .map_err(|e| RpcErr::invalid(format!("invalid message: {e}")))?
        };
        Ok(Some((flags & FLAG_END != 0, json)))
    }
}

/// Reads a whole request body of at most `limit` bytes.
pub async fn read_body(body: Body, limit: usize) -> Result<Bytes, RpcErr> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        RpcErr::new(
            super::errors::Code::ResourceExhausted,
            format!("cannot read the request (at most {limit} bytes): {e}"),
        )
    })
}

/// A unary request message.
pub fn unary_request<T: DeserializeOwned>(body: &[u8]) -> Result<T, RpcErr> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| RpcErr::invalid(format!("invalid request: {e}")))
}

/// The one message of a server-stream request.
pub fn stream_request<T: DeserializeOwned>(body: &[u8], limit: usize) -> Result<T, RpcErr> {
    let mut frames = Frames::default();
    frames.push(body);
    match frames.next(limit)? {
        Some((false, json)) => serde_json::from_value(json)
            .map_err(|e| RpcErr::invalid(format!("invalid request: {e}"))),
        _ => Err(RpcErr::invalid("the request holds no message")),
    }
}

/// A unary answer.
pub fn unary(json: Value) -> Response {
    (StatusCode::OK, axum::Json(json)).into_response()
}

/// The sending side of a server stream.
pub struct StreamOut {
    tx: mpsc::Sender<Bytes>,
}

impl StreamOut {
    /// Sends a message; `false` once the client has gone.
    pub async fn send(&self, json: &Value) -> bool {
        self.tx.send(envelope(0, json)).await.is_ok()
    }

    /// Ends the stream, with an error or without.
    pub async fn end(self, err: Option<RpcErr>) {
        let json = match err {
            Some(e) => serde_json::json!({"error": e.body()}),
            None => serde_json::json!({}),
        };
        let _ = self.tx.send(envelope(FLAG_END, &json)).await;
    }

    /// Resolves when the client has gone.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// A server-stream response and its sending side.
pub fn stream_response() -> (StreamOut, Response) {
    let (tx, rx) = mpsc::channel::<Bytes>(STREAM_DEPTH);
    let body = Body::from_stream(ReceiverStream::new(rx).map(Ok::<_, std::io::Error>));
    let mut resp = (StatusCode::OK, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    (StreamOut { tx }, resp)
}

/// A stream that is only an error (a failure before any message).
pub fn stream_error(err: RpcErr) -> Response {
    let (out, resp) = stream_response();
    tokio::spawn(out.end(Some(err)));
    resp
}

/// The longest deadline honoured (a longer one is none: the daemon's own limits apply).
const MAX_DEADLINE: Duration = Duration::from_secs(366 * 24 * 3600);

/// `Connect-Timeout-Ms`: the deadline of the call.
pub fn timeout(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
        .filter(|d| *d <= MAX_DEADLINE)
}

/// `Keepalive-Ping-Interval`: how long a stream may stay quiet (1 s to 1 h).
pub fn keepalive(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|s| Duration::from_secs(s.clamp(1, 3600)))
}

/// Ticks at the keepalive interval (never without one).
pub struct Ticker(Option<tokio::time::Interval>);

impl Ticker {
    pub fn new(every: Option<Duration>) -> Self {
        Ticker(every.map(|d| {
            let mut i = tokio::time::interval_at(tokio::time::Instant::now() + d, d);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        }))
    }

    pub async fn tick(&mut self) {
        match &mut self.0 {
            Some(i) => {
                i.tick().await;
            }
            None => std::future::pending().await,
        }
    }

    /// Something was sent: the quiet spell starts again.
    pub fn reset(&mut self) {
        if let Some(i) = &mut self.0 {
            i.reset();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn envelopes_round_trip_in_pieces() {
        let mut bytes = envelope(0, &json!({"a": 1})).to_vec();
        bytes.extend_from_slice(&envelope(FLAG_END, &json!({})));
        let mut f = Frames::default();
        f.push(&bytes[..3]);
        assert!(f.next(100).unwrap().is_none());
        f.push(&bytes[3..]);
        assert_eq!(f.next(100).unwrap(), Some((false, json!({"a": 1}))));
        assert_eq!(f.next(100).unwrap(), Some((true, json!({}))));
        assert_eq!(f.next(100).unwrap(), None);
    }

    #[test]
    fn hostile_envelopes_are_refused() {
        let mut f = Frames::default();
        f.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(f.next(1024).is_err(), "over the limit");
        let mut f = Frames::default();
        f.push(&[1, 0, 0, 0, 1, b'x']);
        assert!(f.next(1024).is_err(), "compressed");
        let mut f = Frames::default();
        f.push(&[0, 0, 0, 0, 2, b'{', b'x']);
        assert!(f.next(1024).is_err(), "not JSON");
        assert!(stream_request::<Value>(b"", 10).is_err());
        assert_eq!(unary_request::<Value>(b"").unwrap(), json!({}));
    }

    #[test]
    fn headers_give_deadline_and_keepalive() {
        let mut h = HeaderMap::new();
        assert_eq!(timeout(&h), None);
        h.insert("connect-timeout-ms", "1500".parse().unwrap());
        h.insert("keepalive-ping-interval", "0".parse().unwrap());
        assert_eq!(timeout(&h), Some(Duration::from_millis(1500)));
        h.insert("connect-timeout-ms", u64::MAX.to_string().parse().unwrap());
        assert_eq!(timeout(&h), None, "an absurd deadline is none");
        h.insert("connect-timeout-ms", "1500".parse().unwrap());
        assert_eq!(keepalive(&h), Some(Duration::from_secs(1)));
    }
}
