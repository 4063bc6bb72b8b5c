//! Image builds: the host prepares a base layer without running anything of the image
//! (`runtime::image::Images::prepare`), then every build step — Debian's second stage,
//! apt, pip — runs inside a build sandbox booted from it, exactly like a user's sandbox
//! (runc, seccomp, a sandbox's capabilities, its own network namespace with the guarded
//! egress policy). A filesystem checkpoint of the build sandbox is the image's layer.

use std::collections::BTreeMap;
use std::time::Duration;

use proto::agent::ExecRequest;
use runtime::image::{BuildPlan, BuildSpec, BuildStep};
use runtime::{CheckpointKind, ImageRef, NetworkMode, Resources, SandboxSpec};
use tokio::sync::mpsc;

use super::{error_chain, host_err, RuncBackend};
use crate::backend::{BackendError, BackendResult, BuiltImage};

/// Room a build sandbox's disk has beyond its base (the disk is thin: unused room costs
/// nothing).
const BUILD_ROOM_MB: u64 = 4096;
/// Longest a build step may run.
const STEP_TIMEOUT: Duration = Duration::from_secs(3600);
/// Lines of a failed step's output kept for its error.
const TAIL_LINES: usize = 12;

impl RuncBackend {
    /// Builds image `spec.name`, reporting progress lines to `progress`.
    pub(super) async fn build(
        &self,
        spec: BuildSpec,
        progress: mpsc::Sender<String>,
    ) -> BackendResult<BuiltImage> {
        let images = self.images.clone();
        let report = progress.clone();
        let plan = blocking(move || {
            let report = |p: runtime::image::Progress| {
                let _ = report.blocking_send(format!("{}: {}", p.stage, p.detail));
            };
            images.prepare(&spec, &report).map_err(build_err)
        })
        .await?;
        let made = if plan.steps.is_empty() {
            Ok((plan.base.clone(), plan.size))
        } else {
            self.run_steps(&plan, &progress).await
        };
        let images = self.images.clone();
        let meta = blocking(move || match made {
            Ok((layer, size)) => images.finish(plan, &layer, size).map_err(build_err),
            Err(e) => {
                images.abandon(plan);
                Err(e)
            }
        })
        .await?;
        let _ = progress.send(format!("done: {}", meta.layer)).await;
        Ok(BuiltImage {
            layer_id: meta.layer,
            size_bytes: meta.size,
        })
    }

    /// Boots a build sandbox on the plan's base, runs its steps in order, and seals its
    /// disk; returns the sealed layer and the disk's size. The sandbox is removed
    /// whatever happens.
    async fn run_steps(
        &self,
        plan: &BuildPlan,
        progress: &mpsc::Sender<String>,
    ) -> BackendResult<(blockstore::LayerId, u64)> {
        let id =
            model::ids::random_id::<8>("build").map_err(|e| BackendError::Host(e.to_string()))?;
        let network = if plan.steps.iter().any(|s| s.network) {
            NetworkMode::Internet {
                allow_out: Vec::new(),
                deny_out: Vec::new(),
                by_name: None,
            }
        } else {
            NetworkMode::None
        };
        let spec = SandboxSpec {
            id: id.clone(),
            image: ImageRef {
                name: format!("build-{}", plan.name),
                layer: plan.base.to_string(),
                env: plan.defaults.env.clone(),
                cwd: "/".into(),
                user: None,
            },
            resources: Resources {
                cpus: 2.0,
                memory_mb: 2048,
                disk_mb: (plan.size >> 20) + BUILD_ROOM_MB,
                ..Resources::default()
            },
            env: BTreeMap::from([("DEBIAN_FRONTEND".into(), "noninteractive".into())]),
            network,
            volumes: Vec::new(),
        };
        let _ = progress
            .send(format!("sandbox: booting build sandbox {id}"))
            .await;
        let sealed = match self.runtime.create(spec).await {
            Ok(handle) => self.steps_then_seal(&id, &handle, plan, progress).await,
            Err(e) => Err(host_err(e)),
        };
        if let Err(e) = self.runtime.destroy(&id).await {
            tracing::warn!(sandbox = %id, error = %e, "removing a build sandbox failed");
        }
        sealed
    }

    async fn steps_then_seal(
        &self,
        id: &str,
        handle: &runtime::SandboxHandle,
        plan: &BuildPlan,
        progress: &mpsc::Sender<String>,
    ) -> BackendResult<(blockstore::LayerId, u64)> {
        let agent = handle.agent();
        for step in &plan.steps {
            run_step(&agent, step, progress).await?;
        }
        let _ = progress
            .send("seal: filesystem checkpoint of the build".into())
            .await;
        let info = self
            .runtime
            .checkpoint(id, CheckpointKind::Filesystem, None)
            .await
            .map_err(host_err)?;
        let layer: blockstore::LayerId = info
            .layer
            .parse()
            .map_err(|e| BackendError::Host(format!("Sealed layer id: {e}")))?;
        let size = self
            .images
            .store()
            .layer_info(&layer)
            .map_err(|e| BackendError::Host(e.to_string()))?
            .size;
        Ok((layer, size))
    }
}

/// Runs one step in the build sandbox, forwarding its output lines as progress; a step
/// that fails is the build's error, with the end of its output.
async fn run_step(
    agent: &agent_client::AgentClient,
    step: &BuildStep,
    progress: &mpsc::Sender<String>,
) -> BackendResult<()> {
    let _ = progress.send(format!("step: {}", step.what)).await;
    let (command, args) = step.argv.split_first().expect("a step has a program");
    let req = ExecRequest {
        command: command.clone(),
        args: args.to_vec(),
        ..Default::default()
    };
    run_exec(agent, &step.what, req, progress).await
}

/// Runs `req` in a build sandbox (at most an hour), forwarding its output lines as
/// progress (prefixed with `what`); a non-zero exit is an error with the end of its
/// output.
pub(super) async fn run_exec(
    agent: &agent_client::AgentClient,
    what: &str,
    mut req: ExecRequest,
    progress: &mpsc::Sender<String>,
) -> BackendResult<()> {
    req.timeout_ms = Some(STEP_TIMEOUT.as_millis() as u64);
    let mut stream = agent
        .exec(req)
        .await
        .map_err(|e| BackendError::Host(error_chain(&e)))?;
    let mut tail: Vec<String> = Vec::new();
    let mut partial = String::new();
    let mut shown = Progress::default();
    loop {
        match stream
            .next()
            .await
            .map_err(|e| BackendError::Host(error_chain(&e)))?
        {
            Some(agent_client::ExecEvent::Stdout(data) | agent_client::ExecEvent::Stderr(data)) => {
                partial += &String::from_utf8_lossy(&data);
                while let Some(at) = partial.find('\n') {
                    let line: String = partial.drain(..=at).collect();
                    // A line redrawn with carriage returns (apt's and dpkg's counters):
                    // what it showed last.
                    let line = line
                        .trim_end()
                        .rsplit('\r')
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    if shown.due(&line) {
                        let _ = progress.try_send(format!("{what}: {line}"));
                    }
                    tail.push(line);
                    if tail.len() > TAIL_LINES {
                        tail.remove(0);
                    }
                }
            }
            Some(agent_client::ExecEvent::Exit(exit)) => {
                if matches!(exit.status, proto::agent::ExitStatus::Code(0)) {
                    return Ok(());
                }
                tail.push(partial);
                return Err(BackendError::Host(format!(
                    "Image build step {what:?} failed ({:?}): {}",
                    exit.status,
                    tail.join(" | ").trim()
                )));
            }
            None => {
                return Err(BackendError::Host(format!(
                    "Image build step {what:?}: the sandbox ended its output without an exit"
                )))
            }
        }
    }
}

/// Which output lines of a build step become progress: a line that differs from the one
/// before only in its numbers (`(Reading database ... 45%`, `Get:12 …`) is shown at most
/// once a second, so a counter is progress, not hundreds of lines. Every line still goes
/// to the tail a failure reports.
#[derive(Default)]
struct Progress {
    shape: String,
    at: Option<std::time::Instant>,
}

impl Progress {
    fn due(&mut self, line: &str) -> bool {
        let shape: String = line.chars().filter(|c| !c.is_ascii_digit()).collect();
        let recent = self
            .at
            .is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(1));
        if shape == self.shape && recent {
            return false;
        }
        self.shape = shape;
        self.at = Some(std::time::Instant::now());
        true
    }
}

fn build_err(e: runtime::Error) -> BackendError {
    BackendError::Host(format!("Image build failed: {}", error_chain(&e)))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> BackendResult<T> + Send + 'static,
) -> BackendResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BackendError::Host(format!("Image build task failed: {e}")))?
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::config::Config;
    use runtime::image::Source;

    #[test]
    fn counters_are_progress_not_a_line_each() {
        let mut p = Progress::default();
        assert!(p.due("(Reading database ... 5%"));
        assert!(!p.due("(Reading database ... 10%"));
        assert!(!p.due("(Reading database ... 95%"));
        assert!(p.due("Unpacking python3 (3.11.2-1) ..."));
        assert!(p.due("(Reading database ... 100%"));
    }

    /// As root: a real build sandbox. A build step is hostile code (any package's install
    /// script): it runs confined like a user's sandbox, never in a host chroot.
    #[tokio::test(flavor = "multi_thread")]
    async fn build_steps_run_confined_in_a_sandbox_that_is_removed_after() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("host-marker");
        std::fs::write(&marker, "host secret").unwrap();
        let config = Config {
            data_dir: dir.path().join("data"),
            ..Config::default()
        };
        let backend = RuncBackend::open_concrete(&config).unwrap();
        let spec = BuildSpec {
            name: "probe".into(),
            source: Source::Busybox,
            apt: vec![],
            pip: vec![],
        };
        let mut plan = backend.images.prepare(&spec, &|_| {}).unwrap();
        let m = marker.display();
        let probe = |what: &str, script: String| BuildStep {
            what: what.into(),
            argv: vec!["/bin/sh".into(), "-c".into(), script],
            network: false,
        };
        plan.steps = vec![
            probe("read the host", format!("cat /proc/1/root{m} {m} 2>/dev/null && exit 9; exit 0")),
            probe("write the host", format!("echo pwned > {m}; echo pwned > /proc/1/root{m}; exit 0")),
            probe("block devices", "ls /dev/sda /dev/vda /dev/loop0 2>/dev/null && exit 9; exit 0".into()),
            probe("confined", "grep -q '^Seccomp:.*2' /proc/self/status && grep -q '^NoNewPrivs:.*1' /proc/self/status".into()),
            probe("mount", "mount -t tmpfs x /mnt 2>/dev/null && exit 9; exit 0".into()),
            probe("write the image", "echo built > /built".into()),
        ];
        let (tx, mut rx) = mpsc::channel(256);
        tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let sealed = backend.run_steps(&plan, &tx).await;
        backend.images.abandon(plan);
        let (layer, _) = sealed.expect("every probe was refused and the build sealed");
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), "host secret");
        assert!(!layer.to_string().is_empty());
        assert!(
            backend.runtime.list().await.unwrap().is_empty(),
            "the build sandbox is gone"
        );
        // A failing step fails the build with its output.
        let mut plan = backend.images.prepare(&spec, &|_| {}).unwrap();
        plan.steps = vec![probe("fail", "echo broken >&2; exit 3".into())];
        let e = backend.run_steps(&plan, &tx).await.unwrap_err();
        backend.images.abandon(plan);
        assert!(e.to_string().contains("broken"), "{e}");
        assert!(backend.runtime.list().await.unwrap().is_empty());
    }
}
