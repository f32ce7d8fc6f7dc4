//! `ringsock-ctl`: see `ringsock_ctl::cli` for the commands.

fn main() {
    std::process::exit(ringsock_ctl::cli::main(
        std::env::args_os().skip(1).collect(),
    ));
}
