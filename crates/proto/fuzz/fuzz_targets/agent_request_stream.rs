//! A connection's bytes as the agent reads them (host → agent): the preamble, then frames
//! until the stream ends or a frame is refused, through the agent's own frame reader.
//! Any bytes yield messages or a typed error, never a panic; the reader stops at the end
//! of the stream; no read allocates beyond the frame limit.
#![no_main]

use std::sync::OnceLock;

use proto::codec::FrameReader;
use libfuzzer_sys::fuzz_target;
use proto::agent::{encode_frame, Message, MAX_FRAME};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
    })
}

/// Reads like the agent's connection handler: a preamble, a request, then the request's
/// byte stream (`Data`* `Eof`); returns the messages read.
async fn read_connection(mut bytes: &[u8]) -> Vec<Message> {
    let mut reader = FrameReader::new(&mut bytes);
    let mut seen = Vec::new();
    if reader.read_preamble().await.is_err() {
        return seen;
    }
    while let Ok(Some(msg)) = reader.read().await {
        let first = seen.is_empty();
        let valid = match &msg {
            Message::Request(_) => first,
            Message::Data(_) | Message::Eof => !first,
            _ => false,
        };
        seen.push(msg);
        if !valid {
            break;
        }
    }
    seen
}

fuzz_target!(|data: &[u8]| {
    let total = data.len();
    for msg in runtime().block_on(read_connection(data)) {
        let frame = encode_frame(&msg).expect("a decoded message encodes");
        assert!(frame.len() <= total && frame.len() <= MAX_FRAME + 4);
    }
});
