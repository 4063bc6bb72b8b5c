//! Any byte string given to the artifact decoder yields a value or a typed error, never a
//! panic, a hang or an allocation out of proportion to the input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = blockstore::verify_artifact(&mut &data[..]);
});
