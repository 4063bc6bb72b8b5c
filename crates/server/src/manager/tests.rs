//! Manager unit tests over an in-process fake backend: the state machine, admission,
//! per-sandbox serialization, idle timeouts and recovery decisions. (Everything touching
//! real sandboxes is tested in `tests/` against the container runtime.)

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use proto::agent::{
    DirEntry, ExecRequest, ExitInfo, ExitStatus, FileStat, ProcessInfo, SpawnRequest,
};
use tokio::sync::mpsc;

use super::Manager;
use crate::backend::*;
use crate::config::Config;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::store::Store;
use api_types::{CreateSandbox, ListQuery};
use model::State;

#[derive(Default)]
struct Fake {
    live: Mutex<HashSet<String>>,
    fail_create: Mutex<bool>,
    fail_adopt: Mutex<bool>,
    /// Sandboxes whose agent "died", with the reason.
    dead: Mutex<std::collections::HashMap<String, String>>,
    destroyed: Mutex<Vec<String>>,
    cleaned_keep: Mutex<Option<Vec<String>>>,
    create_delay_ms: u64,
    checkpoints: AtomicUsize,
    in_create: AtomicUsize,
    max_in_create: AtomicUsize,
    images: Mutex<Vec<(String, BuiltImage)>>,
    removed_images: Mutex<Vec<String>>,
    host: Mutex<Option<HostMemory>>,
    builds: AtomicUsize,
    build_delay_ms: u64,
    restored: Mutex<Vec<String>>,
    parked: Mutex<Vec<String>>,
    /// Forks handed over: (id, the identity given).
    handed: Mutex<Vec<(String, proto::agent::Identity)>>,
}

fn unsupported<T>() -> BackendResult<T> {
    Err(BackendError::Unsupported("not in the fake".into()))
}

#[async_trait]
impl Backend for Fake {
    fn host_memory(&self) -> Option<HostMemory> {
        *self.host.lock().unwrap()
    }
    async fn cleanup_stale(&self, keep: &[String]) -> BackendResult<()> {
        *self.cleaned_keep.lock().unwrap() = Some(keep.to_vec());
        Ok(())
    }
    async fn create(&self, spec: &BootSpec) -> BackendResult<Booted> {
        let n = self.in_create.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_create.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(self.create_delay_ms)).await;
        self.in_create.fetch_sub(1, Ordering::SeqCst);
        if *self.fail_create.lock().unwrap() {
            return Err(BackendError::Host("runc refused".into()));
        }
        self.live.lock().unwrap().insert(spec.id.clone());
        Ok(Booted::default())
    }
    async fn adopt(&self, spec: &BootSpec) -> BackendResult<Booted> {
        if *self.fail_adopt.lock().unwrap() {
            return Err(BackendError::Unavailable("container is gone".into()));
        }
        self.live.lock().unwrap().insert(spec.id.clone());
        Ok(Booted::default())
    }
    async fn dead_reason(&self, id: &str) -> BackendResult<Option<String>> {
        Ok(self.dead.lock().unwrap().get(id).cloned())
    }
    async fn destroy(&self, id: &str) -> BackendResult<()> {
        self.live.lock().unwrap().remove(id);
        self.destroyed.lock().unwrap().push(id.to_string());
        Ok(())
    }
    async fn exec(&self, _: &str, req: ExecRequest) -> BackendResult<Stream<ExecEvent>> {
        let (tx, rx) = mpsc::channel(4);
        let data = Bytes::from(req.args.join(" "));
        tokio::spawn(async move {
            let out = proto::agent::OutputStream::Stdout;
            let _ = tx
                .send(Ok(ExecEvent::Output {
                    stream: out,
                    offset: 0,
                    data,
                }))
                .await;
            let exit = ExitInfo {
                status: ExitStatus::Code(0),
                timed_out: false,
            };
            let _ = tx.send(Ok(ExecEvent::Exit(exit))).await;
        });
        Ok(rx)
    }
    async fn spawn(&self, _: &str, _: SpawnRequest) -> BackendResult<ProcessInfo> {
        unsupported()
    }
    async fn restart(&self, _: &str, _: u64) -> BackendResult<u64> {
        unsupported()
    }
    async fn stop(&self, _: &str, _: u64) -> BackendResult<()> {
        unsupported()
    }
    async fn processes(&self, _: &str) -> BackendResult<Vec<ProcessInfo>> {
        unsupported()
    }
    async fn attach(
        &self,
        _: &str,
        _: u64,
        _: (u64, u64),
        _: bool,
    ) -> BackendResult<Stream<ExecEvent>> {
        unsupported()
    }
    async fn write_stdin(&self, _: &str, _: u64, _: Bytes) -> BackendResult<()> {
        unsupported()
    }
    async fn close_stdin(&self, _: &str, _: u64) -> BackendResult<()> {
        unsupported()
    }
    async fn signal(&self, _: &str, _: u64, _: i32) -> BackendResult<()> {
        unsupported()
    }
    async fn wait(&self, _: &str, _: u64, _: Option<u64>) -> BackendResult<ExitInfo> {
        unsupported()
    }
    async fn read_file(&self, _: &str, _: &str) -> BackendResult<(FileStat, Stream<Bytes>)> {
        unsupported()
    }
    async fn write_file(
        &self,
        _: &str,
        _: &str,
        _: crate::backend::WriteAs,
        _: Stream<Bytes>,
    ) -> BackendResult<u64> {
        unsupported()
    }
    async fn list_dir(&self, _: &str, _: &str) -> BackendResult<Vec<DirEntry>> {
        unsupported()
    }
    async fn stat(&self, _: &str, _: &str) -> BackendResult<FileStat> {
        unsupported()
    }
    async fn remove(&self, _: &str, _: &str, _: bool) -> BackendResult<()> {
        unsupported()
    }
    async fn mkdir(&self, _: &str, _: &str, _: bool) -> BackendResult<()> {
        unsupported()
    }
    async fn build_image(
        &self,
        req: &ImageBuild,
        progress: mpsc::Sender<String>,
    ) -> BackendResult<BuiltImage> {
        self.builds.fetch_add(1, Ordering::SeqCst);
        let _ = progress.send(format!("building {}", req.name)).await;
        tokio::time::sleep(Duration::from_millis(self.build_delay_ms)).await;
        let _ = progress.send(format!("sealed {}", req.name)).await;
        Ok(BuiltImage {
            layer_id: format!("layer-{}", req.name),
            size_bytes: 1,
        })
    }
    async fn checkpoint(
        &self,
        _: &str,
        _: model::SnapshotType,
        _: Option<std::path::PathBuf>,
    ) -> BackendResult<crate::backend::Checkpointed> {
        self.checkpoints.fetch_add(1, Ordering::SeqCst);
        Err(BackendError::Host("CRIU refused".into()))
    }
    async fn restore(&self, spec: &BootSpec, _: RestoreFrom) -> BackendResult<Booted> {
        self.live.lock().unwrap().insert(spec.id.clone());
        self.restored.lock().unwrap().push(spec.id.clone());
        Ok(Booted::default())
    }
    async fn park(&self, spec: &BootSpec, from: RestoreFrom) -> BackendResult<Booted> {
        assert!(
            from.identity.is_none() && from.hooks.is_empty(),
            "parked bare"
        );
        self.live.lock().unwrap().insert(spec.id.clone());
        self.parked.lock().unwrap().push(spec.id.clone());
        Ok(Booted::default())
    }
    async fn hand_over(
        &self,
        id: &str,
        identity: proto::agent::Identity,
        _: Vec<ExecRequest>,
    ) -> BackendResult<()> {
        assert!(self.live.lock().unwrap().contains(id), "{id} is parked");
        self.handed.lock().unwrap().push((id.to_string(), identity));
        Ok(())
    }
    async fn remove_image(&self, name: &str) -> BackendResult<()> {
        self.removed_images.lock().unwrap().push(name.to_string());
        Ok(())
    }
    async fn images(&self) -> BackendResult<Vec<(String, BuiltImage)>> {
        Ok(self.images.lock().unwrap().clone())
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    db: std::path::PathBuf,
    config: Config,
}

fn setup(max_sandboxes: u32, max_memory_mb: u64) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        data_dir: dir.path().into(),
        max_sandboxes,
        max_memory_mb,
        reaper_interval_ms: 20,
        admission_wait_secs: 0,
        default_image: "busybox".into(),
        ..Config::default()
    };
    Setup {
        db: dir.path().join("state.db"),
        _dir: dir,
        config,
    }
}

async fn manager(s: &Setup, fake: Arc<Fake>) -> Arc<Manager> {
    let store = Store::open(&s.db).unwrap();
    Manager::start(s.config.clone(), fake, store, Arc::new(Metrics::default()))
        .await
        .unwrap()
}

fn req(memory_mb: u64) -> CreateSandbox {
    CreateSandbox {
        memory_mb: Some(memory_mb),
        ..Default::default()
    }
}

#[tokio::test]
async fn create_terminate_and_wrong_state() {
    let s = setup(10, 10_000);
    let fake = Arc::new(Fake::default());
    let m = manager(&s, fake.clone()).await;
    let sb = m.create(req(64)).await.unwrap();
    assert_eq!(sb.state, State::Running);
    assert_eq!(sb.image, "busybox");
    assert!(fake.live.lock().unwrap().contains(&sb.id));
    let done = m.terminate(&sb.id).await.unwrap();
    assert_eq!(done.state, State::Terminated);
    assert!(fake.live.lock().unwrap().is_empty());
    assert_eq!(
        m.terminate(&sb.id).await.unwrap().state,
        State::Terminated,
        "idempotent"
    );
    let e = m.exec(&sb.id, ExecRequest::default()).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::WrongState {
                state: State::Terminated,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.status_code().0, 409);
    assert!(e.message().contains("terminated"));
    assert!(m.list(&ListQuery::default()).unwrap().is_empty());
    let q = ListQuery {
        state: Some("terminated".into()),
        ..Default::default()
    };
    assert_eq!(m.list(&q).unwrap().len(), 1);
}

#[tokio::test]
async fn admission_refuses_at_once_and_releases() {
    let s = setup(2, 1000);
    let m = manager(&s, Arc::new(Fake::default())).await;
    let a = m.create(req(400)).await.unwrap();
    let e = m.create(req(700)).await.unwrap_err();
    assert_eq!(e.status_code().0, 429, "{e:?}");
    let _b = m.create(req(400)).await.unwrap();
    assert_eq!(m.create(req(16)).await.unwrap_err().status_code().0, 429);
    m.terminate(&a.id).await.unwrap();
    m.create(req(16)).await.unwrap();
    assert_eq!(
        m.list(&ListQuery::default()).unwrap().len(),
        2,
        "refused creates left nothing"
    );
}

#[tokio::test]
async fn a_full_host_queues_requests_until_a_sandbox_ends() {
    let mut s = setup(1, 1000);
    s.config.admission_wait_secs = 5;
    let m = manager(&s, Arc::new(Fake::default())).await;
    let a = m.create(req(64)).await.unwrap();
    let queued = {
        let m = m.clone();
        tokio::spawn(async move { m.create(req(64)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!queued.is_finished(), "waits for room");
    m.terminate(&a.id).await.unwrap();
    let b = tokio::time::timeout(Duration::from_secs(2), queued)
        .await
        .expect("admitted once the first sandbox ended")
        .unwrap()
        .unwrap();
    assert_eq!(b.state, State::Running);
}

#[tokio::test]
async fn a_request_that_waited_in_vain_is_refused_naming_what_is_full() {
    let mut s = setup(1, 1000);
    s.config.admission_wait_secs = 1;
    let m = manager(&s, Arc::new(Fake::default())).await;
    m.create(req(64)).await.unwrap();
    let started = std::time::Instant::now();
    let e = m.create(req(64)).await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(900), "it waited");
    assert_eq!(e.status_code().0, 429);
    assert!(e.message().contains("Sandbox limit reached"), "{e:?}");
    assert!(e.message().contains("waited 1 s"), "{e:?}");
    assert_eq!(m.metrics().admission_refusals.get(), 1);
}

#[tokio::test]
async fn memory_limits_are_caps_and_real_memory_decides() {
    // Tensorlake's published fork example: a 4 GiB base and five 4 GiB workers on a
    // 24 GiB host whose memory is mostly free.
    let s = setup(100, 0);
    let fake = Arc::new(Fake::default());
    *fake.host.lock().unwrap() = Some(HostMemory {
        total_mb: 24 << 10,
        available_mb: 22 << 10,
    });
    let m = manager(&s, fake.clone()).await;
    for _ in 0..6 {
        m.create(req(4096)).await.unwrap();
    }
    *fake.host.lock().unwrap() = Some(HostMemory {
        total_mb: 24 << 10,
        available_mb: 1000,
    });
    let e = m.create(req(256)).await.unwrap_err();
    assert_eq!(e.status_code().0, 429);
    assert!(e.message().contains("Host memory is full"), "{e:?}");
}

#[tokio::test]
async fn built_in_images_are_built_once_on_first_use_and_share_progress() {
    let s = setup(10, 10_000);
    let fake = Arc::new(Fake {
        build_delay_ms: 300,
        ..Fake::default()
    });
    let m = manager(&s, fake.clone()).await;
    let follow = |m: Arc<Manager>| async move {
        let (tx, mut rx) = mpsc::channel(16);
        let lines = tokio::spawn(async move {
            let mut lines = Vec::new();
            while let Some(l) = rx.recv().await {
                lines.push(l);
            }
            lines
        });
        let image = m.ensure_image("python", tx).await.unwrap();
        (image, lines.await.unwrap())
    };
    let (a, b) = tokio::join!(follow(m.clone()), follow(m.clone()));
    assert_eq!(fake.builds.load(Ordering::SeqCst), 1, "one build for both");
    assert_eq!(a.0, b.0);
    for (_, lines) in [&a, &b] {
        assert!(lines.iter().any(|l| l.contains("first use")), "{lines:?}");
        assert!(lines.iter().any(|l| l == "sealed python"), "{lines:?}");
    }
    let sb = m
        .create(CreateSandbox {
            image: Some("python".into()),
            ..req(64)
        })
        .await
        .unwrap();
    assert_eq!(sb.image, "python");
    assert_eq!(fake.builds.load(Ordering::SeqCst), 1, "built once");
    let e = m
        .ensure_image("nope", mpsc::channel(1).0)
        .await
        .unwrap_err();
    assert_eq!(e.status_code().0, 404);
    assert!(e.message().contains("built-in images"), "{e:?}");
}

#[tokio::test]
async fn failed_create_releases_and_records_why() {
    let s = setup(1, 1000);
    let fake = Arc::new(Fake::default());
    *fake.fail_create.lock().unwrap() = true;
    let m = manager(&s, fake.clone()).await;
    let e = m.create(req(64)).await.unwrap_err();
    assert!(e.message().contains("runc refused"));
    let failed = m
        .list(&ListQuery {
            state: Some("failed".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(failed.len(), 1);
    assert!(failed[0].error.as_deref().unwrap().contains("runc refused"));
    assert_eq!(
        fake.destroyed.lock().unwrap().len(),
        1,
        "cleanup after failed create"
    );
    *fake.fail_create.lock().unwrap() = false;
    m.create(req(64))
        .await
        .expect("the reservation was released");
}

#[tokio::test]
async fn names_are_unique_and_resolve() {
    let s = setup(10, 10_000);
    let m = manager(&s, Arc::new(Fake::default())).await;
    let named = CreateSandbox {
        name: Some("web".into()),
        ..Default::default()
    };
    let sb = m.create(named.clone()).await.unwrap();
    assert_eq!(m.get("web").unwrap().id, sb.id);
    assert_eq!(
        m.create(named.clone()).await.unwrap_err().status_code().0,
        409
    );
    m.terminate("web").await.unwrap();
    m.create(named)
        .await
        .expect("name free again after terminate");
}

#[tokio::test]
async fn concurrent_terminates_on_one_sandbox_are_serialized() {
    let s = setup(10, 10_000);
    let fake = Arc::new(Fake::default());
    let m = manager(&s, fake.clone()).await;
    let sb = m.create(req(64)).await.unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (m, id) = (m.clone(), sb.id.clone());
            tokio::spawn(async move { m.terminate(&id).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().state, State::Terminated);
    }
    assert_eq!(
        fake.destroyed.lock().unwrap().len(),
        1,
        "destroyed exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn different_sandboxes_create_in_parallel() {
    let s = setup(10, 10_000);
    let fake = Arc::new(Fake {
        create_delay_ms: 200,
        ..Default::default()
    });
    let m = manager(&s, fake.clone()).await;
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let m = m.clone();
            tokio::spawn(async move { m.create(req(64)).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert!(fake.max_in_create.load(Ordering::SeqCst) > 1);
}

#[tokio::test]
async fn idle_unnamed_sandboxes_are_terminated_active_ones_kept() {
    let s = setup(10, 10_000);
    let m = manager(&s, Arc::new(Fake::default())).await;
    let idle = m
        .create(CreateSandbox {
            timeout_secs: Some(1),
            ..req(64)
        })
        .await
        .unwrap();
    let busy = m
        .create(CreateSandbox {
            timeout_secs: Some(1),
            ..req(64)
        })
        .await
        .unwrap();
    let forever = m.create(req(64)).await.unwrap();
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        m.using(&busy.id).await.unwrap();
    }
    assert_eq!(m.get(&idle.id).unwrap().state, State::Terminated);
    assert_eq!(m.get(&busy.id).unwrap().state, State::Running);
    assert_eq!(m.get(&forever.id).unwrap().state, State::Running);
}

#[tokio::test]
async fn restart_readopts_running_and_fails_lost_ones() {
    let s = setup(10, 10_000);
    let fake = Arc::new(Fake::default());
    let (kept, lost) = {
        let m = manager(&s, fake.clone()).await;
        (
            m.create(req(64)).await.unwrap(),
            m.create(req(64)).await.unwrap(),
        )
    };
    fake.live.lock().unwrap().clear();
    let fake2 = Arc::new(Fake::default());
    // First restart: everything adopts.
    let m = manager(&s, fake2.clone()).await;
    let keep = fake2.cleaned_keep.lock().unwrap().clone().unwrap();
    assert_eq!(keep.len(), 2);
    assert_eq!(m.get(&kept.id).unwrap().state, State::Running);
    drop(m);
    // Second restart: adopt fails → failed and destroyed, admission released.
    let fake3 = Arc::new(Fake::default());
    *fake3.fail_adopt.lock().unwrap() = true;
    let m = manager(&s, fake3.clone()).await;
    let v = m.get(&lost.id).unwrap();
    assert_eq!(v.state, State::Failed);
    assert!(v.error.unwrap().contains("container is gone"));
    assert_eq!(fake3.destroyed.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn shutdown_refuses_new_work() {
    let s = setup(10, 10_000);
    let m = manager(&s, Arc::new(Fake::default())).await;
    let sb = m.create(req(64)).await.unwrap();
    m.shutdown().await;
    assert_eq!(m.create(req(64)).await.unwrap_err().status_code().0, 503);
    assert_eq!(
        m.exec(&sb.id, ExecRequest::default())
            .await
            .unwrap_err()
            .status_code()
            .0,
        503
    );
}

#[tokio::test]
async fn metrics_move() {
    let s = setup(10, 10_000);
    let m = manager(&s, Arc::new(Fake::default())).await;
    let sb = m.create(req(64)).await.unwrap();
    assert_eq!(m.metrics().create.count(), 1);
    let mut rx = m
        .exec(
            &sb.id,
            ExecRequest {
                args: vec!["hi".into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    while rx.recv().await.is_some() {}
    assert_eq!(m.metrics().exec.count(), 1);
    assert_eq!(m.state_counts().get(&State::Running), Some(&1));
}

#[tokio::test]
async fn a_failed_idle_suspend_waits_another_period_before_retrying() {
    let s = setup(10, 10_000);
    let fake = Arc::new(Fake::default());
    let m = manager(&s, fake.clone()).await;
    let named = CreateSandbox {
        name: Some("keep".into()),
        timeout_secs: Some(1),
        ..req(64)
    };
    let sb = m.create(named).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(
        fake.checkpoints.load(Ordering::SeqCst),
        1,
        "one attempt per idle period"
    );
    assert_eq!(
        m.get(&sb.id).unwrap().state,
        State::Running,
        "a failed suspend keeps it running"
    );
}

#[tokio::test]
async fn restart_runs_on_a_suspend_cut_short_before_its_state_was_saved() {
    let s = setup(10, 10_000);
    let fake = Arc::new(Fake::default());
    let (suspending, resuming) = {
        let m = manager(&s, fake.clone()).await;
        (
            m.create(req(64)).await.unwrap(),
            m.create(req(64)).await.unwrap(),
        )
    };
    let store = Store::open(&s.db).unwrap();
    for mut row in store.sandboxes().await.unwrap() {
        row.view.state = if row.view.id == suspending.id {
            State::Suspending
        } else {
            State::Resuming
        };
        store.put_sandbox(row).await.unwrap();
    }
    let fake2 = Arc::new(Fake::default());
    let m = manager(&s, fake2.clone()).await;
    // No suspended state was saved: the suspend had stopped nothing, so it runs on.
    assert_eq!(m.get(&suspending.id).unwrap().state, State::Running);
    assert!(fake2.live.lock().unwrap().contains(&suspending.id));
    assert!(!fake2.destroyed.lock().unwrap().contains(&suspending.id));
    let keep = fake2.cleaned_keep.lock().unwrap().clone().unwrap();
    assert!(keep.contains(&suspending.id), "spared by the stale cleanup");
    // A resume without its saved state has nothing to go back to.
    let v = m.get(&resuming.id).unwrap();
    assert_eq!(v.state, State::Failed);
    assert!(fake2.destroyed.lock().unwrap().contains(&resuming.id));
    let again = m.create(req(64)).await.unwrap();
    assert_eq!(
        again.state,
        State::Running,
        "admission counts the re-adopted one only"
    );
}

#[tokio::test]
async fn restart_removes_unrecorded_images_and_records_finished_rebuilds() {
    let s = setup(10, 10_000);
    let built = |layer: &str| BuiltImage {
        layer_id: layer.into(),
        size_bytes: 7,
    };
    {
        let m = manager(&s, Arc::new(Fake::default())).await;
        let (tx, _rx) = mpsc::channel(16);
        let req = api_types::BuildImage {
            name: "rebuilt".into(),
            builder: "busybox".into(),
            ..Default::default()
        };
        m.build_image(req, tx).await.unwrap();
    }
    let fake = Arc::new(Fake::default());
    *fake.images.lock().unwrap() = vec![
        ("orphan".into(), built("layer-o")),
        ("rebuilt".into(), built("layer-new")),
    ];
    let m = manager(&s, fake.clone()).await;
    assert_eq!(
        *fake.removed_images.lock().unwrap(),
        vec!["orphan".to_string()]
    );
    let images = m.images().await.unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(images[0].name, "rebuilt");
    assert_eq!(images[0].layer_id, "layer-new");
    assert_eq!(images[0].size_bytes, 7);
}

#[tokio::test]
async fn a_dead_agent_fails_the_sandbox_with_the_reason_and_tears_it_down() {
    let s = setup(10, 10_000);
    let fake = Arc::new(Fake::default());
    let m = manager(&s, fake.clone()).await;
    let (victim, other) = (
        m.create(req(64)).await.unwrap(),
        m.create(req(64)).await.unwrap(),
    );
    let reason = "Its agent (PID 1 of the sandbox) died".to_string();
    fake.dead
        .lock()
        .unwrap()
        .insert(victim.id.clone(), reason.clone());
    m.watch_once().await;
    let v = m.get(&victim.id).unwrap();
    assert_eq!(
        (v.state, v.error.as_deref()),
        (State::Failed, Some(reason.as_str()))
    );
    assert_eq!(*fake.destroyed.lock().unwrap(), vec![victim.id.clone()]);
    assert_eq!(m.get(&other.id).unwrap().state, State::Running);
    // Admission released; a failed sandbox still terminates (idempotent cleanup).
    assert_eq!(
        m.terminate(&victim.id).await.unwrap().state,
        State::Terminated
    );
}

#[tokio::test]
async fn the_watch_leaves_busy_and_non_running_sandboxes_alone() {
    let s = setup(10, 10_000);
    let fake = Arc::new(Fake::default());
    let m = manager(&s, fake.clone()).await;
    let busy = m.create(req(64)).await.unwrap();
    fake.dead
        .lock()
        .unwrap()
        .insert(busy.id.clone(), "dead".into());
    // An operation in flight (a checkpoint pauses the container) holds the op lock.
    let entry = m.find(&busy.id).unwrap();
    let op = entry.op.lock().await;
    m.watch_once().await;
    assert_eq!(m.get(&busy.id).unwrap().state, State::Running);
    drop(op);
    m.watch_once().await;
    assert_eq!(m.get(&busy.id).unwrap().state, State::Failed);
}

#[tokio::test]
async fn a_sandbox_dead_while_the_daemon_was_down_is_failed_at_recovery() {
    let s = setup(10, 10_000);
    let m = manager(&s, Arc::new(Fake::default())).await;
    let sb = m.create(req(64)).await.unwrap();
    drop(m);
    let fake = Arc::new(Fake::default());
    fake.dead
        .lock()
        .unwrap()
        .insert(sb.id.clone(), "Its disk server died".into());
    let m = manager(&s, fake.clone()).await;
    let v = m.get(&sb.id).unwrap();
    assert_eq!(v.state, State::Failed);
    assert_eq!(
        v.error.as_deref(),
        Some("Its disk server died while the daemon was down")
    );
    assert!(fake.destroyed.lock().unwrap().contains(&sb.id));
}

#[tokio::test]
async fn restart_drops_the_suspended_state_of_a_sandbox_that_runs_again() {
    use crate::snapshots::SnapshotRecord;
    use api_types::Snapshot;
    use model::SnapshotType;
    let s = setup(10, 10_000);
    let fake = Arc::new(Fake::default());
    let sb = manager(&s, fake.clone())
        .await
        .create(req(64))
        .await
        .unwrap();
    let store = Store::open(&s.db).unwrap();
    let row = store.sandboxes().await.unwrap().remove(0);
    let snap_id = super::suspend::suspend_snapshot_id(&sb.id);
    let dir = s.config.data_dir.join("snapshots").join(&snap_id);
    std::fs::create_dir_all(dir.join("memory")).unwrap();
    let rec = SnapshotRecord {
        view: Snapshot {
            id: snap_id.clone(),
            kind: SnapshotType::Memory,
            name: None,
            source_sandbox_id: Some(sb.id.clone()),
            image: row.view.image.clone(),
            size_bytes: 1,
            created_at: super::now_rfc3339(),
            cpus: row.boot.cpus,
            memory_mb: row.boot.memory_mb,
            disk_mb: row.boot.disk_mb,
            labels: Default::default(),
            published: false,
        },
        layer_id: "layer-s".into(),
        memory_dir: Some(dir.join("memory")),
        boot: row.boot.clone(),
        hooks: Vec::new(),
        internal: true,
        restore_bytes: 0,
        pulled: false,
        pages: Vec::new(),
    };
    store.put_snapshot(rec).await.unwrap();
    // The resume had recorded `running` when the daemon died.
    let m = manager(&s, Arc::new(Fake::default())).await;
    assert_eq!(m.get(&sb.id).unwrap().state, State::Running);
    assert!(store.snapshot(snap_id).await.unwrap().is_none());
    assert!(!dir.exists());
}

#[tokio::test]
async fn restart_finishes_an_interrupted_terminate() {
    let s = setup(10, 10_000);
    let sb = manager(&s, Arc::new(Fake::default()))
        .await
        .create(req(64))
        .await
        .unwrap();
    let store = Store::open(&s.db).unwrap();
    let mut row = store.sandboxes().await.unwrap().remove(0);
    row.view.state = State::Terminating;
    store.put_sandbox(row).await.unwrap();
    let fake = Arc::new(Fake::default());
    let m = manager(&s, fake.clone()).await;
    let v = m.get(&sb.id).unwrap();
    assert_eq!(v.state, State::Terminated);
    assert_eq!(v.error, None);
    assert!(fake.destroyed.lock().unwrap().contains(&sb.id));
}

#[tokio::test]
async fn labels_are_set_and_removed_in_one_step_and_checked() {
    use api_types::LabelsPatch;
    let s = setup(10, 10_000);
    let fake = Arc::new(Fake::default());
    let m = manager(&s, fake).await;
    let mut create = req(64);
    create.labels = [("team", "rl"), ("run", "1")]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
    let sb = m.create(create).await.unwrap();
    let patch = |set: &[(&str, &str)], remove: &[&str]| LabelsPatch {
        set: set
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        remove: remove.iter().map(|k| k.to_string()).collect(),
    };
    let labels = m
        .patch_labels(
            &sb.id,
            patch(&[("run", "2"), ("stage", "eval")], &["team", "absent"]),
        )
        .await
        .unwrap();
    let want: std::collections::BTreeMap<String, String> = [("run", "2"), ("stage", "eval")]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
    assert_eq!(labels, want);
    assert_eq!(m.get(&sb.id).unwrap().labels, want, "the view has them");
    for (bad, why) in [
        (patch(&[], &[]), "Nothing to change"),
        (patch(&[("a b", "x")], &[]), "Label key"),
        (patch(&[("k", "line\nbreak")], &[]), "control"),
        (patch(&[("k", "v")], &["k"]), "both set and removed"),
    ] {
        let e = m.patch_labels(&sb.id, bad).await.unwrap_err();
        assert_eq!(e.status_code().0, 400, "{e}");
        assert!(e.message().contains(why), "{e}");
    }
    let many: Vec<(String, String)> = (0..70).map(|i| (format!("k{i}"), "v".into())).collect();
    let e = m
        .patch_labels(
            &sb.id,
            LabelsPatch {
                set: many.into_iter().collect(),
                remove: vec![],
            },
        )
        .await
        .unwrap_err();
    assert!(e.message().contains("At most 64 labels"), "{e}");
    assert_eq!(
        m.get(&sb.id).unwrap().labels,
        want,
        "a refused patch changed nothing"
    );
    m.terminate(&sb.id).await.unwrap();
    let e = m
        .patch_labels(&sb.id, patch(&[("a", "b")], &[]))
        .await
        .unwrap_err();
    assert_eq!(e.status_code().0, 409);
}

#[tokio::test]
async fn labels_follow_the_same_rules_at_create_update_fork_and_checkpoint() {
    use api_types::{ChildSpec, ForkRequest, UpdateSandbox};
    let s = setup(10, 10_000);
    let fake = Arc::new(Fake::default());
    let m = manager(&s, fake.clone()).await;
    let bad = || std::collections::BTreeMap::from([("bad key".to_string(), "v".to_string())]);
    let mut create = req(64);
    create.labels = bad();
    let e = m.create(create).await.unwrap_err();
    assert_eq!(e.status_code().0, 400, "{e}");
    assert!(fake.live.lock().unwrap().is_empty(), "nothing booted");
    let sb = m.create(req(64)).await.unwrap();
    let update = UpdateSandbox {
        labels: Some(bad()),
        ..Default::default()
    };
    assert_eq!(
        m.update(&sb.id, update).await.unwrap_err().status_code().0,
        400
    );
    let fork = ForkRequest {
        count: 2,
        per_child: vec![ChildSpec {
            labels: bad(),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(
        m.fork_sandbox(&sb.id, fork)
            .await
            .unwrap_err()
            .status_code()
            .0,
        400
    );
    let args = super::CheckpointArgs {
        kind: model::SnapshotType::Filesystem,
        name: None,
        hooks: vec![],
        labels: bad(),
    };
    assert_eq!(
        m.checkpoint(&sb.id, args)
            .await
            .unwrap_err()
            .status_code()
            .0,
        400
    );
    assert_eq!(
        m.get(&sb.id).unwrap().state,
        State::Running,
        "a refused request changed nothing"
    );
}

/// A memory snapshot record of `size_mb` in the store (a fork source for the pool).
async fn memory_snapshot(s: &Setup, id: &str, size_mb: u64) {
    use crate::snapshots::SnapshotRecord;
    use api_types::Snapshot;
    let dir = s.config.data_dir.join("snapshots").join(id).join("memory");
    std::fs::create_dir_all(&dir).unwrap();
    let boot = BootSpec {
        id: "sb-source".into(),
        image: ImageSpec {
            name: "busybox".into(),
            layer_id: "base".into(),
        },
        cpus: 1.0,
        memory_mb: 64,
        disk_mb: 0,
        env: Default::default(),
        secrets: Default::default(),
        network: NetworkSpec::default(),
        volumes: Vec::new(),
    };
    let rec = SnapshotRecord {
        view: Snapshot {
            id: id.into(),
            kind: model::SnapshotType::Memory,
            name: None,
            source_sandbox_id: Some("sb-source".into()),
            image: "busybox".into(),
            size_bytes: size_mb << 20,
            created_at: super::now_rfc3339(),
            cpus: 1.0,
            memory_mb: 64,
            disk_mb: 0,
            labels: Default::default(),
            published: false,
        },
        layer_id: "layer-m".into(),
        memory_dir: Some(dir),
        boot,
        hooks: Vec::new(),
        internal: false,
        restore_bytes: 0,
        pulled: false,
        pages: Vec::new(),
    };
    Store::open(&s.db).unwrap().put_snapshot(rec).await.unwrap();
}

async fn until(what: &str, ready: impl Fn() -> bool) {
    for _ in 0..500 {
        if ready() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 5 s");
}

fn from_snapshot(id: &str) -> CreateSandbox {
    CreateSandbox {
        snapshot_id: Some(id.into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn the_pool_hands_over_parked_forks_each_with_its_own_identity() {
    let mut s = setup(10, 10_000);
    s.config.pool_size = 2;
    memory_snapshot(&s, "snap-pool", 100).await;
    let fake = Arc::new(Fake::default());
    let m = manager(&s, fake.clone()).await;
    let first = m.create(from_snapshot("snap-pool")).await.unwrap();
    assert_eq!(
        *fake.restored.lock().unwrap(),
        std::slice::from_ref(&first.id),
        "a miss restores"
    );
    until("two forks parked", || {
        fake.parked.lock().unwrap().len() == 2
    })
    .await;
    until("the shelf is full", || m.pool_gauge().forks == 2).await;
    assert_eq!(m.pool_gauge().memory_bytes, 200 << 20);
    assert!(
        m.list(&ListQuery::default()).unwrap().len() == 1,
        "parked forks are not sandboxes of the API"
    );

    let fork = api_types::ForkRequest {
        count: 3,
        ..Default::default()
    };
    let result = m.fork_snapshot("snap-pool", fork).await.unwrap();
    let ids: Vec<String> = result
        .children
        .iter()
        .map(|c| c.sandbox.as_ref().unwrap().id.clone())
        .collect();
    let parked = fake.parked.lock().unwrap()[..2].to_vec();
    let handed = fake.handed.lock().unwrap().clone();
    assert_eq!(handed.len(), 2, "two children from the pool, one restored");
    for (id, identity) in &handed {
        assert!(parked.contains(id) && ids.contains(id));
        assert_eq!(&identity.sandbox_id, id, "its own identity");
        assert_eq!(identity.parent_snapshot_id.as_deref(), Some("snap-pool"));
        assert_eq!(identity.seed.len(), 32);
    }
    assert_ne!(handed[0].1.seed, handed[1].1.seed);
    let indexes: HashSet<u32> = handed.iter().map(|(_, i)| i.fork_index).collect();
    assert_eq!(indexes.len(), 2);
    for id in &ids {
        assert_eq!(m.get(id).unwrap().state, State::Running);
    }
    assert_eq!(m.metrics().pool_hits.get(), 2);
    assert_eq!(m.metrics().pool_misses.get(), 2);

    until("the shelf refills", || m.pool_gauge().forks == 2).await;
    m.delete_snapshot("snap-pool", false).await.unwrap();
    assert_eq!(m.pool_gauge().forks, 0);
    let destroyed = fake.destroyed.lock().unwrap().clone();
    let refilled = &fake.parked.lock().unwrap()[2..];
    assert!(
        refilled.iter().all(|id| destroyed.contains(id)),
        "deleting the snapshot removes its parked forks"
    );
}

#[tokio::test]
async fn the_pool_keeps_to_its_budget_and_gives_its_room_to_requests() {
    let mut s = setup(3, 10_000);
    s.config.pool_size = 4;
    s.config.pool_memory_mb = 250;
    memory_snapshot(&s, "snap-budget", 100).await;
    let fake = Arc::new(Fake::default());
    let m = manager(&s, fake.clone()).await;
    m.create(from_snapshot("snap-budget")).await.unwrap();
    until("two forks parked", || m.pool_gauge().forks == 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        m.pool_gauge().forks,
        2,
        "a third would pass the 250 MiB budget"
    );
    // Three sandboxes at most: one runs, two are parked. A new request takes their room.
    let sb = m.create(req(64)).await.unwrap();
    assert_eq!(sb.state, State::Running);
    assert_eq!(m.pool_gauge().forks, 0);
    assert_eq!(m.metrics().pool_evictions.get(), 2);
}

#[tokio::test]
async fn an_idle_shelf_is_emptied_and_shutdown_leaves_no_parked_fork() {
    let mut s = setup(10, 10_000);
    s.config.pool_size = 1;
    s.config.pool_idle_secs = 1;
    memory_snapshot(&s, "snap-idle", 10).await;
    memory_snapshot(&s, "snap-kept", 10).await;
    let fake = Arc::new(Fake::default());
    let m = manager(&s, fake.clone()).await;
    m.create(from_snapshot("snap-idle")).await.unwrap();
    until("one fork parked", || m.pool_gauge().forks == 1).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    until("the idle shelf is emptied", || m.pool_gauge().forks == 0).await;
    m.create(from_snapshot("snap-kept")).await.unwrap();
    until("one fork parked", || m.pool_gauge().forks == 1).await;
    m.shutdown().await;
    assert_eq!(m.pool_gauge().forks, 0);
    let parked = fake.parked.lock().unwrap().clone();
    let live = fake.live.lock().unwrap().clone();
    assert!(
        parked.iter().all(|id| !live.contains(id)),
        "no parked fork outlives the daemon"
    );
}

#[tokio::test]
async fn snapshot_files_read_by_a_later_snapshot_outlive_its_row_and_go_with_the_last_reader() {
    let s = setup(10, 10_000);
    let root = s.config.data_dir.join("snapshots");
    // a ← b (b's memory images read pages from a's); a's row is gone, b's is recorded;
    // c was a checkpoint interrupted by a crash; d's row is gone and nothing reads it.
    memory_snapshot(&s, "snap-b", 1).await;
    for id in ["snap-a", "snap-c", "snap-d"] {
        std::fs::create_dir_all(root.join(id).join("memory")).unwrap();
    }
    std::os::unix::fs::symlink("../../snap-a/memory", root.join("snap-b/memory/parent")).unwrap();
    let m = manager(&s, Arc::new(Fake::default())).await;
    let mut left: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["snap-a", "snap-b"],
        "recovery keeps what a recorded snapshot reads"
    );
    m.delete_snapshot("snap-b", false).await.unwrap();
    assert_eq!(
        std::fs::read_dir(&root).unwrap().count(),
        0,
        "the chain goes with its last reader"
    );
}

#[tokio::test]
async fn timeouts_are_shown_set_from_now_and_checked_and_lists_filter_by_labels() {
    use api_types::{OnTimeout, UpdateSandbox};
    let s = setup(10, 10_000);
    let m = manager(&s, Arc::new(Fake::default())).await;
    let labelled = |team: &str| [("team".to_string(), team.to_string())].into();
    let rl = m
        .create(CreateSandbox {
            labels: labelled("rl"),
            ..req(64)
        })
        .await
        .unwrap();
    assert_eq!(rl.on_timeout, Some(OnTimeout::Terminate));
    assert_eq!(rl.expires_at, None, "no timeout, no expiry");
    let eval = m
        .create(CreateSandbox {
            name: Some("eval".into()),
            timeout_secs: Some(3600),
            labels: labelled("eval"),
            ..req(64)
        })
        .await
        .unwrap();
    assert_eq!(eval.on_timeout, Some(OnTimeout::Suspend), "named: suspend");
    assert!(eval.expires_at.as_deref() > Some(eval.created_at.as_str()));

    let only = |labels: &str| ListQuery {
        labels: Some(labels.into()),
        ..Default::default()
    };
    let ids = |q| {
        m.list(&q)
            .unwrap()
            .into_iter()
            .map(|v| v.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(only(r#"{"team":"rl"}"#)), vec![rl.id.clone()]);
    assert_eq!(ids(only(r#"{"team":"eval"}"#)), vec![eval.id.clone()]);
    assert!(ids(only(r#"{"team":"rl","x":"y"}"#)).is_empty());
    assert_eq!(ids(only("{}")).len(), 2);
    let bad = m.list(&only("team=rl")).unwrap_err();
    assert!(
        matches!(bad, Error::InvalidArgument(ref msg) if msg.contains("JSON object")),
        "{bad:?}"
    );

    let too_long = UpdateSandbox {
        timeout_secs: Some(u64::MAX),
        ..Default::default()
    };
    let err = m.update(&eval.id, too_long).await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument(ref msg) if msg.contains("timeout_secs")),
        "{err:?}"
    );
    let set = UpdateSandbox {
        timeout_secs: Some(1),
        on_timeout: Some(OnTimeout::Terminate),
        ..Default::default()
    };
    let now = m.update(&rl.id, set).await.unwrap();
    assert_eq!(now.timeout_secs, 1);
    assert!(now.expires_at.is_some());
    until("the new timeout terminates it", || {
        m.get(&rl.id).unwrap().state == State::Terminated
    })
    .await;
    assert_eq!(m.get(&eval.id).unwrap().state, State::Running);
}
