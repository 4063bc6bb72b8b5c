//! Hostile input: arbitrary and mutated frames decode to a value or an error, never a panic.

use proto::agent::*;

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let msgs = [
        Message::Request(Request::Exec(ExecRequest {
            command: "ls".into(),
            args: vec!["-l".into()],
            env: vec![("A".into(), "B".into())],
            ..Default::default()
        })),
        Message::Processes(vec![]),
        Message::Output {
            stream: OutputStream::Stdout,
            offset: 9,
            data: vec![1; 40],
        },
        Message::Request(Request::SetIdentity(Identity {
            sandbox_id: "s".into(),
            fork_index: 1,
            seed: vec![1, 2],
            parent_snapshot_id: None,
            env: vec![],
        })),
    ];
    msgs.iter()
        .map(|m| encode_frame(m).expect("encodes"))
        .collect()
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let len = (rng.next() % 64) as usize;
        let mut buf: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let _ = decode_frame(&buf);
        let _ = decode_payload(&buf);
        if buf.len() >= 4 {
            buf[..4].copy_from_slice(&((len - 4) as u32).to_le_bytes());
            let _ = decode_frame(&buf);
        }
    }
}

#[test]
fn mutated_frames_never_panic() {
    let mut rng = Rng(42);
    for seed in seeds() {
        for _ in 0..5_000 {
            let mut buf = seed.clone();
            for _ in 0..1 + rng.next() % 4 {
                let i = 4 + (rng.next() as usize) % (buf.len() - 4);
                buf[i] = rng.next() as u8;
            }
            let _ = decode_frame(&buf);
        }
    }
}

#[test]
fn huge_announced_lengths_are_refused_cheaply() {
    // A varint claiming a 4 GiB byte string inside a small frame must fail, not allocate.
    let payload = [1u8, 0xff, 0xff, 0xff, 0xff, 0x0f];
    assert!(matches!(
        decode_payload(&payload),
        Err(ProtoError::Malformed(_))
    ));
    let prefix = (MAX_FRAME as u32 + 1).to_le_bytes();
    assert!(matches!(
        payload_len(prefix),
        Err(ProtoError::FrameTooLarge(_))
    ));
}
