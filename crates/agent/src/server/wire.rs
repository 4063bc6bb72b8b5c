//! The two ends of one client connection as the handlers use them, and the error reply.

use proto::agent::{AgentError, Message};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use proto::codec::{FrameReader, FrameWriter};

pub type Reader = FrameReader<OwnedReadHalf>;
pub type Writer = FrameWriter<OwnedWriteHalf>;

/// Answers with `e` (a client that already left is not an error of ours).
pub async fn send_error(writer: &mut Writer, e: AgentError) {
    let _ = writer.send(&Message::Error(e)).await;
}
