//! Any bytes from a peer decode to a message or an error; a decoded message re-encodes to
//! a frame that decodes to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::agent::{decode_frame, decode_payload, encode_frame};

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = decode_frame(data) {
        let frame = encode_frame(&msg).expect("a decoded message encodes");
        assert_eq!(decode_frame(&frame).expect("re-decodes"), msg);
    }
    let _ = decode_payload(data);
});
