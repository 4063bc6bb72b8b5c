//! What unpacking a tar stream may take of the host: the import cap and the free space
//! beyond the floor, whoever the stream comes from (a registry's layer, an OCI layout, a
//! root filesystem tarball, a build context).

use std::path::Path;

use super::unpack;
use crate::error::{Error, IoContext, Result};

/// What one layer may unpack to on the filesystem of `at`: the import cap, and the free
/// space beyond the floor shared among `copies` (the bottom layer is written twice, as a
/// directory and as the ext4 image made of it).
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    pub(super) bytes: u64,
    /// Whether the free space, not the import cap, set it.
    by_disk: bool,
}

impl Budget {
    pub(super) fn of(limits: super::UnpackLimits, at: &Path, copies: u64) -> Result<Budget> {
        let free = crate::space::free_bytes(at).at(at)?;
        let room = free.saturating_sub(limits.floor_bytes) / copies.max(1);
        Ok(Budget {
            bytes: room.min(limits.max_bytes),
            by_disk: room < limits.max_bytes,
        })
    }

    /// The error for `layer` (a tar stream) unpacking past this budget: out of space (507) when the disk
    /// set it, else too large (413) naming the cap.
    pub(super) fn exceeded(&self, at: &Path, layer: &Path, limits: super::UnpackLimits) -> Error {
        if self.by_disk {
            tracing::warn!(layer = %layer.display(), room_mb = self.bytes >> 20, "an image layer unpacks to more than the host disk has free beyond its floor");
            return Error::io(at, std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        Error::TooLarge(format!(
            "{} unpacks to more than the {} MiB an import may take (max_import_bytes)",
            layer
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            limits.max_bytes >> 20
        ))
    }
}

/// Unpacks `layer` into `root` (with `whiteouts`: an OCI layer) within `budget`: stopped
/// once its uncompressed stream passes it, as too large or out of space (see
/// [`Budget::exceeded`]).
pub(super) fn unpack_within(
    layer: &Path,
    root: &Path,
    whiteouts: bool,
    budget: Budget,
    at: &Path,
    limits: super::UnpackLimits,
) -> Result<()> {
    match unpack::unpack_layer_within(layer, root, whiteouts, budget.bytes) {
        Err(unpack::UnpackError::TooLarge { .. }) => Err(budget.exceeded(at, layer, limits)),
        Err(source) => Err(Error::Layer {
            layer: layer.into(),
            source,
        }),
        Ok(()) => Ok(()),
    }
}
