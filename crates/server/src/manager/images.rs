//! Images: named, sealed base layers built by the backend and recorded in the store.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::{lock, now_rfc3339, Manager};
use crate::backend::{ImageBuild, ImageSpec};
use crate::error::{Error, Result};
use api_types::{BuildImage, Image, ImageDetails, PullImage, PushImage, PushedImage};

/// The canonical form of a registry reference, or why it is none.
fn canonical(reference: &str) -> Result<String> {
    registry::canonical(reference).map_err(|e| Error::InvalidArgument(model::error_chain(&e)))
}

/// Builders the runtime offers.
pub const BUILDERS: [&str; 4] = ["busybox", "debian", "python", "browser"];

/// Whether `name` can name an image: 1-64 of lowercase letters, digits, '-', '_' and
/// '.', not starting with '-' or '.'.
pub fn is_image_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
        && !name.starts_with(['-', '.'])
}

fn check_image_name(name: &str) -> Result<()> {
    if is_image_name(name) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "Invalid image name {name:?}: use 1-64 of lowercase letters, digits, '-', '_' and '.'"
        )))
    }
}

/// Largest Dockerfile read, in bytes.
const MAX_DOCKERFILE: u64 = 1 << 20;

/// The Dockerfile at `rel` in the build context: a relative path without `..`, not a
/// symlink, at most 1 MiB.
fn read_dockerfile(context: &std::path::Path, rel: &str) -> Result<String> {
    use std::path::Component;
    let bad = |why: String| Error::InvalidArgument(format!("Dockerfile {rel:?}: {why}"));
    let path = std::path::Path::new(rel);
    if rel.is_empty()
        || path
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(bad("must be a relative path in the build context".into()));
    }
    // The context is the caller's: no component may be a symlink (it could lead out).
    let mut full = context.to_path_buf();
    let mut meta = None;
    for c in path.components() {
        full.push(c);
        let m = std::fs::symlink_metadata(&full)
            .map_err(|_| bad("not found in the build context".into()))?;
        if m.file_type().is_symlink() {
            return Err(bad("is or passes through a symlink".into()));
        }
        meta = Some(m);
    }
    let meta = meta.ok_or_else(|| bad("empty path".into()))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    if meta.len() > MAX_DOCKERFILE {
        return Err(bad(format!("larger than {MAX_DOCKERFILE} bytes")));
    }
    std::fs::read_to_string(&full).map_err(|e| bad(e.to_string()))
}

fn check_package(p: &str) -> Result<()> {
    let ok = !p.is_empty()
        && p.len() <= 200
        && !p.starts_with('-')
        && p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.+:=<>~[],".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "Invalid package name {p:?}"
        )))
    }
}

/// Checks an image build request.
pub fn validate_build(req: &BuildImage) -> Result<()> {
    check_image_name(&req.name)?;
    if !BUILDERS.contains(&req.builder.as_str()) {
        return Err(Error::InvalidArgument(format!(
            "Unknown builder {:?} (one of {})",
            req.builder,
            BUILDERS.join(", ")
        )));
    }
    if req.builder == "busybox" && !(req.apt.is_empty() && req.pip.is_empty()) {
        return Err(Error::Unsupported(
            "The busybox builder takes no packages".into(),
        ));
    }
    if req.builder == "debian" && !req.pip.is_empty() {
        return Err(Error::Unsupported(
            "pip packages need the python or browser builder".into(),
        ));
    }
    req.apt
        .iter()
        .chain(&req.pip)
        .try_for_each(|p| check_package(p))
}

impl Manager {
    /// Builds (or rebuilds) an image, sending progress lines to `progress`.
    pub async fn build_image(
        &self,
        req: BuildImage,
        progress: mpsc::Sender<String>,
    ) -> Result<Image> {
        self.check_open()?;
        validate_build(&req)?;
        let _build = self.image_builds.lock().await;
        self.build_locked(req, progress).await
    }

    async fn build_locked(&self, req: BuildImage, progress: mpsc::Sender<String>) -> Result<Image> {
        let build = ImageBuild {
            name: req.name.clone(),
            builder: req.builder.clone(),
            apt: req.apt,
            pip: req.pip,
        };
        let existed = self.store.image(req.name.clone()).await?.is_some();
        let built = match self.backend.build_image(&build, progress).await {
            Ok(built) => built,
            Err(e) => {
                self.undo_build(&req.name, existed).await;
                return Err(e.into());
            }
        };
        let image = Image {
            name: req.name,
            layer_id: built.layer_id,
            size_bytes: built.size_bytes,
            created_at: now_rfc3339(),
            builder: req.builder,
        };
        if let Err(e) = self.store.put_image(image.clone()).await {
            self.undo_build(&image.name, existed).await;
            return Err(e.into());
        }
        tracing::info!(image = %image.name, layer = %image.layer_id, "image built");
        Ok(image)
    }

    /// After a failed build: a new name is removed again (the backend may have published
    /// it before the record failed), and layers nothing uses are freed.
    async fn undo_build(&self, name: &str, existed: bool) {
        if !existed {
            let _ = self.backend.remove_image(name).await;
        }
        if let Err(e) = self.backend.collect_garbage().await {
            tracing::warn!(image = %name, error = %e, "freeing a failed build's layers failed");
        }
    }

    /// Puts the store back in line with the backend's images after a crash. An image the
    /// store never recorded (the daemon died before a build answered, or during a delete)
    /// is removed; a rebuild the store has not recorded yet is recorded, as the name
    /// already pins the new layer rather than the recorded one.
    pub(super) async fn recover_images(&self) -> Result<()> {
        let recorded = self.store.images().await?;
        for (name, built) in self.backend.images().await? {
            match recorded.iter().find(|i| i.name == name) {
                None => {
                    tracing::info!(image = %name, "removing an image whose build was not recorded");
                    if let Err(e) = self.backend.remove_image(&name).await {
                        tracing::warn!(image = %name, error = %e, "image removal failed");
                    }
                }
                Some(i) if i.layer_id != built.layer_id => {
                    tracing::info!(image = %name, layer = %built.layer_id, "recording a finished rebuild");
                    let image = Image {
                        layer_id: built.layer_id,
                        size_bytes: built.size_bytes,
                        created_at: now_rfc3339(),
                        ..i.clone()
                    };
                    self.store.put_image(image).await?;
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Every image.
    pub async fn images(&self) -> Result<Vec<Image>> {
        Ok(self.store.images().await?)
    }

    /// An image, its config and origin; a reference may be given in short form.
    pub async fn image_details(&self, name: &str) -> Result<ImageDetails> {
        let image = self.find_image(name).await?;
        let c = self.backend.image_config(&image.name).await?;
        Ok(ImageDetails {
            image,
            source: c.source,
            digest: c.digest,
            env: c.env,
            working_dir: c.working_dir,
            user: c.user,
            entrypoint: c.entrypoint,
            cmd: c.cmd,
            exposed_ports: c.exposed_ports,
            labels: c.labels,
        })
    }

    /// The recorded image `name`, a registry reference also in short form.
    async fn find_image(&self, name: &str) -> Result<Image> {
        let mut found = self.store.image(name.to_string()).await?;
        if found.is_none() && registry::looks_like_reference(name) {
            found = self.store.image(canonical(name)?).await?;
        }
        found.ok_or_else(|| Error::NotFound(format!("Image {name} not found")))
    }

    /// Removes an image name. Sandboxes using it keep their disks (layers are shared).
    pub async fn delete_image(&self, name: &str) -> Result<()> {
        let image = self.find_image(name).await?;
        self.store.delete_image(name.to_string()).await?;
        self.backend.remove_image(&image.name).await?;
        Ok(())
    }

    /// The image a new sandbox boots from; a built-in image is built on first use.
    pub(super) async fn resolve_image(&self, name: &str) -> Result<ImageSpec> {
        let (tx, mut rx) = mpsc::channel(16);
        tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let i = self.ensure_image(name, tx).await?;
        Ok(ImageSpec {
            name: i.name,
            layer_id: i.layer_id,
        })
    }

    /// Image `name`, built first when it is a built-in one not built yet. Concurrent
    /// callers share one build and each sees all of its progress lines; the build goes on
    /// when a caller leaves.
    pub async fn ensure_image(&self, name: &str, progress: mpsc::Sender<String>) -> Result<Image> {
        self.check_open()?;
        if let Some(i) = self.store.image(name.to_string()).await? {
            return Ok(i);
        }
        if registry::looks_like_reference(name) {
            let reference = canonical(name)?;
            if let Some(i) = self.store.image(reference.clone()).await? {
                return Ok(i);
            }
            return self.shared_pull(&reference, None).follow(progress).await;
        }
        if !BUILDERS.contains(&name) {
            return Err(Error::NotFound(format!(
                "Image {name} not found (built-in images: {}; build others with `sandfork image build`)",
                BUILDERS.join(", ")
            )));
        }
        self.shared_build(name).follow(progress).await
    }

    /// Builds image `name` from the Dockerfile at `dockerfile` (a path in the build context
    /// `context`), with `build_args` for its ARGs. Its FROM image is pulled or built first
    /// when missing; every RUN or COPY step is cached (see the runc backend's
    /// `dockerfile` module).
    pub async fn build_dockerfile(
        &self,
        name: &str,
        context: &std::path::Path,
        dockerfile: &str,
        build_args: &std::collections::BTreeMap<String, String>,
        progress: mpsc::Sender<String>,
    ) -> Result<Image> {
        self.check_open()?;
        check_image_name(name)?;
        let text = read_dockerfile(context, dockerfile)?;
        let file = runtime::image::dockerfile::parse(&text, build_args)
            .map_err(|e| Error::InvalidArgument(model::error_chain(&e)))?;
        let base = self.ensure_image(&file.from, progress.clone()).await?;
        let _build = self.image_builds.lock().await;
        let existed = self.store.image(name.to_string()).await?.is_some();
        let spec = crate::backend::ImageSpec {
            name: base.name.clone(),
            layer_id: base.layer_id.clone(),
        };
        let built = match self
            .backend
            .build_dockerfile(name, &file, context, &spec, progress)
            .await
        {
            Ok(b) => b,
            Err(e) => {
                self.undo_build(name, existed).await;
                return Err(e.into());
            }
        };
        let image = Image {
            name: name.to_string(),
            layer_id: built.layer_id,
            size_bytes: built.size_bytes,
            created_at: now_rfc3339(),
            builder: "dockerfile".into(),
        };
        if let Err(e) = self.store.put_image(image.clone()).await {
            self.undo_build(name, existed).await;
            return Err(e.into());
        }
        tracing::info!(image = %name, layer = %image.layer_id, "image built from a Dockerfile");
        Ok(image)
    }

    /// Imports the image of an unpacked archive at `dir` (docker-archive or OCI layout) as
    /// `name`, else under the name the archive gives it.
    pub async fn import_image(&self, dir: &std::path::Path, name: Option<&str>) -> Result<Image> {
        self.check_open()?;
        if let Some(n) = name.filter(|n| !registry::looks_like_reference(n)) {
            check_image_name(n)?;
        }
        let _build = self.image_builds.lock().await;
        let existed = match name {
            Some(n) => self.store.image(n.to_string()).await?.is_some(),
            None => true,
        };
        let (name, built) = match self.backend.import_image(dir, name).await {
            Ok(r) => r,
            Err(e) => {
                if let Some(n) = name {
                    self.undo_build(n, existed).await;
                }
                return Err(e.into());
            }
        };
        let image = Image {
            name: name.clone(),
            layer_id: built.layer_id,
            size_bytes: built.size_bytes,
            created_at: now_rfc3339(),
            builder: "import".into(),
        };
        if let Err(e) = self.store.put_image(image.clone()).await {
            self.undo_build(&name, existed).await;
            return Err(e.into());
        }
        tracing::info!(image = %name, "image imported");
        Ok(image)
    }

    /// Writes image `name` as an oci-archive in the data directory's `tmp`; returns it
    /// (the caller removes it).
    pub async fn export_image(&self, name: &str, docker: bool) -> Result<std::path::PathBuf> {
        self.check_open()?;
        let image = self.find_image(name).await?;
        let dir = self.config.data_dir.join("tmp");
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| Error::InvalidArgument(format!("Export failed: {e}")))?;
        let out = dir.join(format!("{}.oci.tar", model::ids::random_id::<8>("image")?));
        match self.backend.export_image(&image.name, &out, docker).await {
            Ok(()) => Ok(out),
            Err(e) => {
                let _ = tokio::fs::remove_file(&out).await;
                Err(e.into())
            }
        }
    }

    /// Pushes image `req.name` to registry reference `req.reference`.
    pub async fn push_image(&self, req: PushImage) -> Result<PushedImage> {
        self.check_open()?;
        let image = self.find_image(&req.name).await?;
        let reference = canonical(&req.reference)?;
        let credentials = match (req.username, req.password) {
            (Some(u), Some(p)) => Some((u, p)),
            (None, None) => None,
            _ => {
                return Err(Error::InvalidArgument(
                    "username and password go together".into(),
                ))
            }
        };
        let url = self
            .backend
            .push_image(&image.name, &reference, credentials)
            .await?;
        tracing::info!(image = %image.name, reference = %reference, "image pushed");
        Ok(PushedImage {
            reference,
            manifest_url: url,
        })
    }

    /// Makes snapshot `snapshot_id`'s disk image `name` (its source image's config, the
    /// snapshot's env over it): a template for new sandboxes that outlives the snapshot.
    pub async fn image_from_snapshot(&self, name: &str, snapshot_id: &str) -> Result<Image> {
        self.check_open()?;
        check_image_name(name)?;
        let rec = self.usable_snapshot(snapshot_id).await?;
        let _build = self.image_builds.lock().await;
        let existed = self.store.image(name.to_string()).await?.is_some();
        let built = match self
            .backend
            .image_from_layer(name, &rec.layer_id, &rec.boot.image.name, &rec.boot.env)
            .await
        {
            Ok(b) => b,
            Err(e) => {
                self.undo_build(name, existed).await;
                return Err(e.into());
            }
        };
        let image = Image {
            name: name.to_string(),
            layer_id: built.layer_id,
            size_bytes: built.size_bytes,
            created_at: now_rfc3339(),
            builder: "snapshot".into(),
        };
        if let Err(e) = self.store.put_image(image.clone()).await {
            self.undo_build(name, existed).await;
            return Err(e.into());
        }
        tracing::info!(image = %name, snapshot = %snapshot_id, "image made from a snapshot");
        Ok(image)
    }

    /// Pulls an image from its registry (again, when it is here already: tags move) and
    /// records it under its canonical reference. A pull of the same reference in flight
    /// is joined rather than repeated.
    pub async fn pull_image(
        &self,
        req: PullImage,
        progress: mpsc::Sender<String>,
    ) -> Result<Image> {
        self.check_open()?;
        let reference = canonical(&req.reference)?;
        let credentials = match (req.username, req.password) {
            (Some(u), Some(p)) => Some((u, p)),
            (None, None) => None,
            _ => {
                return Err(Error::InvalidArgument(
                    "username and password go together".into(),
                ))
            }
        };
        self.shared_pull(&reference, credentials)
            .follow(progress)
            .await
    }

    /// The pull of `reference` in flight, started if there is none.
    fn shared_pull(
        &self,
        reference: &str,
        credentials: Option<(String, String)>,
    ) -> Arc<SharedBuild> {
        let key = format!("pull {reference}");
        let mut builds = lock(&self.shared_builds);
        if let Some(b) = builds.get(&key) {
            return b.clone();
        }
        let pull = Arc::new(SharedBuild::default());
        builds.insert(key.clone(), pull.clone());
        let (me, reference, p) = (self.weak_self(), reference.to_string(), pull.clone());
        tokio::spawn(async move {
            let Some(m) = me.upgrade() else { return };
            let result = m.pull_locked(&reference, credentials, &p).await;
            lock(&m.shared_builds).remove(&key);
            p.finish(result);
        });
        pull
    }

    async fn pull_locked(
        &self,
        reference: &str,
        credentials: Option<(String, String)>,
        pull: &Arc<SharedBuild>,
    ) -> Result<Image> {
        let _build = self.image_builds.lock().await;
        let (tx, mut rx) = mpsc::channel::<String>(64);
        let log = pull.clone();
        let forward = tokio::spawn(async move {
            while let Some(line) = rx.recv().await {
                log.push(line);
            }
        });
        let existed = self.store.image(reference.to_string()).await?.is_some();
        let pulled = self.backend.pull_image(reference, credentials, tx).await;
        let _ = forward.await;
        let built = match pulled {
            Ok(built) => built,
            Err(e) => {
                self.undo_build(reference, existed).await;
                return Err(e.into());
            }
        };
        let image = Image {
            name: reference.to_string(),
            layer_id: built.layer_id,
            size_bytes: built.size_bytes,
            created_at: now_rfc3339(),
            builder: "pull".into(),
        };
        if let Err(e) = self.store.put_image(image.clone()).await {
            self.undo_build(&image.name, existed).await;
            return Err(e.into());
        }
        tracing::info!(image = %image.name, layer = %image.layer_id, "image pulled");
        Ok(image)
    }

    /// The build of built-in image `name` in flight, started if there is none.
    fn shared_build(&self, name: &str) -> Arc<SharedBuild> {
        let mut builds = lock(&self.shared_builds);
        if let Some(b) = builds.get(name) {
            return b.clone();
        }
        let build = Arc::new(SharedBuild::default());
        builds.insert(name.to_string(), build.clone());
        let (me, name, b) = (self.weak_self(), name.to_string(), build.clone());
        tokio::spawn(async move {
            let Some(m) = me.upgrade() else { return };
            let result = m.build_if_missing(&name, &b).await;
            lock(&m.shared_builds).remove(&name);
            b.finish(result);
        });
        build
    }

    async fn build_if_missing(&self, name: &str, build: &Arc<SharedBuild>) -> Result<Image> {
        let _build = self.image_builds.lock().await;
        if let Some(i) = self.store.image(name.to_string()).await? {
            return Ok(i);
        }
        let (tx, mut rx) = mpsc::channel::<String>(64);
        let log = build.clone();
        let forward = tokio::spawn(async move {
            while let Some(line) = rx.recv().await {
                log.push(line);
            }
        });
        build.push(format!("building the {name} image (first use; once)"));
        let req = BuildImage {
            name: name.into(),
            builder: name.into(),
            ..Default::default()
        };
        let result = self.build_locked(req, tx).await;
        let _ = forward.await;
        result
    }
}

/// One build of a built-in image, shared by every request that needs it meanwhile.
#[derive(Default)]
pub(super) struct SharedBuild {
    log: std::sync::Mutex<Vec<String>>,
    result: std::sync::Mutex<Option<std::result::Result<Image, Error>>>,
    changed: tokio::sync::Notify,
}

impl SharedBuild {
    fn push(&self, line: String) {
        lock(&self.log).push(line);
        self.changed.notify_waiters();
    }

    fn finish(&self, result: Result<Image>) {
        *lock(&self.result) = Some(result);
        self.changed.notify_waiters();
    }

    /// Sends every progress line (from the first) to `progress`, until the build ends;
    /// then its result.
    async fn follow(&self, progress: mpsc::Sender<String>) -> Result<Image> {
        let mut sent = 0;
        loop {
            let changed = self.changed.notified();
            let lines: Vec<String> = lock(&self.log)[sent..].to_vec();
            sent += lines.len();
            for line in lines {
                let _ = progress.send(line).await;
            }
            if let Some(result) = &*lock(&self.result) {
                if lock(&self.log).len() == sent {
                    return result.as_ref().cloned().map_err(Error::for_another);
                }
                continue;
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_requests_are_checked() {
        let ok = BuildImage {
            name: "py".into(),
            builder: "python".into(),
            pip: vec!["numpy==2.0".into()],
            ..Default::default()
        };
        validate_build(&ok).unwrap();
        let bad_name = BuildImage {
            name: "Py/x".into(),
            ..ok.clone()
        };
        assert_eq!(validate_build(&bad_name).unwrap_err().status_code().0, 400);
        let bad_builder = BuildImage {
            builder: "alpine".into(),
            ..ok.clone()
        };
        assert_eq!(
            validate_build(&bad_builder).unwrap_err().status_code().0,
            400
        );
        let bad_pkg = BuildImage {
            pip: vec!["x; rm -rf /".into()],
            ..ok.clone()
        };
        assert_eq!(validate_build(&bad_pkg).unwrap_err().status_code().0, 400);
        let opt = BuildImage {
            pip: vec!["--index-url".into()],
            ..ok.clone()
        };
        assert_eq!(validate_build(&opt).unwrap_err().status_code().0, 400);
        let busybox_pkgs = BuildImage {
            builder: "busybox".into(),
            apt: vec!["curl".into()],
            ..ok
        };
        assert_eq!(
            validate_build(&busybox_pkgs).unwrap_err().status_code().0,
            422
        );
    }
}
