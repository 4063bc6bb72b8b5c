//! The resolver against a real upstream on loopback: what it forwards, refuses, filters
//! and learns.

use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use egress::{
    parse_entry, Entry, Learn, Learned, NameRules, Net4, Policy, Resolver, ResolverConfig,
};
use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::net::UdpSocket;

/// An authoritative-ish upstream for a handful of `.test` names.
async fn upstream() -> SocketAddr {
    let sock = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let addr = sock.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let (n, from) = sock.recv_from(&mut buf).await.unwrap();
            let q = Message::from_vec(&buf[..n]).unwrap();
            let mut r = Message::new();
            r.set_id(q.id());
            r.set_message_type(MessageType::Response);
            r.add_queries(q.queries().to_vec());
            let query = &q.queries()[0];
            let name = query.name().clone();
            let a = |ip: [u8; 4]| {
                Record::from_rdata(name.clone(), 30, RData::A(A::from(Ipv4Addr::from(ip))))
            };
            match (name.to_ascii().as_str(), query.query_type()) {
                ("public.test.", RecordType::A) => {
                    r.add_answer(a([203, 0, 113, 5]));
                }
                ("private.test.", RecordType::A) => {
                    r.add_answer(a([198, 19, 1, 10]));
                }
                ("rebind.test.", RecordType::A) => {
                    r.add_answer(a([169, 254, 169, 254]));
                    r.add_answer(a([203, 0, 113, 6]));
                }
                ("bad.test.", RecordType::A) => {
                    r.add_answer(a([203, 0, 113, 66]));
                }
                ("slow.test.", RecordType::A) => {
                    // Answered half a second late: a policy can change meanwhile.
                    r.add_answer(a([203, 0, 113, 9]));
                    let (sock, bytes) = (sock.clone(), r.to_vec().unwrap());
                    tokio::spawn(async move {
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                        sock.send_to(&bytes, from).await.unwrap();
                    });
                    continue;
                }
                (_, RecordType::AAAA) => {
                    r.add_answer(Record::from_rdata(
                        name.clone(),
                        30,
                        RData::AAAA(AAAA::from_str("2001:db8::1").unwrap()),
                    ));
                }
                _ => {
                    r.set_response_code(ResponseCode::NXDomain);
                }
            }
            sock.send_to(&r.to_vec().unwrap(), from).await.unwrap();
        }
    });
    addr
}

#[derive(Default)]
struct Sink(Mutex<Vec<Learned>>);

impl Learn for Sink {
    fn learn(&self, learned: &Learned) -> std::io::Result<()> {
        self.0.lock().unwrap().push(learned.clone());
        Ok(())
    }
}

fn rules(allow: &[&str], deny: &[&str]) -> NameRules {
    let names = |l: &[&str]| {
        l.iter()
            .map(|s| match parse_entry(s).unwrap() {
                Entry::Name(p) => p,
                Entry::Address(a) => panic!("{a}"),
            })
            .collect()
    };
    NameRules {
        allow: names(allow),
        deny: names(deny),
    }
}

async fn ask(resolver: SocketAddr, name: &str, t: RecordType) -> Message {
    let mut q = Message::new();
    q.set_id(4242);
    q.set_recursion_desired(true);
    q.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.send_to(&q.to_vec().unwrap(), resolver).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let (n, _) = tokio::time::timeout(std::time::Duration::from_secs(5), sock.recv_from(&mut buf))
        .await
        .expect("an answer")
        .unwrap();
    let m = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(m.id(), 4242);
    m
}

fn addrs(m: &Message) -> Vec<Ipv4Addr> {
    m.answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

async fn start(policy: Policy) -> (Resolver, Arc<Sink>) {
    let config = ResolverConfig {
        upstreams: vec![upstream().await],
        guarded: vec![
            Net4 {
                addr: Ipv4Addr::new(169, 254, 0, 0),
                prefix: 16,
            },
            Net4 {
                addr: Ipv4Addr::new(198, 18, 0, 0),
                prefix: 15,
            },
        ],
        trusted: vec![Net4 {
            addr: Ipv4Addr::new(198, 19, 1, 0),
            prefix: 24,
        }],
        ..ResolverConfig::default()
    };
    let sink = Arc::new(Sink::default());
    let r = Resolver::start(
        "127.0.0.1:0".parse().unwrap(),
        policy,
        Arc::new(config),
        sink.clone(),
    )
    .await
    .unwrap();
    (r, sink)
}

#[tokio::test]
async fn allow_list_resolves_only_allowed_names_and_learns_their_addresses() {
    let policy = Policy {
        names: rules(&["public.test", "*.test"], &["bad.test"]),
        allow_list: true,
        closed: false,
    };
    let (r, sink) = start(policy).await;
    let at = r.local_addr();

    let m = ask(at, "public.test", RecordType::A).await;
    assert_eq!(m.response_code(), ResponseCode::NoError);
    assert_eq!(addrs(&m), [Ipv4Addr::new(203, 0, 113, 5)]);
    // A trusted private range passes; the metadata range never does.
    assert_eq!(
        addrs(&ask(at, "private.test", RecordType::A).await),
        [Ipv4Addr::new(198, 19, 1, 10)]
    );
    assert_eq!(
        addrs(&ask(at, "rebind.test", RecordType::A).await),
        [Ipv4Addr::new(203, 0, 113, 6)]
    );
    // IPv6 answers are dropped: the sandbox has no IPv6 route.
    let v6 = ask(at, "public.test", RecordType::AAAA).await;
    assert_eq!(v6.response_code(), ResponseCode::NoError);
    assert!(v6.answers().is_empty());
    // Denied wins over the wildcard; its address is learned as denied.
    assert_eq!(
        ask(at, "bad.test", RecordType::A).await.response_code(),
        ResponseCode::NXDomain
    );
    // Not on the allow list: not even asked upstream.
    assert_eq!(
        ask(at, "example.org", RecordType::A).await.response_code(),
        ResponseCode::NXDomain
    );

    let learned = sink.0.lock().unwrap().clone();
    let allowed: Vec<Ipv4Addr> = learned
        .iter()
        .flat_map(|l| l.allowed.iter().map(|a| a.0))
        .collect();
    let denied: Vec<Ipv4Addr> = learned
        .iter()
        .flat_map(|l| l.denied.iter().map(|a| a.0))
        .collect();
    assert_eq!(
        allowed,
        [
            Ipv4Addr::new(203, 0, 113, 5),
            Ipv4Addr::new(198, 19, 1, 10),
            Ipv4Addr::new(203, 0, 113, 6)
        ]
    );
    // Learned at start (a denied name without a wildcard is looked up unasked), and again
    // when the sandbox asked.
    assert_eq!(
        denied,
        [
            Ipv4Addr::new(203, 0, 113, 66),
            Ipv4Addr::new(203, 0, 113, 66)
        ]
    );
    assert!(learned
        .iter()
        .flat_map(|l| &l.allowed)
        .all(|(_, ttl)| *ttl >= egress::MIN_LEARN_TTL));
}

#[tokio::test]
async fn deny_only_resolves_the_rest_and_policy_changes_at_once() {
    let (r, sink) = start(Policy {
        names: rules(&[], &["*.test"]),
        allow_list: false,
        closed: false,
    })
    .await;
    let at = r.local_addr();
    assert_eq!(
        ask(at, "public.test", RecordType::A).await.response_code(),
        ResponseCode::NXDomain
    );
    assert_eq!(
        ask(at, "nowhere.example", RecordType::A)
            .await
            .response_code(),
        ResponseCode::NXDomain
    );
    assert!(sink.0.lock().unwrap().iter().all(|l| l.allowed.is_empty()));

    sink.0.lock().unwrap().clear();
    r.set_policy(Policy {
        names: rules(&["public.test"], &["bad.test"]),
        allow_list: true,
        closed: false,
    })
    .await;
    // The denied name's address is blocked before set_policy returns, unasked.
    let learned = sink.0.lock().unwrap().clone();
    assert_eq!(learned.len(), 1);
    assert_eq!(learned[0].denied[0].0, Ipv4Addr::new(203, 0, 113, 66));
    assert_eq!(
        addrs(&ask(at, "public.test", RecordType::A).await),
        [Ipv4Addr::new(203, 0, 113, 5)]
    );
}

#[tokio::test]
async fn a_closed_sandbox_resolves_nothing() {
    let (r, sink) = start(Policy {
        names: rules(&["public.test"], &[]),
        allow_list: true,
        closed: true,
    })
    .await;
    let at = r.local_addr();
    for name in ["public.test", "nowhere.example"] {
        assert_eq!(
            ask(at, name, RecordType::A).await.response_code(),
            ResponseCode::NXDomain
        );
    }
    assert!(sink.0.lock().unwrap().iter().all(|l| l.allowed.is_empty()));
}

#[tokio::test]
async fn garbage_gets_no_answer_and_the_resolver_keeps_serving() {
    let (r, _sink) = start(Policy {
        names: rules(&["public.test"], &[]),
        allow_list: true,
        closed: false,
    })
    .await;
    let at = r.local_addr();
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for junk in [&b""[..], b"\x00", &[0xffu8; 600][..]] {
        sock.send_to(junk, at).await.unwrap();
    }
    assert_eq!(
        addrs(&ask(at, "public.test", RecordType::A).await),
        [Ipv4Addr::new(203, 0, 113, 5)]
    );
}

#[tokio::test]
async fn a_shut_down_resolver_lets_go_of_its_address_for_the_next() {
    let (r, _sink) = start(Policy::default()).await;
    let at = r.local_addr();
    // A question in flight holds the socket; shutdown waits it out.
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut q = Message::new();
    q.add_query(Query::query(
        Name::from_ascii("public.test").unwrap(),
        RecordType::A,
    ));
    sock.send_to(&q.to_vec().unwrap(), at).await.unwrap();
    r.shutdown().await;
    let again = Resolver::start(
        at,
        Policy::default(),
        Arc::new(ResolverConfig {
            upstreams: vec![upstream().await],
            ..ResolverConfig::default()
        }),
        Arc::new(Sink::default()),
    )
    .await
    .expect("the address is free again");
    assert_eq!(
        addrs(&ask(again.local_addr(), "public.test", RecordType::A).await),
        [Ipv4Addr::new(203, 0, 113, 5)]
    );
}

#[tokio::test]
async fn an_answer_that_comes_after_its_name_was_revoked_is_not_learned() {
    let (r, sink) = start(Policy {
        names: rules(&["slow.test", "public.test"], &[]),
        allow_list: true,
        closed: false,
    })
    .await;
    let addr = r.local_addr();
    let asked = tokio::spawn(async move { ask(addr, "slow.test", RecordType::A).await });
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    r.set_policy(Policy {
        names: rules(&["public.test"], &[]),
        allow_list: true,
        closed: false,
    })
    .await;
    let answer = asked.await.unwrap();
    assert_eq!(answer.response_code(), ResponseCode::NXDomain, "{answer:?}");
    let learned: Vec<Learned> = sink.0.lock().unwrap().clone();
    assert!(
        learned.iter().all(|l| l
            .allowed
            .iter()
            .all(|(a, _)| *a != Ipv4Addr::new(203, 0, 113, 9))),
        "learned under the revoked policy: {learned:?}"
    );
}
