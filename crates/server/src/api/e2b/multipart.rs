//! Upload bodies, streamed: a request body (gzip-decoded when it says so) bounded by the
//! daemon's upload limit, and a `multipart/form-data` form over it (parsed by `multer`)
//! that hands out each part's bytes as they arrive.

use std::io::Write;

use axum::body::{Body, BodyDataStream, Bytes};
use flate2::write::GzDecoder;
use futures::StreamExt;

use crate::error::Error;

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

    /// Decoded bytes of one raw chunk (maybe none yet); a plain body's chunk as it came.
    fn decode(&mut self, raw: Bytes) -> Result<Bytes, Error> {
        let Some(gz) = &mut self.gzip else {
            return Ok(raw);
        };
        gz.write_all(&raw)
            .map_err(|e| Error::InvalidArgument(format!("invalid gzip body: {e}")))?;
        Ok(Bytes::from(std::mem::take(gz.get_mut())))
    }

    fn finish(&mut self) -> Result<Bytes, Error> {
        let Some(gz) = &mut self.gzip else {
            return Ok(Bytes::new());
        };
        gz.try_finish()
            .map_err(|e| Error::InvalidArgument(format!("invalid gzip body: {e}")))?;
        Ok(Bytes::from(std::mem::take(gz.get_mut())))
    }
}

impl Source for Reader {
    async fn chunk(&mut self) -> Result<Option<Bytes>, Error> {
        while !self.done {
            let out = match self.stream.next().await {
                Some(Ok(raw)) => self.decode(raw)?,
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
                return Ok(Some(out));
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

/// A `multipart/form-data` body, its parts one after another.
pub struct Multipart {
    form: multer::Multipart<'static>,
}

/// One part of a [`Multipart`]: its headers and a [`Source`] of its bytes.
pub struct Part {
    pub head: PartHead,
    field: multer::Field<'static>,
}

/// The boundary of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    multer::parse_boundary(content_type)
        .ok()
        .filter(|b| !b.is_empty() && b.len() <= 200)
}

/// A body error as the daemon names it: the source's own (a size limit keeps its 413),
/// else what was malformed.
fn form_error(e: multer::Error) -> Error {
    if let multer::Error::StreamReadFailed(inner) = e {
        return match inner.downcast::<Error>() {
            Ok(own) => *own,
            Err(other) => Error::InvalidArgument(format!("invalid multipart body: {other}")),
        };
    }
    Error::InvalidArgument(format!("invalid multipart body: {e}"))
}

impl Multipart {
    pub fn new<S: Source + Send + 'static>(src: S, boundary: &str) -> Self {
        let stream = futures::stream::unfold(Some(src), |src| async move {
            let mut src = src?;
            match src.chunk().await {
                Ok(Some(b)) => Some((Ok(b), Some(src))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        });
        Multipart {
            form: multer::Multipart::new(stream, boundary),
        }
    }

    /// The next part (what is left of the one before is skipped); `None` after the last.
    pub async fn next_part(&mut self) -> Result<Option<Part>, Error> {
        let Some(field) = self.form.next_field().await.map_err(form_error)? else {
            return Ok(None);
        };
        let head = PartHead {
            name: field.name().map(str::to_string),
            filename: field.file_name().map(str::to_string),
        };
        Ok(Some(Part { head, field }))
    }
}

impl Source for Part {
    /// The part's next bytes; `None` at its end.
    async fn chunk(&mut self) -> Result<Option<Bytes>, Error> {
        self.field.chunk().await.map_err(form_error)
    }
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
        while let Some(mut part) = m.next_part().await? {
            let mut data = Vec::new();
            while let Some(c) = part.chunk().await? {
                data.extend_from_slice(&c);
            }
            out.push((part.head, data));
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
        let long_head = [b"--XyZ\r\n".to_vec(), vec![b'a'; 20 << 10]].concat();
        assert!(parts(&long_head, 1000).await.is_err());
    }

    /// A source that fails with the daemon's own error after some bytes.
    struct Refuses(bool);

    impl Source for Refuses {
        async fn chunk(&mut self) -> Result<Option<Bytes>, Error> {
            if std::mem::replace(&mut self.0, true) {
                return Err(Error::TooLarge("Upload exceeds 10 bytes".into()));
            }
            Ok(Some(Bytes::from_static(
                b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nabc",
            )))
        }
    }

    #[tokio::test]
    async fn the_sources_own_error_comes_through() {
        // However far the parser has read ahead when the source fails (in the headers or
        // the part's bytes), the error is the source's own, so a limit keeps its 413.
        async fn read(m: &mut Multipart) -> Result<(), Error> {
            while let Some(mut part) = m.next_part().await? {
                while part.chunk().await?.is_some() {}
            }
            Ok(())
        }
        let got = read(&mut Multipart::new(Refuses(false), "XyZ")).await;
        assert!(matches!(got, Err(Error::TooLarge(_))), "{got:?}");
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
