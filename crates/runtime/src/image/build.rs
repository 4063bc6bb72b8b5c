//! Image builds: what to build from, and the plan a build follows (a base layer made on
//! the host without running anything of the image, then steps that run in a sandbox).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{
    import_oci_layout, import_tarball, report, rootfs, validate_name, BuildDir, Defaults,
    ImageMeta, Images, ProgressFn,
};
use crate::error::{Error, IoContext, Result};

/// What to build an image from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "path", rename_all = "snake_case")]
pub enum Source {
    /// busybox-static and a minimal /etc; builds in seconds.
    Busybox,
    /// Debian minbase (debootstrap).
    Debian,
    /// Debian with python3, pip, venv and numpy.
    Python,
    /// `Python` plus headless Chromium and Playwright.
    Browser,
    /// A root filesystem tarball (`docker export` format), optionally gzip-compressed.
    Tarball(PathBuf),
    /// An OCI image layout directory.
    OciLayout(PathBuf),
}

/// A user-defined image: a source plus extra packages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildSpec {
    pub name: String,
    pub source: Source,
    #[serde(default)]
    pub apt: Vec<String>,
    #[serde(default)]
    pub pip: Vec<String>,
}

/// One command of a build that runs inside a build sandbox (never on the host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildStep {
    /// What it does, for progress and errors.
    pub what: String,
    pub argv: Vec<String>,
    /// Whether it needs the package mirrors (the build sandbox gets internet access).
    pub network: bool,
}

/// A build as the host prepares it: a base layer made without running anything of the
/// image, then the steps that must run inside a sandbox booted from that layer (package
/// managers, maintainer scripts). `Images::finish` publishes the result.
#[derive(Debug)]
pub struct BuildPlan {
    pub name: String,
    pub base: blockstore::LayerId,
    pub size: u64,
    pub defaults: Defaults,
    pub steps: Vec<BuildStep>,
    /// Pins `base` until the build ends.
    pin: String,
}

impl Images {
    /// Builds and publishes an image whose build needs no step inside a sandbox (it has
    /// none: otherwise the runtime runs them, see [`Images::prepare`]). Nothing is left
    /// behind if any part fails.
    pub fn build(&self, spec: &BuildSpec, progress: ProgressFn<'_>) -> Result<ImageMeta> {
        let plan = self.prepare(spec, progress)?;
        if !plan.steps.is_empty() {
            let steps: Vec<&str> = plan.steps.iter().map(|s| s.what.as_str()).collect();
            let e = Error::Image(format!(
                "these steps need a build sandbox: {}",
                steps.join(", ")
            ));
            self.abandon(plan);
            return Err(e);
        }
        let (layer, size) = (plan.base.clone(), plan.size);
        let meta = self.finish(plan, &layer, size)?;
        report(progress, "done", meta.layer.clone());
        Ok(meta)
    }

    /// The host's part of a build: the base root filesystem (busybox applets linked, a
    /// Debian system unpacked but not configured, a tarball or OCI layout unpacked — no
    /// program of the image is run), imported as a pinned layer; and the steps left.
    pub fn prepare(&self, spec: &BuildSpec, progress: ProgressFn<'_>) -> Result<BuildPlan> {
        validate_name(&spec.name)?;
        rootfs::validate_packages(&spec.apt)?;
        rootfs::validate_packages(&spec.pip)?;
        let work = BuildDir::new(&self.dir, &spec.name)?;
        let root = work.path().join("rootfs");
        std::fs::create_dir(&root).at(&root)?;
        let mut defaults = Defaults::default();
        let mut steps = Vec::new();
        match &spec.source {
            Source::Busybox => rootfs::busybox(&root, progress)?,
            Source::Debian => steps.extend(rootfs::debian(&root, progress)?),
            Source::Python => steps.extend(rootfs::python(&root, progress)?),
            Source::Browser => steps.extend(rootfs::browser(&root, progress)?),
            Source::Tarball(t) => import_tarball(t, &root, self.limits(), progress)?,
            Source::OciLayout(l) => {
                defaults = import_oci_layout(l, &root, self.limits(), progress)?
            }
        }
        steps.extend(rootfs::apt_step(&spec.apt));
        steps.extend(rootfs::pip_step(&root, &spec.pip)?);
        steps.extend(rootfs::cleanup_step(&root));
        let pin = format!("build-{}-{}", std::process::id(), work.serial());
        let (base, size) = self.import_rootfs(&spec.name, &root, &pin, progress)?;
        Ok(BuildPlan {
            name: spec.name.clone(),
            base,
            size,
            defaults,
            steps,
            pin,
        })
    }

    /// Publishes `layer` (what the steps made of the plan's base, or the base itself) as
    /// the plan's image and drops the plan's pin.
    pub fn finish(
        &self,
        plan: BuildPlan,
        layer: &blockstore::LayerId,
        size: u64,
    ) -> Result<ImageMeta> {
        let meta = self.publish_layer(&plan.name, layer, size, plan.defaults.clone());
        self.abandon(plan);
        meta
    }

    /// Drops a plan's pin (its layers go at the next garbage collection).
    pub fn abandon(&self, plan: BuildPlan) {
        let _ = self.store.delete_ref(&plan.pin);
    }
}
