//! Async framing over any byte stream: the preamble and length-prefixed [`Message`]s.

use crate::agent::{decode_payload, encode_into, payload_len, Message, Preamble, ProtoError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("connection I/O failed")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Proto(#[from] ProtoError),
    #[error("connection closed in the middle of a frame")]
    Truncated,
}

/// Reads frames; every length is checked against [`crate::agent::MAX_FRAME`] before any
/// allocation.
pub struct FrameReader<R> {
    inner: R,
    buf: Vec<u8>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            buf: Vec::new(),
        }
    }

    /// Reads the peer's preamble and requires this build's protocol version.
    pub async fn read_preamble(&mut self) -> Result<Preamble, CodecError> {
        let mut bytes = [0u8; Preamble::LEN];
        self.inner
            .read_exact(&mut bytes)
            .await
            .map_err(eof_is_truncated)?;
        Ok(Preamble::check(bytes)?)
    }

    /// The next frame, or `None` when the peer closed the connection between frames.
    pub async fn read(&mut self) -> Result<Option<Message>, CodecError> {
        let mut prefix = [0u8; 4];
        let first = self.inner.read(&mut prefix).await?;
        if first == 0 {
            return Ok(None);
        }
        self.inner
            .read_exact(&mut prefix[first..])
            .await
            .map_err(eof_is_truncated)?;
        let len = payload_len(prefix)?;
        self.buf.resize(len, 0);
        self.inner
            .read_exact(&mut self.buf)
            .await
            .map_err(eof_is_truncated)?;
        let msg = decode_payload(&self.buf);
        if self.buf.capacity() > 1 << 20 {
            self.buf = Vec::new();
        }
        Ok(Some(msg?))
    }
}

fn eof_is_truncated(e: std::io::Error) -> CodecError {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => CodecError::Truncated,
        _ => CodecError::Io(e),
    }
}

/// Writes frames through one reused buffer.
pub struct FrameWriter<W> {
    inner: W,
    buf: Vec<u8>,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            buf: Vec::new(),
        }
    }

    pub async fn write_preamble(&mut self) -> Result<(), CodecError> {
        self.inner
            .write_all(&Preamble::current().to_bytes())
            .await?;
        Ok(())
    }

    pub async fn send(&mut self, msg: &Message) -> Result<(), CodecError> {
        self.buf.clear();
        encode_into(msg, &mut self.buf)?;
        self.inner.write_all(&self.buf).await?;
        if self.buf.capacity() > 1 << 20 {
            self.buf = Vec::new();
        }
        Ok(())
    }

    /// Writes the preamble and one frame in a single write.
    pub async fn send_first(&mut self, msg: &Message) -> Result<(), CodecError> {
        self.buf.clear();
        self.buf.extend_from_slice(&Preamble::current().to_bytes());
        encode_into(msg, &mut self.buf)?;
        self.inner.write_all(&self.buf).await?;
        Ok(())
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }
}
