//! Dockerfile builds. Every step that changes files (`RUN`, `COPY`, `ADD`) runs in a build
//! sandbox booted from the layer before it, exactly like a user's sandbox, and is sealed
//! into a layer by a filesystem checkpoint. That layer is recorded under the step's cache
//! key — the layer it started from, the instruction, the environment, user and working
//! directory it ran with, and the digests of the files it copied — as block-store ref
//! `buildcache-<key>`. A rebuild finds every unchanged step's layer by its key and starts
//! executing at the first step that changed; later steps then miss too, since their key
//! names a new parent layer.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use proto::agent::ExecRequest;
use runtime::image::dockerfile::{Dockerfile, Step, StepKind};
use runtime::image::{Defaults, ImageMeta};
use runtime::{CheckpointKind, ImageRef, NetworkMode, Resources, SandboxSpec};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::{error_chain, host_err, RuncBackend};
use crate::backend::{BackendError, BackendResult, BuiltImage, ImageSpec};

/// Room a build sandbox's disk has beyond its base (thin: unused room costs nothing).
const BUILD_ROOM_MB: u64 = 4096;
/// Largest single file a COPY carries into the build sandbox.
const MAX_COPY_FILE: u64 = 1 << 30;

/// The image config as the build goes (what the image's sandboxes will get).
#[derive(Debug, Clone, Default)]
struct Config {
    env: BTreeMap<String, String>,
    cwd: String,
    user: Option<String>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    ports: Vec<String>,
    labels: BTreeMap<String, String>,
}

impl Config {
    fn of(meta: &ImageMeta) -> Config {
        Config {
            env: meta.env.clone(),
            cwd: meta.cwd.clone(),
            user: meta.user.clone(),
            entrypoint: meta.entrypoint.clone(),
            cmd: meta.cmd.clone(),
            ports: meta.exposed_ports.clone(),
            labels: meta.labels.clone(),
        }
    }

    /// Applies a step that changes only the config.
    fn apply(&mut self, kind: &StepKind) {
        match kind {
            StepKind::Env(vars) => self.env.extend(vars.iter().cloned()),
            StepKind::Workdir(dir) => self.cwd = dir.clone(),
            StepKind::User(u) => self.user = Some(u.clone()),
            StepKind::Entrypoint(argv) => {
                // As Docker: a new entrypoint drops the base image's command.
                self.entrypoint = argv.clone();
                self.cmd.clear();
            }
            StepKind::Cmd(argv) => self.cmd = argv.clone(),
            StepKind::Label(l) => self.labels.extend(l.iter().cloned()),
            StepKind::Expose(p) => {
                self.ports.extend(p.iter().cloned());
                self.ports.sort();
                self.ports.dedup();
            }
            StepKind::Run { .. } | StepKind::Copy { .. } => {}
        }
    }

    fn defaults(&self) -> Defaults {
        Defaults {
            env: self.env.clone(),
            cwd: Some(self.cwd.clone()),
            user: self.user.clone(),
            entrypoint: self.entrypoint.clone(),
            cmd: self.cmd.clone(),
            exposed_ports: self.ports.clone(),
            labels: self.labels.clone(),
            source: None,
            digest: None,
            blobs: Vec::new(),
        }
    }
}

/// A build sandbox while consecutive steps miss the cache.
struct Builder {
    id: String,
    handle: runtime::SandboxHandle,
}

impl RuncBackend {
    /// Builds image `name` from a parsed Dockerfile whose context is `context`, on base
    /// image `base` (already here), reporting progress lines.
    pub(super) async fn build_dockerfile(
        &self,
        name: &str,
        file: &Dockerfile,
        context: &Path,
        base: &ImageSpec,
        progress: mpsc::Sender<String>,
    ) -> BackendResult<BuiltImage> {
        let meta = self.images.get(&base.name).map_err(host_err)?;
        let mut config = Config::of(&meta);
        let mut parent: blockstore::LayerId = base
            .layer_id
            .parse()
            .map_err(|e| BackendError::Host(format!("Base layer id: {e}")))?;
        let mut builder: Option<Builder> = None;
        let n = file.steps.len();
        let mut result = Ok(());
        for (i, step) in file.steps.iter().enumerate() {
            let head = format!("step {}/{n}: {}", i + 1, step.text);
            if !step.kind.makes_layer() {
                config.apply(&step.kind);
                let _ = progress.send(head).await;
                continue;
            }
            let key = match cache_key(&parent, step, &config, context) {
                Ok(k) => k,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            if let Ok(layer) = self.images.store().get_ref(&format!("buildcache-{key}")) {
                let _ = progress.send(format!("{head} (cached)")).await;
                parent = layer;
                // A sandbox booted from an older layer no longer matches.
                self.drop_builder(builder.take()).await;
                continue;
            }
            let _ = progress.send(head.clone()).await;
            let step_result = self
                .run_dockerfile_step(
                    &mut builder,
                    &parent,
                    step,
                    &config,
                    context,
                    &head,
                    &progress,
                )
                .await;
            match step_result {
                Ok(layer) => {
                    if let Err(e) = self
                        .images
                        .store()
                        .set_ref(&format!("buildcache-{key}"), &layer)
                    {
                        tracing::warn!(error = %e, "recording a build step in the cache failed");
                    }
                    parent = layer;
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.drop_builder(builder.take()).await;
        result?;
        let size = self
            .images
            .store()
            .layer_info(&parent)
            .map_err(|e| BackendError::Host(e.to_string()))?
            .size;
        let images = self.images.clone();
        let (name, defaults) = (name.to_string(), config.defaults());
        let layer = parent.clone();
        let meta = tokio::task::spawn_blocking(move || {
            images.publish_layer(&name, &layer, size, defaults)
        })
        .await
        .map_err(|e| BackendError::Host(e.to_string()))?
        .map_err(host_err)?;
        let _ = progress.send(format!("done: {}", meta.layer)).await;
        Ok(BuiltImage {
            layer_id: meta.layer,
            size_bytes: meta.size,
        })
    }

    /// Runs one RUN or COPY step in the build sandbox (booted from `parent` first when
    /// there is none) and seals the result; returns its layer.
    #[allow(clippy::too_many_arguments)]
    async fn run_dockerfile_step(
        &self,
        builder: &mut Option<Builder>,
        parent: &blockstore::LayerId,
        step: &Step,
        config: &Config,
        context: &Path,
        head: &str,
        progress: &mpsc::Sender<String>,
    ) -> BackendResult<blockstore::LayerId> {
        if builder.is_none() {
            *builder = Some(self.boot_builder(parent, config).await?);
        }
        let b = builder.as_ref().expect("booted above");
        let agent = b.handle.agent();
        let mkdir = ExecRequest {
            command: "/bin/mkdir".into(),
            args: vec!["-p".into(), config.cwd.clone()],
            user: Some("0".into()),
            ..Default::default()
        };
        // Best effort: an image without mkdir still builds when its WORKDIR exists.
        let _ = agent.exec_collect(mkdir, 4096).await;
        match &step.kind {
            StepKind::Run { argv, args } => {
                let (command, rest) = argv.split_first().ok_or_else(|| {
                    BackendError::InvalidInput(format!("Dockerfile line {}: empty RUN", step.line))
                })?;
                let mut env: Vec<(String, String)> =
                    args.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                env.extend(config.env.iter().map(|(k, v)| (k.clone(), v.clone())));
                let req = ExecRequest {
                    command: command.clone(),
                    args: rest.to_vec(),
                    env,
                    cwd: Some(config.cwd.clone()),
                    user: config.user.clone(),
                    ..Default::default()
                };
                super::build::run_exec(&agent, head, req, progress)
                    .await
                    .map_err(|e| match e {
                        BackendError::Host(m) => {
                            BackendError::ExecFailed(format!("Dockerfile line {}: {m}", step.line))
                        }
                        other => other,
                    })?;
            }
            StepKind::Copy { sources, dest } => {
                copy_in(&agent, context, sources, dest, &config.cwd, step.line).await?;
            }
            _ => unreachable!("only RUN and COPY make layers"),
        }
        let info = self
            .runtime
            .checkpoint(&b.id, CheckpointKind::Filesystem, None)
            .await
            .map_err(host_err)?;
        info.layer
            .parse()
            .map_err(|e| BackendError::Host(format!("Sealed layer id: {e}")))
    }

    async fn boot_builder(
        &self,
        parent: &blockstore::LayerId,
        config: &Config,
    ) -> BackendResult<Builder> {
        let id =
            model::ids::random_id::<8>("build").map_err(|e| BackendError::Host(e.to_string()))?;
        let size = self
            .images
            .store()
            .layer_info(parent)
            .map_err(|e| BackendError::Host(e.to_string()))?
            .size;
        let spec = SandboxSpec {
            id: id.clone(),
            image: ImageRef {
                name: "dockerfile-build".into(),
                layer: parent.to_string(),
                env: config.env.clone(),
                cwd: "/".into(),
                user: None,
            },
            resources: Resources {
                cpus: 2.0,
                memory_mb: 2048,
                disk_mb: (size >> 20) + BUILD_ROOM_MB,
                ..Resources::default()
            },
            env: BTreeMap::new(),
            network: NetworkMode::Internet {
                allow_out: Vec::new(),
                deny_out: Vec::new(),
                by_name: None,
            },
            volumes: Vec::new(),
        };
        let handle = self.runtime.create(spec).await.map_err(host_err)?;
        Ok(Builder { id, handle })
    }

    async fn drop_builder(&self, b: Option<Builder>) {
        if let Some(b) = b {
            if let Err(e) = self.runtime.destroy(&b.id).await {
                tracing::warn!(sandbox = %b.id, error = %e, "removing a build sandbox failed");
            }
        }
    }
}

/// The cache key of a RUN or COPY step. Every field goes in framed by its length
/// ([`field`]), so no two different steps, configs or contexts hash the same stream (a
/// file's content cannot pose as the next entry's name).
fn cache_key(
    parent: &blockstore::LayerId,
    step: &Step,
    config: &Config,
    context: &Path,
) -> BackendResult<String> {
    let mut h = Sha256::new();
    for f in [
        "sandfork-dockerfile-v2".to_string(),
        parent.to_string(),
        step.text.clone(),
        format!("{:?}", config.env),
        config.cwd.to_string(),
        format!("{:?}", config.user),
    ] {
        field(&mut h, f.as_bytes());
    }
    match &step.kind {
        StepKind::Run { argv, args } => {
            field(&mut h, b"run");
            field(&mut h, format!("{argv:?}").as_bytes());
            field(&mut h, format!("{args:?}").as_bytes());
        }
        StepKind::Copy { sources, dest } => {
            field(&mut h, b"copy");
            field(&mut h, &(sources.len() as u64).to_le_bytes());
            for s in sources {
                field(&mut h, s.as_bytes());
            }
            field(&mut h, dest.as_bytes());
            for s in sources {
                let path = in_context(context, s, step.line)?;
                hash_tree(&mut h, &path, Path::new(s))?;
            }
        }
        _ => {}
    }
    Ok(format!("{:x}", h.finalize()))
}

/// One field of a cache key: its length (8 bytes, little-endian), then its bytes.
fn field(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// Hashes a file or directory tree: per entry its relative name, kind, mode and content
/// (a file's, a symlink's target, a directory's entry count), each framed by its length.
fn hash_tree(h: &mut Sha256, path: &Path, rel: &Path) -> BackendResult<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    let io = |e: std::io::Error| {
        BackendError::InvalidInput(format!("build context {}: {e}", rel.display()))
    };
    let meta = std::fs::symlink_metadata(path).map_err(io)?;
    field(h, rel.as_os_str().as_bytes());
    field(h, &meta.permissions().mode().to_le_bytes());
    if meta.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path).map_err(io)?.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        field(h, b"dir");
        field(h, &(entries.len() as u64).to_le_bytes());
        for e in entries {
            hash_tree(h, &e.path(), &rel.join(e.file_name()))?;
        }
    } else if meta.is_file() {
        field(h, b"file");
        let mut f = std::fs::File::open(path).map_err(io)?;
        // The length first (the file's size as read, checked against what was hashed).
        h.update(meta.len().to_le_bytes());
        let n = std::io::copy(&mut f, h).map_err(io)?;
        if n != meta.len() {
            return Err(io(std::io::Error::other("changed while it was read")));
        }
    } else if meta.file_type().is_symlink() {
        field(h, b"symlink");
        field(
            h,
            std::fs::read_link(path).map_err(io)?.as_os_str().as_bytes(),
        );
    } else {
        field(h, b"other");
    }
    Ok(())
}

/// A COPY source as a path inside the context: relative, without `..`, and not through a
/// symlink (the context is the caller's and may be hostile).
fn in_context(context: &Path, source: &str, line: usize) -> BackendResult<PathBuf> {
    let bad = |why: &str| {
        BackendError::InvalidInput(format!(
            "Dockerfile line {line}: COPY source {source:?}: {why}"
        ))
    };
    if source.contains(['*', '?', '[']) {
        return Err(bad("wildcards are not supported yet"));
    }
    let mut path = context.to_path_buf();
    for c in Path::new(source).components() {
        match c {
            Component::Normal(p) => {
                path.push(p);
                let m = std::fs::symlink_metadata(&path)
                    .map_err(|_| bad("not in the build context"))?;
                if m.file_type().is_symlink() {
                    return Err(bad("is or passes through a symlink"));
                }
            }
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(bad("leaves the build context"))
            }
        }
    }
    if !path.exists() {
        return Err(bad("not in the build context"));
    }
    Ok(path)
}

/// Copies COPY sources from the context into the build sandbox through its agent
/// (root-owned, modes kept), with Docker's rules for `dest`: a directory when it ends in
/// `/`, when there are several sources, or when a source is a directory (whose contents,
/// not itself, are copied).
async fn copy_in(
    agent: &agent_client::AgentClient,
    context: &Path,
    sources: &[String],
    dest: &str,
    cwd: &str,
    line: usize,
) -> BackendResult<()> {
    let dest = if dest.starts_with('/') {
        dest.to_string()
    } else {
        format!("{}/{dest}", cwd.trim_end_matches('/'))
    };
    let into_dir = dest.ends_with('/') || sources.len() > 1;
    for s in sources {
        let path = in_context(context, s, line)?;
        if path.is_dir() {
            copy_dir(agent, &path, dest.trim_end_matches('/')).await?;
        } else if into_dir {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            copy_file(
                agent,
                &path,
                &format!("{}/{name}", dest.trim_end_matches('/')),
            )
            .await?;
        } else {
            copy_file(agent, &path, &dest).await?;
        }
    }
    Ok(())
}

async fn copy_dir(agent: &agent_client::AgentClient, dir: &Path, dest: &str) -> BackendResult<()> {
    let dest = if dest.is_empty() { "/" } else { dest };
    agent
        .mkdir(dest, true, None)
        .await
        .map_err(|e| BackendError::Host(error_chain(&e)))?;
    let mut stack = vec![(dir.to_path_buf(), dest.to_string())];
    while let Some((src, dst)) = stack.pop() {
        let entries = std::fs::read_dir(&src)
            .map_err(|e| BackendError::Host(format!("{}: {e}", src.display())))?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let target = format!("{}/{name}", dst.trim_end_matches('/'));
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                agent
                    .mkdir(&target, true, None)
                    .await
                    .map_err(|e| BackendError::Host(error_chain(&e)))?;
                stack.push((e.path(), target));
            } else if ft.is_file() {
                copy_file(agent, &e.path(), &target).await?;
            }
            // Symlinks and special files of the context are not carried.
        }
    }
    Ok(())
}

async fn copy_file(agent: &agent_client::AgentClient, src: &Path, dest: &str) -> BackendResult<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(src)
        .map_err(|e| BackendError::Host(format!("{}: {e}", src.display())))?;
    if meta.len() > MAX_COPY_FILE {
        return Err(BackendError::TooLarge(format!(
            "COPY of {} ({} bytes): files over {MAX_COPY_FILE} bytes are not carried",
            src.display(),
            meta.len()
        )));
    }
    let data = tokio::fs::read(src)
        .await
        .map_err(|e| BackendError::Host(format!("{}: {e}", src.display())))?;
    let opts = agent_client::WriteOptions {
        mode: Some(meta.permissions().mode() & 0o7777),
        create_parents: true,
        owner: None,
    };
    agent
        .write_file_bytes(dest, opts, &data)
        .await
        .map_err(|e| BackendError::Host(format!("COPY to {dest}: {}", error_chain(&e))))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn digest(path: &Path) -> String {
        let mut h = Sha256::new();
        hash_tree(&mut h, path, Path::new(".")).unwrap();
        format!("{:x}", h.finalize())
    }

    fn file(path: &Path, content: &[u8]) {
        std::fs::write(path, content).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }

    /// Two contexts that hashed the same stream when fields were not framed: a directory
    /// of files `a` ("X") and `b` ("Y"), and one of a file `a` whose content is "X"
    /// followed by what `b`'s entry added to the stream.
    #[test]
    fn a_crafted_context_does_not_collide_with_another() {
        let dir = tempfile::tempdir().unwrap();
        let (one, two) = (dir.path().join("one"), dir.path().join("two"));
        std::fs::create_dir(&one).unwrap();
        std::fs::create_dir(&two).unwrap();
        file(&one.join("a"), b"X");
        file(&one.join("b"), b"Y");
        let mut crafted = b"X".to_vec();
        crafted.extend_from_slice(b"./b\x00100644\x00Y");
        file(&two.join("a"), &crafted);
        assert_ne!(digest(&one), digest(&two));
        // And the key still follows content, names and modes.
        let before = digest(&one);
        file(&one.join("b"), b"Z");
        assert_ne!(digest(&one), before);
        file(&one.join("b"), b"Y");
        assert_eq!(digest(&one), before);
        std::fs::rename(one.join("b"), one.join("c")).unwrap();
        assert_ne!(digest(&one), before);
    }

    #[test]
    fn a_file_content_cannot_pose_as_the_next_field() {
        let mut a = Sha256::new();
        field(&mut a, b"ab");
        field(&mut a, b"c");
        let mut b = Sha256::new();
        field(&mut b, b"a");
        field(&mut b, b"bc");
        assert_ne!(a.finalize(), b.finalize());
    }
}
