use std::path::PathBuf;

use super::*;
use crate::host::FakeHost;
use crate::spec::{ImageRef, Resources};

struct Env {
    _dir: tempfile::TempDir,
    layout: Layout,
    net: NetConfig,
    agent: PathBuf,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let net = NetConfig {
        pool: "10.77.0.0/28".parse().unwrap(),
        lease_dir: dir.path().join("leases"),
    };
    Env {
        layout: Layout::new(dir.path().join("data")),
        net,
        agent: dir.path().join("agent"),
        _dir: dir,
    }
}

fn ctx<'a>(env: &'a Env, host: &'a FakeHost) -> Ctx<'a> {
    Ctx {
        host,
        layout: &env.layout,
        net: &env.net,
        agent_bin: &env.agent,
        ready_timeout: Duration::from_secs(1),
        restore_images: None,
    }
}

pub(crate) fn spec(id: &str, network: NetworkMode) -> SandboxSpec {
    SandboxSpec {
        id: id.into(),
        image: ImageRef {
            name: "busybox".into(),
            layer: "L".into(),
            env: Default::default(),
            cwd: "/".into(),
            user: None,
        },
        resources: Resources::default(),
        env: Default::default(),
        network,
        volumes: Vec::new(),
    }
}

fn internet() -> NetworkMode {
    NetworkMode::Internet {
        allow_out: vec![],
        deny_out: vec![],
        by_name: None,
    }
}

const HEAD: &[&str] = &["mount_run_dir", "create_disk"];
const DISK_BRANCH: &[&str] = &["mount_disk"];
const NET_NONE: &[&str] = &["netns_add"];
const NET_INTERNET: &[&str] = &["netns_add", "veth_add", "nft_prepare", "nft_apply"];
const TAIL: &[&str] = &["write_bundle", "runc_run"];

fn net_branch(network: bool) -> &'static [&'static str] {
    if network {
        NET_INTERNET
    } else {
        NET_NONE
    }
}

/// `part`, in order, within `ops` (other operations may come in between).
fn in_order(ops: &[String], part: &[&str]) -> bool {
    let mut it = ops.iter();
    part.iter().all(|p| it.any(|o| o == p))
}

/// The disk mount and network branches run side by side: each in order, both between
/// the disk's creation and the container.
fn assert_create_order(ops: &[String], network: bool) {
    let net = net_branch(network);
    assert_eq!(
        ops.len(),
        HEAD.len() + DISK_BRANCH.len() + net.len() + TAIL.len(),
        "{ops:?}"
    );
    assert_eq!(ops[..HEAD.len()], *HEAD, "{ops:?}");
    assert!(in_order(ops, DISK_BRANCH), "{ops:?}");
    assert!(in_order(ops, net), "{ops:?}");
    assert_eq!(ops[ops.len() - TAIL.len()..], *TAIL, "{ops:?}");
}

/// Undo of every step, in order.
const UNDO_ALL: &[&str] = &[
    "runc_kill",
    "runc_delete",
    "cgroup_remove",
    "nft_remove",
    "veth_delete",
    "netns_delete",
    "unmount_disk",
    "delete_disk",
    "unmount_run_dir",
];

#[test]
fn create_runs_steps_in_order() {
    let env = env();
    let host = FakeHost::new();
    let rec = create(&ctx(&env, &host), spec("a", NetworkMode::None)).unwrap();
    assert_create_order(&host.ops(), false);
    assert!(rec.net.is_none());
    let host = FakeHost::new();
    let rec = create(&ctx(&env, &host), spec("b", internet())).unwrap();
    assert_create_order(&host.ops(), true);
    let alloc = rec.net.unwrap();
    assert!(alloc.lease.exists());
    let saved = Record::load(&env.layout.sandbox("b").record()).unwrap();
    assert_eq!(saved.net, Some(alloc));
}

/// The create operations attempted when `failed` fails: the other branch runs to its end.
fn attempted(failed: &str, network: bool) -> Vec<&'static str> {
    let net = net_branch(network);
    let upto = |ops: &[&'static str]| -> Vec<&'static str> {
        match ops.iter().position(|o| *o == failed) {
            Some(i) => ops[..=i].to_vec(),
            None => ops.to_vec(),
        }
    };
    if HEAD.contains(&failed) {
        return upto(HEAD);
    }
    let mut ops = HEAD.to_vec();
    ops.extend(upto(DISK_BRANCH));
    ops.extend(upto(net));
    if !DISK_BRANCH.contains(&failed) && !net.contains(&failed) {
        ops.extend(upto(TAIL));
    }
    ops
}

/// Undo operations expected once `attempted` ran and `failed` failed.
fn expected_undo(attempted: &[&str], failed: &str) -> Vec<&'static str> {
    let did = |op: &str| attempted.contains(&op);
    let mut undo = Vec::new();
    if did("runc_run") {
        undo.extend(["runc_kill", "runc_delete", "cgroup_remove"]);
    }
    if did("nft_prepare") {
        undo.push("nft_remove");
    }
    if did("veth_add") {
        undo.push("veth_delete");
    }
    // A refused network namespace is not ours to delete.
    if did("netns_add") && failed != "netns_add" {
        undo.push("netns_delete");
    }
    if did("mount_disk") {
        undo.push("unmount_disk");
    }
    if did("create_disk") {
        undo.push("delete_disk");
    }
    undo.push("unmount_run_dir");
    undo
}

#[test]
fn failed_create_undoes_every_attempted_step() {
    for network in [false, true] {
        let mut steps = HEAD.to_vec();
        steps.extend(DISK_BRANCH.iter().chain(net_branch(network)).chain(TAIL));
        for failed in steps.into_iter().filter(|s| *s != "nft_apply") {
            let env = env();
            let host = FakeHost::new();
            host.fail_on(failed);
            let mode = if network {
                internet()
            } else {
                NetworkMode::None
            };
            assert!(create(&ctx(&env, &host), spec("x", mode)).is_err());
            let ops = host.ops();
            let tried = attempted(failed, network);
            let (made, undone) = ops.split_at(tried.len().min(ops.len()));
            let mut made: Vec<&str> = made.iter().map(String::as_str).collect();
            let mut want = tried.clone();
            made.sort_unstable();
            want.sort_unstable();
            assert_eq!(made, want, "attempted before {failed}");
            assert_eq!(
                undone,
                expected_undo(&tried, failed),
                "undone after {failed}"
            );
            assert!(!env.layout.sandbox("x").dir.exists(), "{failed}");
            assert!(net::leases_owned(&env.net, "").is_empty(), "{failed}");
        }
    }
}

#[test]
fn destroy_undoes_everything_and_is_idempotent() {
    let env = env();
    let host = FakeHost::new();
    let rec = create(&ctx(&env, &host), spec("d", internet())).unwrap();
    host.clear();
    destroy(&ctx(&env, &host), "d").unwrap();
    assert_eq!(host.ops(), UNDO_ALL);
    assert!(!rec.net.unwrap().lease.exists());
    assert!(!env.layout.sandbox("d").dir.exists());
    host.clear();
    destroy(&ctx(&env, &host), "d").unwrap();
    assert!(host.ops().is_empty());
}

#[test]
fn destroy_continues_past_failures_and_keeps_dir() {
    let env = env();
    let host = FakeHost::new();
    create(&ctx(&env, &host), spec("f", NetworkMode::None)).unwrap();
    host.clear();
    host.fail_on("unmount_disk");
    assert!(destroy(&ctx(&env, &host), "f").is_err());
    assert_eq!(
        host.ops(),
        UNDO_ALL
            .iter()
            .filter(|o| !o.starts_with("nft") && **o != "veth_delete")
            .copied()
            .collect::<Vec<_>>()
    );
    assert!(
        env.layout.sandbox("f").dir.exists(),
        "a mounted rootfs must not be removed"
    );
}

#[test]
fn destroy_of_half_created_sandbox_without_record() {
    let env = env();
    let host = FakeHost::new();
    env.layout.sandbox("h").create("h").unwrap();
    destroy(&ctx(&env, &host), "h").unwrap();
    assert!(host.ops().contains(&"netns_delete".to_string()));
    assert!(!env.layout.sandbox("h").dir.exists());
}

#[test]
fn duplicate_and_invalid_ids_are_refused_without_side_effects() {
    let env = env();
    let host = FakeHost::new();
    create(&ctx(&env, &host), spec("dup", NetworkMode::None)).unwrap();
    host.clear();
    assert!(matches!(
        create(&ctx(&env, &host), spec("dup", NetworkMode::None)),
        Err(Error::Exists(_))
    ));
    assert!(matches!(
        create(&ctx(&env, &host), spec("../x", NetworkMode::None)),
        Err(Error::InvalidSpec(_))
    ));
    assert!(host.ops().is_empty());
    assert!(env.layout.sandbox("dup").dir.exists());
}

#[test]
fn stop_then_restart_reuses_disk_and_network() {
    let env = env();
    let host = FakeHost::new();
    create(&ctx(&env, &host), spec("s", internet())).unwrap();
    host.clear();
    assert!(matches!(
        restart(&ctx(&env, &host), "s"),
        Err(Error::NotStopped(_))
    ));
    assert_eq!(
        host.ops(),
        ["runc_state"],
        "a running sandbox is left alone"
    );
    host.clear();
    stop(&ctx(&env, &host), "s").unwrap();
    restart(&ctx(&env, &host), "s").unwrap();
    let ops = [
        "runc_kill",
        "runc_delete",
        "runc_state",
        "write_bundle",
        "runc_run",
    ];
    assert_eq!(host.ops(), ops);
}

#[test]
fn stopped_on_request_is_kept_by_stale_cleanup_but_dead_is_not() {
    let env = env();
    let host = FakeHost::new();
    let c = ctx(&env, &host);
    for id in ["live", "parked", "dead"] {
        create(&c, spec(id, NetworkMode::None)).unwrap();
    }
    stop(&c, "parked").unwrap();
    assert!(load(&c, "parked").unwrap().stopped);
    // The dead one's container vanished behind the runtime's back.
    host.runc_delete(&env.layout.runc_root(), "dead").unwrap();
    assert_eq!(crate::stale::cleanup(&c).unwrap(), ["dead"]);
    assert!(env.layout.sandbox("live").dir.exists());
    assert!(env.layout.sandbox("parked").dir.exists());
    assert!(!env.layout.sandbox("dead").dir.exists());
    restart(&c, "parked").unwrap();
    assert!(!load(&c, "parked").unwrap().stopped);
}

#[test]
fn a_restore_is_prepared_beside_the_disk_and_cancelled_when_it_fails() {
    let env = env();
    let host = FakeHost::new();
    let images = env._dir.path().join("images");
    let c = Ctx {
        restore_images: Some(&images),
        ..ctx(&env, &host)
    };
    // The fake host refuses `runc restore`: the create fails after the preparation.
    assert!(create(&c, spec("r", NetworkMode::None)).is_err());
    let ops = host.ops();
    assert!(
        in_order(
            &ops,
            &[
                "create_disk",
                "criu_work_dir",
                "prepare_restore",
                "write_bundle"
            ]
        ),
        "{ops:?}"
    );
    assert!(
        in_order(&ops, &["criu_work_dir", "mount_disk", "write_bundle"]),
        "{ops:?}"
    );
    assert_eq!(
        ops.iter().filter(|o| *o == "criu_work_dir").count(),
        1,
        "made once: {ops:?}"
    );
    assert!(
        in_order(&ops, &["write_bundle", "cancel_restore"]),
        "{ops:?}"
    );
    // A cold create prepares nothing.
    let host = FakeHost::new();
    create(&ctx(&env, &host), spec("c", NetworkMode::None)).unwrap();
    assert!(
        !host.ops().iter().any(|o| o.contains("restore")),
        "{:?}",
        host.ops()
    );
}
