//! Writes the seed corpus of `dns_resolver` into `seeds/dns_resolver/`: queries (first
//! byte even) and upstream answers (odd) as resolvers send them.
//! `cargo run --example write_seeds` from crates/egress/fuzz.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{Name, RData, Record, RecordType};

fn query(name: &str, t: RecordType) -> Message {
    let mut m = Message::new();
    m.set_id(0x1234)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true);
    m.add_query(Query::query(Name::from_ascii(name).expect("name"), t));
    m
}

fn seed(mode: u8, m: &Message) -> Vec<u8> {
    [vec![mode], m.to_vec().expect("encode")].concat()
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/dns_resolver");
    std::fs::create_dir_all(&dir).expect("create seeds dir");
    let name = |s: &str| Name::from_ascii(s).expect("name");
    let mut answer = query("www.ok.example.", RecordType::A);
    answer.set_message_type(MessageType::Response);
    answer.add_answer(Record::from_rdata(
        name("www.ok.example."),
        300,
        RData::CNAME(CNAME(name("cdn.ok.example."))),
    ));
    for (ip, ttl) in [
        ([93, 184, 216, 34], 30),
        ([10, 0, 0, 1], 300),
        ([10, 1, 2, 3], 100_000),
    ] {
        answer.add_answer(Record::from_rdata(
            name("cdn.ok.example."),
            ttl,
            RData::A(A(Ipv4Addr::from(ip))),
        ));
    }
    answer.add_answer(Record::from_rdata(
        name("cdn.ok.example."),
        300,
        RData::AAAA(AAAA(Ipv6Addr::LOCALHOST)),
    ));
    answer.add_additional(Record::from_rdata(
        name("ns.ok.example."),
        300,
        RData::A(A(Ipv4Addr::new(192, 168, 1, 1))),
    ));
    let seeds = [
        (
            "query-allowed",
            seed(2, &query("www.ok.example.", RecordType::A)),
        ),
        (
            "query-denied",
            seed(0, &query("EVIL.example.", RecordType::A)),
        ),
        (
            "query-wildcard",
            seed(2, &query("x.y.bad.example", RecordType::AAAA)),
        ),
        (
            "query-unlisted",
            seed(2, &query("other.example.", RecordType::TXT)),
        ),
        (
            "query-closed",
            seed(4, &query("ok.example.", RecordType::A)),
        ),
        ("answer", seed(1, &answer)),
    ];
    for (n, bytes) in seeds {
        std::fs::write(dir.join(n), bytes).expect("write seed");
    }
}
