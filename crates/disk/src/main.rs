//! `sandfork-disk`: see [`disk::cli`].

fn main() {
    std::process::exit(disk::cli::main());
}
