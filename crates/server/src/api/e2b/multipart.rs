//! Upload bodies, streamed: a request body (gzip-decoded when it says so) bounded by the
//! daemon's upload limit, and a `multipart/form-data` parser over it that hands out each
//! part's bytes as they arrive.

use std::io::Write;

use axum::body::{Body, BodyDataStream, Bytes};
use flate2::write::GzDecoder;
use futures::StreamExt;

use crate::error::Error;

/// The most bytes of one part's headers.
const MAX_HEAD: usize = 16 << 10;

/// Something that hands out bytes until it is done.
pub trait Source {
    /// The next bytes; `None` at the end.
    fn chunk(&mut self) -> impl std::future::Future<Output = Result<Option<Bytes>, Error>> + Send;
}

/// A request body: bounded, gzip-decoded when the request says so.
pub struct Reader {
    stream: BodyDataStream,
    gzip: Option<GzDecoder<Vec<u8>>>,
    limit: u64,
    seen: u64,
    done: bool,
}

impl Reader {
    pub fn new(body: Body, gzip: bool, limit: u64) -> Self {
        Reader {
            stream: body.into_data_stream(),
            gzip: gzip.then(|| GzDecoder::new(Vec::new())),
            limit,
            seen: 0,
            done: false,
        }
    }

    fn count(&mut self, n: usize) -> Result<(), Error> {
        self.seen += n as u64;
        if self.seen > self.limit {
            return Err(Error::TooLarge(format!(
                "Upload exceeds {} bytes",
                self.limit
            )));
        }
        Ok(())
    }

    /// Decoded bytes of one raw chunk (maybe none yet).
    fn decode(&mut self, raw: &[u8]) -> Result<Vec<u8>, Error> {
        let Some(gz) = &mut self.gzip else {
            return Ok(raw.to_vec());
        };
        gz.write_all(raw)
            .map_err(|e| Error::InvalidArgument(format!("invalid gzip body: {e}")))?;
        Ok(std::mem::take(gz.get_mut()))
    }

    fn finish(&mut self) -> Result<Vec<u8>, Error> {
        let Some(gz) = &mut self.gzip else {
            return Ok(Vec::new());
        };
        gz.try_finish()
            .map_err(|e| Error::InvalidArgument(format!("invalid gzip body: {e}")))?;
        Ok(std::mem::take(gz.get_mut()))
    }
}

impl Source for Reader {
    async fn chunk(&mut self) -> Result<Option<Bytes>, Error> {
        while !self.done {
            let out = match self.stream.next().await {
                Some(Ok(raw)) => self.decode(&raw)?,
                Some(Err(e)) => {
                    return Err(Error::InvalidArgument(format!("Upload interrupted: {e}")))
                }
                None => {
                    self.done = true;
                    self.finish()?
                }
            };
            if !out.is_empty() {
                self.count(out.len())?;
                return Ok(Some(Bytes::from(out)));
            }
        }
        Ok(None)
    }
}

/// One part's headers.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PartHead {
    pub name: Option<String>,
    pub filename: Option<String>,
}

#[derive(Debug, PartialEq, Eq)]
enum At {
    /// Before the first delimiter.
    Preamble,
    /// Right after a delimiter.
    Delimiter,
    Body,
    Done,
}

/// A `multipart/form-data` body.
pub struct Multipart<S> {
    src: S,
    buf: Vec<u8>,
    delim: Vec<u8>,
    at: At,
}

/// The boundary of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let (kind, params) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        let b = v.trim().trim_matches('"');
        (k.trim().eq_ignore_ascii_case("boundary") && !b.is_empty() && b.len() <= 200)
            .then(|| b.to_string())
    })
}

/// Where `needle` first occurs in `hay`: candidates by its first byte, then compared
/// whole (uploads are scanned byte by byte, so this is the hot loop of a multipart body).
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (first, rest) = needle.split_first()?;
    let last_start = hay.len().checked_sub(needle.len())?;
    let mut from = 0;
    while from <= last_start {
        let i = from + hay[from..=last_start].iter().position(|b| b == first)?;
        if &hay[i + 1..i + needle.len()] == rest {
            return Some(i);
        }
        from = i + 1;
    }
    None
}

/// The first `n` bytes of `buf`, taken out of it (no byte-by-byte copy).
fn take_front(buf: &mut Vec<u8>, n: usize) -> Vec<u8> {
    let rest = buf.split_off(n);
    std::mem::replace(buf, rest)
}

impl<S: Source + Send> Multipart<S> {
    pub fn new(src: S, boundary: &str) -> Self {
        Multipart {
            src,
            // The body's first delimiter has no CRLF before it: pretend it does.
            buf: b"\r\n".to_vec(),
            delim: format!("\r\n--{boundary}").into_bytes(),
            at: At::Preamble,
        }
    }

    /// Reads more; an error if the body ends in the middle.
    async fn fill(&mut self) -> Result<(), Error> {
        match self.src.chunk().await? {
            Some(b) => {
                self.buf.extend_from_slice(&b);
                Ok(())
            }
            None => Err(Error::InvalidArgument(
                "the multipart body ended early".into(),
            )),
        }
    }

    /// The next part's headers (what is left of the current part is skipped).
    pub async fn next_part(&mut self) -> Result<Option<PartHead>, Error> {
        loop {
            match self.at {
                At::Done => return Ok(None),
                At::Body => while self.chunk().await?.is_some() {},
                At::Preamble => match find(&self.buf, &self.delim) {
                    Some(i) => {
                        self.buf.drain(..i + self.delim.len());
                        self.at = At::Delimiter;
                    }
                    None => {
                        let keep = self.buf.len().min(self.delim.len());
                        self.buf.drain(..self.buf.len() - keep);
                        self.fill().await?;
                    }
                },
                At::Delimiter => return self.head().await,
            }
        }
    }

    /// After a delimiter: the end of the body, or a part's headers.
    async fn head(&mut self) -> Result<Option<PartHead>, Error> {
        while self.buf.len() < 2 {
            self.fill().await?;
        }
        if self.buf.starts_with(b"--") {
            self.at = At::Done;
            return Ok(None);
        }
        loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                let head = take_front(&mut self.buf, i + 4);
                self.at = At::Body;
                return Ok(Some(parse_head(&String::from_utf8_lossy(&head))));
            }
            if self.buf.len() > MAX_HEAD {
                return Err(Error::InvalidArgument("part headers too long".into()));
            }
            self.fill().await?;
        }
    }
}

impl<S: Source + Send> Source for Multipart<S> {
    /// The current part's next bytes; `None` at its end.
    async fn chunk(&mut self) -> Result<Option<Bytes>, Error> {
        if self.at != At::Body {
            return Ok(None);
        }
        loop {
            if let Some(i) = find(&self.buf, &self.delim) {
                let data = take_front(&mut self.buf, i);
                self.buf.drain(..self.delim.len());
                self.at = At::Delimiter;
                if data.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(Bytes::from(data)));
            }
            if self.buf.len() > self.delim.len() {
                let n = self.buf.len() - self.delim.len();
                return Ok(Some(Bytes::from(take_front(&mut self.buf, n))));
            }
            self.fill().await?;
        }
    }
}

/// `Content-Disposition`'s `name` and `filename`.
fn parse_head(head: &str) -> PartHead {
    let mut out = PartHead::default();
    for line in head.split("\r\n") {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        if !k.trim().eq_ignore_ascii_case("content-disposition") {
            continue;
        }
        for param in split_params(v) {
            let Some((pk, pv)) = param.split_once('=') else {
                continue;
            };
            let value = unquote(pv.trim());
            match pk.trim().to_ascii_lowercase().as_str() {
                "name" => out.name = Some(value),
                "filename" => out.filename = Some(value),
                _ => {}
            }
        }
    }
    out
}

/// `;`-separated parameters, quotes respected.
fn split_params(v: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted, mut escaped) = (Vec::new(), String::new(), false, false);
    for c in v.chars() {
        match c {
            _ if escaped => {
                cur.push(c);
                escaped = false;
                continue;
            }
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ';' if !quoted => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out
}

fn unquote(v: &str) -> String {
    let Some(inner) = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) else {
        return v.to_string();
    };
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes handed out in pieces of `n`.
    struct Pieces(Vec<u8>, usize);

    impl Source for Pieces {
        async fn chunk(&mut self) -> Result<Option<Bytes>, Error> {
            if self.0.is_empty() {
                return Ok(None);
            }
            let n = self.1.min(self.0.len());
            Ok(Some(Bytes::from(self.0.drain(..n).collect::<Vec<u8>>())))
        }
    }

    async fn parts(body: &[u8], piece: usize) -> Result<Vec<(PartHead, Vec<u8>)>, Error> {
        let mut m = Multipart::new(Pieces(body.to_vec(), piece), "XyZ");
        let mut out = Vec::new();
        while let Some(head) = m.next_part().await? {
            let mut data = Vec::new();
            while let Some(c) = m.chunk().await? {
                data.extend_from_slice(&c);
            }
            out.push((head, data));
        }
        Ok(out)
    }

    const BODY: &[u8] = b"preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/a;b.txt\"\r\nContent-Type: text/plain\r\n\r\nA\r\n--X\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"rel/b.bin\"\r\n\r\n\x00\xff\r\n--XyZ--\r\n";

    #[tokio::test]
    async fn parts_come_out_whole_however_the_body_is_cut() {
        for piece in [1, 2, 3, 7, 64, 4096] {
            let p = parts(BODY, piece).await.unwrap();
            assert_eq!(p.len(), 2, "piece {piece}");
            assert_eq!(p[0].0.filename.as_deref(), Some("/home/user/a;b.txt"));
            assert_eq!(p[0].1, b"A\r\n--X");
            assert_eq!(p[1].0.filename.as_deref(), Some("rel/b.bin"));
            assert_eq!(p[1].1, b"\x00\xff");
        }
    }

    #[tokio::test]
    async fn broken_bodies_are_errors_not_hangs() {
        assert!(
            parts(b"--XyZ\r\nContent-Disposition: form-data\r\n\r\nabc", 3)
                .await
                .is_err()
        );
        assert!(parts(b"no delimiter at all", 4).await.is_err());
        let long_head = [b"--XyZ\r\n".to_vec(), vec![b'a'; MAX_HEAD + 10]].concat();
        assert!(parts(&long_head, 1000).await.is_err());
    }

    #[test]
    fn the_search_finds_the_first_whole_match() {
        assert_eq!(find(b"ab\r\r\n--x", b"\r\n--x"), Some(3));
        assert_eq!(find(b"\r\n--", b"\r\n--x"), None);
        assert_eq!(find(b"", b"ab"), None);
        assert_eq!(find(b"xab", b"ab"), Some(1));
        let mut v = b"hello".to_vec();
        assert_eq!(take_front(&mut v, 2), b"he");
        assert_eq!(v, b"llo");
    }

    #[test]
    fn boundaries_are_read_from_the_content_type() {
        assert_eq!(
            boundary("multipart/form-data; boundary=\"abc\"").as_deref(),
            Some("abc")
        );
        assert_eq!(boundary("application/octet-stream"), None);
        assert_eq!(boundary("multipart/form-data"), None);
    }
}
