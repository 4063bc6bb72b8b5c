//! How long each step of a create or a restore takes, told as `debug` events of target
//! `sandfork::steps` with the step's name (`step`) and its milliseconds (`ms`). The restore
//! breakdown in docs/checkpoints.md is measured from them (`bench_fork` collects them).

use std::time::Instant;

/// Tells that `step`, begun at `since`, is done.
pub(crate) fn done(step: &'static str, since: Instant) {
    let ms = since.elapsed().as_secs_f64() * 1e3;
    tracing::debug!(target: "sandfork::steps", step, ms);
}
