//! Framing: preamble, length prefix, and the total decoder.

use super::{Message, MAX_FRAME, PROTOCOL_VERSION};

/// Why bytes could not be turned into a message (or a message into bytes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME} bytes")]
    FrameTooLarge(usize),
    #[error("frame is truncated: {expected} bytes announced, {actual} present")]
    Truncated { expected: usize, actual: usize },
    #[error("malformed frame payload: {0}")]
    Malformed(String),
    #[error("frame payload has {0} trailing bytes")]
    TrailingBytes(usize),
    #[error("connection preamble has a bad magic number")]
    BadMagic,
    #[error("peer speaks protocol version {peer}, this side speaks {PROTOCOL_VERSION}")]
    VersionMismatch { peer: u16 },
}

/// The first bytes each side writes on a connection: `b"SFAG"` then the protocol version
/// as a little-endian `u16`. Fixed forever, so that any two versions can tell each other
/// apart before exchanging a single frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preamble {
    pub version: u16,
}

impl Preamble {
    pub const MAGIC: [u8; 4] = *b"SFAG";
    pub const LEN: usize = 6;

    /// The preamble of this build.
    pub fn current() -> Self {
        Self {
            version: PROTOCOL_VERSION,
        }
    }

    pub fn to_bytes(self) -> [u8; Self::LEN] {
        let v = self.version.to_le_bytes();
        let m = Self::MAGIC;
        [m[0], m[1], m[2], m[3], v[0], v[1]]
    }

    /// Parses a peer's preamble, whatever its version.
    pub fn parse(bytes: [u8; Self::LEN]) -> Result<Self, ProtoError> {
        if bytes[..4] != Self::MAGIC {
            return Err(ProtoError::BadMagic);
        }
        Ok(Self {
            version: u16::from_le_bytes([bytes[4], bytes[5]]),
        })
    }

    /// Parses a peer's preamble and requires it to speak this build's version.
    pub fn check(bytes: [u8; Self::LEN]) -> Result<Self, ProtoError> {
        let p = Self::parse(bytes)?;
        if p.version != PROTOCOL_VERSION {
            return Err(ProtoError::VersionMismatch { peer: p.version });
        }
        Ok(p)
    }
}

/// Validates a frame's 4-byte length prefix and returns the payload length.
pub fn payload_len(prefix: [u8; 4]) -> Result<usize, ProtoError> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > MAX_FRAME {
        return Err(ProtoError::FrameTooLarge(len));
    }
    Ok(len)
}

/// Decodes a payload (the bytes after the length prefix). The whole slice must be one
/// message.
pub fn decode_payload(payload: &[u8]) -> Result<Message, ProtoError> {
    if payload.len() > MAX_FRAME {
        return Err(ProtoError::FrameTooLarge(payload.len()));
    }
    let (msg, rest) = postcard::take_from_bytes::<Message>(payload)
        .map_err(|e| ProtoError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(ProtoError::TrailingBytes(rest.len()));
    }
    Ok(msg)
}

/// Decodes one complete frame (length prefix + payload). Safe on hostile input: a fuzz
/// target can feed it arbitrary bytes.
pub fn decode_frame(frame: &[u8]) -> Result<Message, ProtoError> {
    let Some((prefix, payload)) = frame.split_first_chunk::<4>() else {
        return Err(ProtoError::Truncated {
            expected: 4,
            actual: frame.len(),
        });
    };
    let len = payload_len(*prefix)?;
    match payload.len() {
        n if n < len => Err(ProtoError::Truncated {
            expected: len,
            actual: n,
        }),
        n if n > len => Err(ProtoError::TrailingBytes(n - len)),
        _ => decode_payload(payload),
    }
}

/// Appends one complete frame for `msg` to `buf`.
pub fn encode_into(msg: &Message, buf: &mut Vec<u8>) -> Result<(), ProtoError> {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    let taken = std::mem::take(buf);
    let mut out =
        postcard::to_extend(msg, taken).map_err(|e| ProtoError::Malformed(e.to_string()))?;
    let len = out.len() - start - 4;
    if len > MAX_FRAME {
        out.truncate(start);
        *buf = out;
        return Err(ProtoError::FrameTooLarge(len));
    }
    // `len <= MAX_FRAME` fits in a u32.
    out[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
    *buf = out;
    Ok(())
}

/// Encodes one complete frame for `msg`.
pub fn encode_frame(msg: &Message) -> Result<Vec<u8>, ProtoError> {
    let mut buf = Vec::new();
    encode_into(msg, &mut buf)?;
    Ok(buf)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let msg = Message::Data(vec![1, 2, 3]);
        let frame = encode_frame(&msg).unwrap();
        assert_eq!(decode_frame(&frame).unwrap(), msg);
        assert!(matches!(
            decode_frame(&frame[..frame.len() - 1]),
            Err(ProtoError::Truncated { .. })
        ));
        let mut long = frame.clone();
        long.push(0);
        assert!(matches!(
            decode_frame(&long),
            Err(ProtoError::TrailingBytes(1))
        ));
        let huge = [0xff, 0xff, 0xff, 0x7f, 0];
        assert!(matches!(
            decode_frame(&huge),
            Err(ProtoError::FrameTooLarge(_))
        ));
    }

    #[test]
    fn preamble() {
        let p = Preamble::current();
        assert_eq!(Preamble::check(p.to_bytes()).unwrap(), p);
        let other = Preamble {
            version: PROTOCOL_VERSION + 1,
        }
        .to_bytes();
        assert!(matches!(
            Preamble::check(other),
            Err(ProtoError::VersionMismatch { .. })
        ));
        assert_eq!(Preamble::parse(*b"HTTP/1"), Err(ProtoError::BadMagic));
    }
}
