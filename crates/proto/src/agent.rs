//! The host↔agent protocol: a versioned, length-prefixed binary framing over a Unix socket.
//!
//! A connection starts with a [`Preamble`] from each side (magic + [`PROTOCOL_VERSION`]);
//! then the host sends one [`Request`] frame and the two sides exchange [`Message`] frames
//! as the request defines (see `docs/agent-protocol.md`). Every frame is a little-endian
//! `u32` payload length followed by a postcard-encoded [`Message`]. Decoding is total: any
//! byte string yields a value or a [`ProtoError`], never a panic, and no allocation exceeds
//! the frame it came from.

mod frame;
mod messages;

pub use frame::{
    decode_frame, decode_payload, encode_frame, encode_into, payload_len, Preamble, ProtoError,
};
pub use messages::*;

/// Version of the wire format. Any change to the encoding of any [`Message`] bumps it (and
/// adds a new schema fixture); see `docs/agent-protocol.md`.
pub const PROTOCOL_VERSION: u16 = 2;

/// Largest payload a frame may carry, in either direction.
pub const MAX_FRAME: usize = 4 << 20;

/// Size of the data chunks ([`Message::Data`], [`Message::Output`]) both sides send.
pub const CHUNK_SIZE: usize = 64 << 10;

/// File name of the agent's socket inside the host-owned socket directory.
pub const SOCKET_NAME: &str = "agent.sock";

/// Where the runtime mounts the socket directory inside a sandbox.
pub const SANDBOX_SOCKET_DIR: &str = "/run/sandfork";
