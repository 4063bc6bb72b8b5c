//! The resolver one sandbox's DNS is sent to when its egress lists name hosts.
//!
//! It answers on the host end of the sandbox's link (UDP and TCP port 53; the host
//! redirects every port-53 packet of the sandbox here, whatever resolver it asked). For
//! each question it applies the name rules: a denied name gets NXDOMAIN (its addresses,
//! looked up upstream, are learned as denied), a name no allow rule matches gets NXDOMAIN
//! when the sandbox has an allow list, and anything else is forwarded upstream. From an
//! answer it drops AAAA records (sandboxes have IPv4 only, so clients fall back at once)
//! and A records in guarded ranges (private, link-local, the host's networks: a public
//! name that resolves there is a DNS rebinding attempt), unless a range is trusted.
//! The A records of an allowed name are learned — written into the sandbox's address set
//! through [`Learn`] — before the answer leaves, so the connection that follows finds its
//! address allowed; an address nobody resolved stays blocked. Denied names without a
//! wildcard are looked up at start, at every policy change and every minute after, so
//! their addresses are blocked before the sandbox asks for them (a wildcard's are blocked
//! once an answer shows them).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::rules::{NamePattern, NameRules, Verdict};

/// Learned addresses are kept at least this long, whatever the answer's TTL.
pub const MIN_LEARN_TTL: u32 = 60;
/// And at most this long.
pub const MAX_LEARN_TTL: u32 = 86_400;

/// An IPv4 network, for the guarded and trusted ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Net4 {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Net4 {
    pub fn contains(&self, a: Ipv4Addr) -> bool {
        let mask = if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix.min(32)))
        };
        u32::from(a) & mask == u32::from(self.addr) & mask
    }
}

/// Host-wide settings of every sandbox's resolver.
#[derive(Debug, Clone)]
pub struct ResolverConfig {
    /// Resolvers questions are forwarded to, tried in order.
    pub upstreams: Vec<SocketAddr>,
    /// Answers inside these ranges are dropped (rebinding protection)...
    pub guarded: Vec<Net4>,
    /// ...unless inside one of these (the operator's own private names).
    pub trusted: Vec<Net4>,
    /// How long one upstream may take to answer.
    pub upstream_timeout: Duration,
    /// Questions one sandbox may have in flight at once; more are dropped (UDP) or wait
    /// (TCP), so a flood from one sandbox cannot take the daemon's sockets.
    pub max_inflight: usize,
    /// TCP connections one sandbox may hold open at once.
    pub max_tcp: usize,
}

impl Default for ResolverConfig {
    fn default() -> Self {
        ResolverConfig {
            upstreams: Vec::new(),
            guarded: Vec::new(),
            trusted: Vec::new(),
            upstream_timeout: Duration::from_secs(3),
            max_inflight: 64,
            max_tcp: 16,
        }
    }
}

/// A sandbox's policy as its resolver sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    pub names: NameRules,
    /// The sandbox has an allow list of names: unlisted names are not resolved.
    pub allow_list: bool,
    /// The sandbox may reach nothing (it denies 0.0.0.0/0): no name is resolved, so
    /// nothing leaves through DNS either.
    pub closed: bool,
}

/// Addresses learned from one answer, each with how long it stays (seconds).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Learned {
    pub allowed: Vec<(Ipv4Addr, u32)>,
    pub denied: Vec<(Ipv4Addr, u32)>,
}

/// Where learned addresses go (the sandbox's nftables sets). Called on a blocking
/// thread; the answer waits for it.
pub trait Learn: Send + Sync + 'static {
    fn learn(&self, learned: &Learned) -> std::io::Result<()>;
}

/// One sandbox's resolver; stops when dropped.
pub struct Resolver {
    policy: Arc<RwLock<Arc<Policy>>>,
    tasks: tokio::sync::Mutex<JoinSet<()>>,
    addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    policy: Arc<RwLock<Arc<Policy>>>,
    /// Held (shared) while an answer's addresses are learned, and (exclusively) while the
    /// policy is replaced: an answer asked under a policy since replaced is learned only
    /// if the new one allows its name too, so a revocation's emptied sets stay empty of it.
    gate: tokio::sync::RwLock<()>,
    config: Arc<ResolverConfig>,
    learn: Arc<dyn Learn>,
}

impl Resolver {
    /// Binds UDP and TCP on `bind` and starts answering.
    pub async fn start(
        bind: SocketAddr,
        policy: Policy,
        config: Arc<ResolverConfig>,
        learn: Arc<dyn Learn>,
    ) -> std::io::Result<Resolver> {
        let udp = Arc::new(bind_retrying(|| UdpSocket::bind(bind)).await?);
        let addr = udp.local_addr()?;
        let tcp = bind_retrying(|| TcpListener::bind(addr)).await?;
        let policy = Arc::new(RwLock::new(Arc::new(policy)));
        let shared = Arc::new(Shared {
            policy: policy.clone(),
            gate: tokio::sync::RwLock::new(()),
            config,
            learn,
        });
        refresh_denied(&shared).await;
        let mut tasks = JoinSet::new();
        tasks.spawn(serve_udp(udp, shared.clone()));
        tasks.spawn(serve_tcp(tcp, shared.clone()));
        tasks.spawn(keep_denied_fresh(shared.clone()));
        Ok(Resolver {
            policy,
            tasks: tokio::sync::Mutex::new(tasks),
            addr,
            shared,
        })
    }

    /// Where it answers.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces the policy; questions from now on meet the new one, and the addresses of
    /// its denied names are learned before this returns.
    pub async fn set_policy(&self, policy: Policy) {
        {
            let _learning = self.shared.gate.write().await;
            *self.policy.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(policy);
        }
        refresh_denied(&self.shared).await;
    }

    /// Stops answering and waits until its listening sockets are closed (a question
    /// still waiting on an upstream holds the UDP socket until it gives up).
    pub async fn shutdown(&self) {
        let mut tasks = self.tasks.lock().await;
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        self.tasks.get_mut().abort_all();
    }
}

/// Binds, retrying while the address is still held by a resolver that is going away (the
/// link's address is reused when a sandbox's lease passes to another).
async fn bind_retrying<T, F, Fut>(bind: F) -> std::io::Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = std::io::Result<T>>,
{
    let mut waited = Duration::ZERO;
    loop {
        match bind().await {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && waited < BIND_PATIENCE => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                waited += Duration::from_millis(50);
            }
            r => return r,
        }
    }
}

/// Longer than an upstream question may take, so a going resolver has let go by then.
const BIND_PATIENCE: Duration = Duration::from_secs(4);

/// How often the addresses of denied names are looked up again.
const DENIED_REFRESH: Duration = Duration::from_secs(MIN_LEARN_TTL as u64);

async fn keep_denied_fresh(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(DENIED_REFRESH).await;
        refresh_denied(&shared).await;
    }
}

/// Looks up every denied name without a wildcard (all at once, so a dead upstream costs
/// one timeout) and learns its addresses as denied.
async fn refresh_denied(shared: &Shared) {
    let policy = shared
        .policy
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut lookups = JoinSet::new();
    for pattern in &policy.names.deny {
        let NamePattern::Exact(name) = pattern else {
            continue;
        };
        let Ok(fqdn) = Name::from_ascii(format!("{name}.")) else {
            continue;
        };
        let config = shared.config.clone();
        lookups.spawn(async move {
            let mut q = Message::new();
            q.set_recursion_desired(true);
            q.add_query(Query::query(fqdn, RecordType::A));
            forward(&q, &config, false)
                .await
                .map(|answer| a_records(&answer))
                .unwrap_or_default()
        });
    }
    let mut denied = Vec::new();
    while let Some(found) = lookups.join_next().await {
        denied.extend(found.unwrap_or_default());
    }
    let learned = Learned {
        denied,
        ..Learned::default()
    };
    if let Err(code) = learn(shared, learned).await {
        tracing::warn!(?code, "dns: could not block the addresses of denied names");
    }
}

async fn serve_udp(sock: Arc<UdpSocket>, shared: Arc<Shared>) {
    let room = Arc::new(Semaphore::new(shared.config.max_inflight));
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, from) = match sock.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "dns: receive");
                continue;
            }
        };
        let Ok(permit) = room.clone().try_acquire_owned() else {
            continue; // flooded: the client retries
        };
        let (query, sock, shared) = (buf[..n].to_vec(), sock.clone(), shared.clone());
        tokio::spawn(async move {
            if let Some(answer) = answer(&query, &shared, false).await {
                let _ = sock.send_to(&answer, from).await;
            }
            drop(permit);
        });
    }
}

async fn serve_tcp(listener: TcpListener, shared: Arc<Shared>) {
    let room = Arc::new(Semaphore::new(shared.config.max_tcp));
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            continue;
        };
        let Ok(permit) = room.clone().try_acquire_owned() else {
            continue; // dropped: too many open at once
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _ = serve_tcp_conn(conn, &shared).await;
            drop(permit);
        });
    }
}

/// Length-prefixed questions, one at a time, until the client goes quiet for 10 s.
async fn serve_tcp_conn(mut conn: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let idle = Duration::from_secs(10);
    loop {
        let mut len = [0u8; 2];
        tokio::time::timeout(idle, conn.read_exact(&mut len)).await??;
        let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
        tokio::time::timeout(idle, conn.read_exact(&mut query)).await??;
        let Some(answer) = answer(&query, shared, true).await else {
            return Ok(());
        };
        let Ok(n) = u16::try_from(answer.len()) else {
            return Ok(());
        };
        conn.write_all(&n.to_be_bytes()).await?;
        conn.write_all(&answer).await?;
    }
}

/// The answer to one wire-format question; `None` for what is not a DNS query at all.
async fn answer(query: &[u8], shared: &Shared, tcp: bool) -> Option<Vec<u8>> {
    let msg = parse_query(query)?;
    let reply = match decide(&msg, shared, tcp).await {
        Ok(m) => m,
        Err(code) => refusal(&msg, code),
    };
    reply.to_vec().ok()
}

/// A wire-format question; `None` for what is not a DNS query at all.
fn parse_query(query: &[u8]) -> Option<Message> {
    let msg = Message::from_vec(query).ok()?;
    (msg.message_type() == MessageType::Query).then_some(msg)
}

fn refusal(query: &Message, code: ResponseCode) -> Message {
    let mut m = Message::error_msg(query.id(), query.op_code(), code);
    m.add_queries(query.queries().to_vec());
    m.set_recursion_desired(query.recursion_desired());
    m.set_recursion_available(true);
    m
}

/// The checks before anything goes upstream: the name asked and its verdict (a denied
/// name is still looked up, to learn its addresses), or the refusal's code.
fn screen(msg: &Message, policy: &Policy) -> Result<(String, Verdict), ResponseCode> {
    if msg.op_code() != OpCode::Query {
        return Err(ResponseCode::NotImp);
    }
    let [q] = msg.queries() else {
        return Err(ResponseCode::FormErr);
    };
    if policy.closed {
        return Err(ResponseCode::NXDomain);
    }
    let name = q.name().to_ascii();
    let verdict = policy.names.verdict(&name);
    if verdict == Verdict::Unlisted && policy.allow_list {
        return Err(ResponseCode::NXDomain);
    }
    Ok((name, verdict))
}

async fn decide(msg: &Message, shared: &Shared, tcp: bool) -> Result<Message, ResponseCode> {
    let policy = shared
        .policy
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let (name, verdict) = screen(msg, &policy)?;
    if verdict == Verdict::Denied {
        // Learn what the name resolves to, so connecting to it by address fails too.
        if let Ok(up) = forward(msg, &shared.config, tcp).await {
            let learned = Learned {
                denied: a_records(&up),
                ..Learned::default()
            };
            learn(shared, learned).await?;
        }
        return Err(ResponseCode::NXDomain);
    }
    let mut up = forward(msg, &shared.config, tcp)
        .await
        .map_err(|_| ResponseCode::ServFail)?;
    filter_answers(&mut up, &shared.config);
    if verdict == Verdict::Allowed {
        let _learning = shared.gate.read().await;
        let now = shared
            .policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let still = Arc::ptr_eq(&now, &policy)
            || (!now.closed && now.names.verdict(&name) == Verdict::Allowed);
        if !still {
            // Revoked while the upstream answered.
            return Err(ResponseCode::NXDomain);
        }
        let learned = Learned {
            allowed: a_records(&up),
            ..Learned::default()
        };
        learn(shared, learned).await?;
    }
    up.set_id(msg.id());
    Ok(up)
}

async fn learn(shared: &Shared, learned: Learned) -> Result<(), ResponseCode> {
    if learned.allowed.is_empty() && learned.denied.is_empty() {
        return Ok(());
    }
    let sink = shared.learn.clone();
    match tokio::task::spawn_blocking(move || sink.learn(&learned)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "dns: learning addresses failed");
            Err(ResponseCode::ServFail)
        }
        Err(_) => Err(ResponseCode::ServFail),
    }
}

/// A records of an answer section with their TTLs, clamped.
fn a_records(m: &Message) -> Vec<(Ipv4Addr, u32)> {
    m.answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some((a.0, r.ttl().clamp(MIN_LEARN_TTL, MAX_LEARN_TTL))),
            _ => None,
        })
        .collect()
}

/// Drops AAAA records and A records in guarded, untrusted ranges from every section.
fn filter_answers(m: &mut Message, config: &ResolverConfig) {
    // By the record's type, not its data's shape: an AAAA or A record with empty data
    // (RDLENGTH 0, which the parser takes for an update's) is dropped too.
    let keep = |r: &hickory_proto::rr::Record| match (r.record_type(), r.data()) {
        (RecordType::AAAA, _) => false,
        (RecordType::A, RData::A(a)) => {
            let a = a.0;
            !config.guarded.iter().any(|n| n.contains(a))
                || config.trusted.iter().any(|n| n.contains(a))
        }
        (RecordType::A, _) => false,
        _ => true,
    };
    m.answers_mut().retain(keep);
    m.additionals_mut().retain(keep);
}

/// Asks the upstreams in turn; over TCP when the client asked over TCP or the UDP answer
/// came back truncated.
async fn forward(msg: &Message, config: &ResolverConfig, tcp: bool) -> std::io::Result<Message> {
    let mut up = msg.clone();
    // A fresh id (and, per question, a fresh socket and port) so that an off-path
    // attacker cannot guess the answer's.
    let id = model::ids::random_bytes::<2>().map_err(std::io::Error::other)?;
    up.set_id(u16::from_ne_bytes(id));
    let wire = up
        .to_vec()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no upstream resolver");
    for &server in &config.upstreams {
        let attempt = async {
            let reply = if tcp {
                ask_tcp(server, &wire).await?
            } else {
                let r = ask_udp(server, &wire).await?;
                if r.truncated() {
                    ask_tcp(server, &wire).await?
                } else {
                    r
                }
            };
            if reply.id() != up.id() || reply.queries() != up.queries() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "answer does not match the question",
                ));
            }
            Ok(reply)
        };
        match tokio::time::timeout(config.upstream_timeout, attempt).await {
            Ok(Ok(reply)) => return Ok(reply),
            Ok(Err(e)) => last = e,
            Err(_) => {
                last = std::io::Error::new(std::io::ErrorKind::TimedOut, "upstream timed out")
            }
        }
    }
    Err(last)
}

async fn ask_udp(server: SocketAddr, wire: &[u8]) -> std::io::Result<Message> {
    let local: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let sock = UdpSocket::bind(local).await?;
    sock.connect(server).await?;
    sock.send(wire).await?;
    let mut buf = vec![0u8; 65_535];
    let n = sock.recv(&mut buf).await?;
    Message::from_vec(&buf[..n])
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

async fn ask_tcp(server: SocketAddr, wire: &[u8]) -> std::io::Result<Message> {
    let mut conn = TcpStream::connect(server).await?;
    let len = u16::try_from(wire.len())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "question too long"))?;
    conn.write_all(&len.to_be_bytes()).await?;
    conn.write_all(wire).await?;
    let mut len = [0u8; 2];
    conn.read_exact(&mut len).await?;
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    conn.read_exact(&mut buf).await?;
    Message::from_vec(&buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Entry points of crates/egress/fuzz: what the resolver does with the bytes it is sent,
/// by the sandbox and by an upstream, without sockets.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use super::*;
    pub use crate::rules::Verdict;

    /// A query from the sandbox: `None` when it gets no answer at all, `Some(Err(reply))`
    /// for a refusal sent at once, `Some(Ok((name, verdict)))` when it goes upstream.
    pub fn question(query: &[u8], policy: &Policy) -> Option<Result<(String, Verdict), Vec<u8>>> {
        let msg = parse_query(query)?;
        Some(match screen(&msg, policy) {
            Ok(asked) => Ok(asked),
            Err(code) => Err(refusal(&msg, code).to_vec().ok()?),
        })
    }

    /// The wire bytes the sandbox gets, and the A records learned with their TTLs.
    pub type Screened = (Vec<u8>, Vec<(Ipv4Addr, u32)>);

    /// An upstream's answer to question `id`: what the sandbox gets (`None`: nothing, as
    /// for an answer that does not parse) and the A records learned from it.
    pub fn upstream_answer(reply: &[u8], config: &ResolverConfig, id: u16) -> Option<Screened> {
        let mut up = Message::from_vec(reply).ok()?;
        filter_answers(&mut up, config);
        let learned = a_records(&up);
        up.set_id(id);
        Some((up.to_vec().ok()?, learned))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_dropped_by_type_whatever_their_data() {
        // Found by crates/egress/fuzz (dns_resolver): an AAAA record with RDLENGTH 0
        // parsed as an update's empty data and passed the filter.
        let mut wire = vec![
            0x12, 0x34, 0x81, 0x80, 0, 1, 0, 3, 0, 0, 0, 0, // header: 1 question, 3 answers
            3, b'w', b'w', b'w', 2, b'o', b'k', 0, 0, 1, 0, 1, // www.ok. A IN
        ];
        for (rtype, rdata) in [(28u8, &[][..]), (1, &[][..]), (1, &[93, 184, 216, 34][..])] {
            wire.extend([0xc0, 12, 0, rtype, 0, 1, 0, 0, 0, 60, 0, rdata.len() as u8]);
            wire.extend(rdata);
        }
        let mut m = Message::from_vec(&wire).expect("parses");
        assert_eq!(m.answers().len(), 3);
        filter_answers(&mut m, &ResolverConfig::default());
        let kept: Vec<_> = m.answers().iter().map(|r| r.record_type()).collect();
        assert_eq!(kept, [RecordType::A]);
        assert_eq!(
            a_records(&m),
            [(Ipv4Addr::new(93, 184, 216, 34), MIN_LEARN_TTL)]
        );
    }
}
