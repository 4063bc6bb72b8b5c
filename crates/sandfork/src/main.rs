//! The `sandfork` binary: everything lives in the `cli` library.

fn main() {
    std::process::exit(cli::main());
}
