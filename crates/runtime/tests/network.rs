//! Sandbox networking against a fake "internet": a network namespace the test creates,
//! routed from the host, with a TCP server in it. Nothing outside the machine is used.

mod common;

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{sh, TestEnv};
use runtime::{Cidr, NetworkMode};

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().unwrap();
    assert!(st.success(), "ip {args:?}");
}

/// A netns reachable from the host over a veth, serving "hello" on port 8080 of `addr`.
struct FakeInternet {
    ns: String,
    host_if: String,
    addr: Ipv4Addr,
    stop: Arc<AtomicBool>,
    /// Held by a fake metadata server for its lifetime; released after `drop` cleaned up.
    _lock: Option<nix::fcntl::Flock<std::fs::File>>,
}

/// The host has one route to 169.254.169.254, so the tests that stand one up (here and in
/// tests/security) take this lock while theirs lives and can run side by side.
const METADATA_LOCK: &str = "/run/lock/sandfork-test-metadata.lock";

fn metadata_lock() -> nix::fcntl::Flock<std::fs::File> {
    std::fs::create_dir_all("/run/lock").unwrap();
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(METADATA_LOCK)
        .unwrap();
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .unwrap()
}

impl FakeInternet {
    /// A host in 198.19.0.0/16 (half of the benchmarking range the sandbox pool is not in).
    fn start() -> FakeInternet {
        let slot = unique() % 16384;
        let base = u32::from(Ipv4Addr::new(198, 19, 0, 0)) + slot * 4;
        Self::at(slot, Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
    }

    /// A fake cloud metadata server: 169.254.169.254, routed from the host.
    fn metadata() -> FakeInternet {
        let lock = metadata_lock();
        let slot = unique() % 16384;
        let host = Ipv4Addr::from(u32::from(Ipv4Addr::new(169, 254, 64, 0)) + slot);
        let mut me = Self::at(slot, host, Ipv4Addr::new(169, 254, 169, 254));
        me._lock = Some(lock);
        me
    }

    /// A netns holding `addr`, linked to the host (which holds `host_addr`) by a veth with
    /// a host route each way.
    fn at(slot: u32, host_addr: Ipv4Addr, addr: Ipv4Addr) -> FakeInternet {
        let me = FakeInternet {
            ns: format!("sft-net-{slot:x}"),
            host_if: format!("sfti{slot:x}"),
            addr,
            stop: Arc::new(AtomicBool::new(false)),
            _lock: None,
        };
        ip(&["netns", "add", &me.ns]);
        ip(&[
            "link",
            "add",
            &me.host_if,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &me.ns,
        ]);
        ip(&[
            "addr",
            "add",
            &format!("{host_addr}/32"),
            "dev",
            &me.host_if,
        ]);
        ip(&["link", "set", &me.host_if, "up"]);
        ip(&["route", "add", &format!("{addr}/32"), "dev", &me.host_if]);
        let ns = |args: &[&str]| ip(&[&["-n", me.ns.as_str()], args].concat());
        ns(&["addr", "add", &format!("{addr}/32"), "dev", "eth0"]);
        ns(&["link", "set", "eth0", "up"]);
        ns(&["route", "add", &format!("{host_addr}/32"), "dev", "eth0"]);
        ns(&["route", "add", "default", "via", &host_addr.to_string()]);
        let listener = listen_in(&me.ns, addr, 8080);
        let stop = me.stop.clone();
        std::thread::spawn(move || serve(listener, stop));
        me
    }

    fn cidr(&self) -> Cidr {
        format!("{}/32", self.addr).parse().unwrap()
    }
}

fn unique() -> u32 {
    std::process::id()
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
}

/// Binds a listener inside netns `ns` (from a thread that joins it, so the test process
/// stays where it is).
fn listen_in(ns: &str, addr: Ipv4Addr, port: u16) -> TcpListener {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let f = std::fs::File::open(path).unwrap();
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let l = TcpListener::bind((addr, port)).unwrap();
        l.set_nonblocking(true).unwrap();
        l
    })
    .join()
    .unwrap()
}

fn serve(listener: TcpListener, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut s, _)) => {
                let _ = s.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 6\r\n\r\nhello\n");
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

impl Drop for FakeInternet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// Fetches the fake internet's page (busybox's static wget cannot resolve even numeric
/// hosts without NSS, so HTTP by hand over nc).
fn wget(addr: Ipv4Addr) -> String {
    format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {addr} 8080 | tail -n 1; echo rc=$?")
}

fn internet(allow_out: Vec<Cidr>, deny_out: Vec<Cidr>) -> NetworkMode {
    NetworkMode::Internet {
        allow_out,
        deny_out,
        by_name: None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn internet_reaches_what_it_names_but_not_the_host() {
    let env = TestEnv::new();
    let net = FakeInternet::start();
    let mut spec = env.spec("inet");
    spec.network = internet(vec![net.cidr()], vec![]);
    let sb = env.runtime.create(spec).await.unwrap();
    let agent = sb.agent();
    let (_, out, _) = sh(&agent, &wget(net.addr)).await;
    assert_eq!(out, "hello\nrc=0\n");
    // The host's usable resolvers, read-only.
    let host_resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let (_, resolv, _) = sh(&agent, "cat /etc/resolv.conf").await;
    assert_eq!(resolv, runtime::net::resolv_conf(&host_resolv));
    let (code, _, _) = sh(&agent, "echo x > /etc/resolv.conf").await;
    assert_ne!(code, Some(0));
    // A service on the host, listening on every address, is out of reach.
    let host_listener = TcpListener::bind(("0.0.0.0", 0)).unwrap();
    let port = host_listener.local_addr().unwrap().port();
    let gw = Ipv4Addr::from(u32::from(sb.address.unwrap()) - 1);
    let script = format!("echo x | nc -w 2 {gw} {port} && echo reached; echo done");
    let (_, out, _) = sh(&agent, &script).await;
    assert_eq!(out.trim_end().lines().last(), Some("done"));
    assert!(!out.contains("reached"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn private_and_link_local_ranges_are_denied_unless_named() {
    let env = TestEnv::new();
    let metadata = FakeInternet::metadata();
    let benchmark = FakeInternet::start();
    // With no lists: the cloud metadata address and a guarded range are out of reach.
    let mut spec = env.spec("guarded");
    spec.network = internet(vec![], vec![]);
    let open = env.runtime.create(spec).await.unwrap();
    for addr in [metadata.addr, benchmark.addr] {
        let (_, out, _) = sh(&open.agent(), &wget(addr)).await;
        assert!(!out.contains("hello"), "{addr} reached: {out}");
    }
    // Named in the allow list, the metadata server answers (so the block above was the
    // rule, not a broken route).
    let mut spec = env.spec("named");
    spec.network = internet(vec![metadata.cidr()], vec![]);
    let named = env.runtime.create(spec).await.unwrap();
    let (_, out, _) = sh(&named.agent(), &wget(metadata.addr)).await;
    assert_eq!(out, "hello\nrc=0\n");
    // And the ruleset says so: the guarded ranges are dropped after the user's lists.
    let rules = Command::new("nft")
        .args(["list", "table", "inet", "sandfork"])
        .output()
        .unwrap();
    let rules = String::from_utf8_lossy(&rules.stdout);
    for range in [
        "10.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.168.0.0/16",
    ] {
        assert!(rules.contains(range), "{range} not guarded:\n{rules}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn deny_out_wins_and_allow_out_restricts() {
    let env = TestEnv::new();
    let net = FakeInternet::start();
    let me = net.cidr();
    let mut spec = env.spec("deny");
    spec.network = NetworkMode::Internet {
        allow_out: vec![me],
        deny_out: vec![me],
        by_name: None,
    };
    let denied = env.runtime.create(spec).await.unwrap();
    let (_, out, _) = sh(&denied.agent(), &wget(net.addr)).await;
    assert!(!out.contains("hello"), "{out}");
    let mut spec = env.spec("allow");
    let other: Cidr = "203.0.113.0/24".parse().unwrap();
    spec.network = NetworkMode::Internet {
        allow_out: vec![other],
        deny_out: vec![],
        by_name: None,
    };
    let restricted = env.runtime.create(spec).await.unwrap();
    let (_, out, _) = sh(&restricted.agent(), &wget(net.addr)).await;
    assert!(!out.contains("hello"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_cannot_reach_each_other() {
    let env = TestEnv::new();
    let internet = NetworkMode::Internet {
        allow_out: vec![],
        deny_out: vec![],
        by_name: None,
    };
    let mut a = env.spec("peer-a");
    a.network = internet.clone();
    let mut b = env.spec("peer-b");
    b.network = internet;
    let a = env.runtime.create(a).await.unwrap();
    let b = env.runtime.create(b).await.unwrap();
    let b_agent = b.agent();
    let server = tokio::spawn(async move {
        let mut r = common::req("/bin/sh", &["-c", "nc -l -p 9000"]);
        r.timeout_ms = Some(4000);
        b_agent.exec_collect(r, 1024).await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let script = format!(
        "echo x | nc -w 2 {} 9000 && echo reached; echo done",
        b.address.unwrap()
    );
    let (_, out, _) = sh(&a.agent(), &script).await;
    assert!(!out.contains("reached"), "{out}");
    let got = server.await.unwrap();
    assert!(got.stdout.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn none_has_only_loopback() {
    let env = TestEnv::new();
    let _net = FakeInternet::start();
    let sb = env.runtime.create(env.spec("none")).await.unwrap();
    let (_, routes, _) = sh(
        &sb.agent(),
        "ip route; ip -o link | grep -v ': lo:' | wc -l",
    )
    .await;
    assert_eq!(routes.trim(), "0");
    let (_, out, _) = sh(&sb.agent(), &wget(_net.addr)).await;
    assert!(!out.contains("hello"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn destroy_leaves_nothing_behind() {
    let env = TestEnv::new();
    let mut spec = env.spec("gone");
    spec.network = NetworkMode::Internet {
        allow_out: vec![],
        deny_out: vec!["10.0.0.0/8".parse().unwrap()],
        by_name: None,
    };
    let id = spec.id.clone();
    let sb = env.runtime.create(spec).await.unwrap();
    let info = env.runtime.inspect(&id).await.unwrap();
    let pid = info.pid.unwrap();
    let host_if = format!(
        "sfh{:x}",
        (u32::from(sb.address.unwrap()) - u32::from(Ipv4Addr::new(198, 18, 0, 0))) / 4
    );
    assert!(std::path::Path::new(&format!("/sys/class/net/{host_if}")).exists());
    // What must go is there before: the disk server and the loop device.
    assert!(processes_mentioning(&id));
    let loops = Command::new("losetup").arg("-a").output().unwrap();
    assert!(String::from_utf8_lossy(&loops.stdout).contains(&id));
    env.runtime.destroy(&id).await.unwrap();
    env.runtime.destroy(&id).await.unwrap();
    assert!(!sb.dir.exists());
    assert!(!runtime::net::netns_path(&format!("sf-{id}")).exists());
    assert!(!std::path::Path::new(&format!("/sys/class/net/{host_if}")).exists());
    assert!(gone_soon(pid, &id), "the sandbox's init outlived destroy");
    assert!(!std::path::Path::new(&format!("/sys/fs/cgroup/pids/sandfork/{id}")).exists());
    assert!(!std::path::Path::new(&format!("/sys/fs/cgroup/unified/sandfork/{id}")).exists());
    let rules = Command::new("nft")
        .args(["list", "table", "inet", "sandfork"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&rules.stdout).contains(&host_if));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&id), "a mount (ext4 or FUSE) is left");
    let loops = Command::new("losetup").arg("-a").output().unwrap();
    assert!(
        !String::from_utf8_lossy(&loops.stdout).contains(&id),
        "a loop device is left"
    );
    assert!(
        !processes_mentioning(&id),
        "a process (disk server) is left"
    );
    let runc = Command::new("runc")
        .arg("--root")
        .arg(env.runtime.layout().runc_root())
        .args(["list", "-q"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&runc.stdout).trim().is_empty());
}

/// Whether any process's command line mentions `needle`.
fn processes_mentioning(needle: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmdline).contains(needle)
    })
}

/// Whether `pid` is gone (or reused by another process) within a second; a zombie waits
/// for its reaper, the host's init.
fn gone_soon(pid: u32, id: &str) -> bool {
    (0..100).any(|_| {
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat.split(' ').nth(2) == Some("Z");
        std::thread::sleep(Duration::from_millis(10));
        !cg.contains(id) || zombie
    })
}

/// Other host tools beside a live daemon: `ip netns add` re-mounts /run/netns over itself,
/// and `ip netns exec` starts a process in a mount namespace of its own, with copies of
/// every mount of the host's — the sandbox's disk, FUSE and tmpfs mounts among them.
/// Deleting the sandbox still converges.
#[tokio::test(flavor = "multi_thread")]
async fn delete_converges_beside_ip_netns_add_and_exec() {
    let env = TestEnv::new();
    let mut spec = env.spec("beside");
    spec.network = internet(vec![], vec![]);
    let id = spec.id.clone();
    env.runtime.create(spec).await.unwrap();
    let ns = format!("sft-other-{:x}", unique() % 65536);
    ip(&["netns", "add", &ns]);
    let mut other = Command::new("ip")
        .args(["netns", "exec", &ns, "sleep", "30"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let destroyed = env.runtime.destroy(&id).await;
    let _ = other.kill();
    let _ = other.wait();
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    destroyed.expect("delete converges");
    assert!(!runtime::net::netns_path(&format!("sf-{id}")).exists());
    assert!(env.runtime.list().await.unwrap().is_empty());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&id), "a mount is left");
}
