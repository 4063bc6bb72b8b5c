//! The per-sandbox resolver, fed what a hostile sandbox or upstream sends:
//! - a query: it is dropped, refused at once (a reply that parses, to the same id, with
//!   an error code and no answer), or asked upstream; a name a deny rule matches, in any
//!   case and with or without its trailing dot, is never asked as allowed, and with an
//!   allow list nothing unlisted is asked at all;
//! - an upstream's answer: what the sandbox gets parses, carries the question's id, holds
//!   no AAAA record and no A record in a guarded, untrusted range in any section it reads
//!   (answers, additionals), and the addresses learned are exactly its A answers, with
//!   TTLs clamped.
//!
//! The first byte picks the side (bit 0) and the policy (bit 1: an allow list, bit 2:
//! closed); the rest is the DNS message.
#![no_main]

use std::net::Ipv4Addr;

use egress::fuzzing::{question, upstream_answer, Verdict};
use egress::{NamePattern, NameRules, Net4, Policy, ResolverConfig, MAX_LEARN_TTL, MIN_LEARN_TTL};
use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{RData, RecordType};
use libfuzzer_sys::fuzz_target;

fn policy(allow_list: bool, closed: bool) -> Policy {
    Policy {
        names: NameRules {
            allow: vec![
                NamePattern::Exact("ok.example".into()),
                NamePattern::Below("ok.example".into()),
            ],
            deny: vec![
                NamePattern::Exact("evil.example".into()),
                NamePattern::Below("bad.example".into()),
            ],
        },
        allow_list,
        closed,
    }
}

fn net(a: [u8; 4], prefix: u8) -> Net4 {
    Net4 {
        addr: Ipv4Addr::from(a),
        prefix,
    }
}

fn config() -> ResolverConfig {
    ResolverConfig {
        guarded: vec![
            net([10, 0, 0, 0], 8),
            net([127, 0, 0, 0], 8),
            net([169, 254, 0, 0], 16),
            net([192, 168, 0, 0], 16),
        ],
        trusted: vec![net([10, 1, 0, 0], 16)],
        ..ResolverConfig::default()
    }
}

fn blocked(config: &ResolverConfig, a: Ipv4Addr) -> bool {
    config.guarded.iter().any(|n| n.contains(a)) && !config.trusted.iter().any(|n| n.contains(a))
}

fn check_query(msg: &[u8], allow_list: bool, closed: bool) {
    let Some(outcome) = question(msg, &policy(allow_list, closed)) else {
        return;
    };
    let query = Message::from_vec(msg).expect("an answered query parses");
    match outcome {
        Err(reply) => {
            let reply = Message::from_vec(&reply).expect("the refusal parses");
            assert_eq!(reply.id(), query.id());
            assert_eq!(reply.message_type(), MessageType::Response);
            assert_ne!(reply.response_code(), ResponseCode::NoError);
            assert!(reply.answers().is_empty());
        }
        Ok((name, verdict)) => {
            assert!(!closed, "a closed resolver asked upstream");
            assert_eq!(query.queries().len(), 1);
            // Both sides drop exactly one trailing dot, as the rules do: a last label that
            // is itself an escaped dot (`a\..`) keeps its own.
            let bare = |n: &str| {
                let n = n.to_ascii_lowercase();
                n.strip_suffix('.').map(str::to_owned).unwrap_or(n)
            };
            let asked = bare(&query.queries()[0].name().to_ascii());
            assert_eq!(bare(&name), asked);
            if asked == "evil.example" || asked.ends_with(".bad.example") {
                assert_eq!(verdict, Verdict::Denied, "{name:?} not denied");
            }
            if allow_list {
                assert_ne!(verdict, Verdict::Unlisted, "{name:?} unlisted asked");
            }
        }
    }
}

fn check_answer(msg: &[u8]) {
    let config = config();
    let Some((sent, learned)) = upstream_answer(msg, &config, 0x5a5a) else {
        return;
    };
    let got = Message::from_vec(&sent).expect("what the sandbox gets parses");
    assert_eq!(got.id(), 0x5a5a);
    let mut a_answers = Vec::new();
    for (section, r) in got
        .answers()
        .iter()
        .map(|r| ("answer", r))
        .chain(got.additionals().iter().map(|r| ("additional", r)))
    {
        assert_ne!(r.record_type(), RecordType::AAAA, "AAAA {section} passed");
        if r.record_type() == RecordType::A {
            let RData::A(a) = r.data() else {
                panic!("an A {section} whose data is no address: {:?}", r.data());
            };
            assert!(!blocked(&config, a.0), "guarded {} passed ({section})", a.0);
            if section == "answer" {
                a_answers.push(a.0);
            }
        }
    }
    for (a, ttl) in &learned {
        assert!((MIN_LEARN_TTL..=MAX_LEARN_TTL).contains(ttl));
        assert!(!blocked(&config, *a), "guarded {a} learned");
    }
    let learned: Vec<Ipv4Addr> = learned.iter().map(|(a, _)| *a).collect();
    assert_eq!(learned, a_answers, "learned is not what the sandbox got");
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, msg)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        check_query(msg, mode & 2 != 0, mode & 4 != 0);
    } else {
        check_answer(msg);
    }
});
