//! `ringsock-man [--date D] OUT_DIR`: writes the manual pages the Debian
//! package installs: ringsock-ctl.8 and one ringsock-ctl-CMD.8 per
//! subcommand, from ctl's clap definitions (`clap_mangen`), and
//! ringsock.7, the shim's environment, from the "Knobs" section of
//! docs/shim.md. Pages are written uncompressed; scripts/package-deb
//! compresses them.

mod knobs;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use clap_mangen::Man;
use ringsock_ctl::cli::Cli;

/// The shim's documentation, whose "Knobs" section becomes ringsock.7.
const SHIM_MD: &str = include_str!("../../../../docs/shim.md");
/// Footer text of every page (the manual's name).
const MANUAL: &str = "ringsock";

#[derive(Parser)]
#[command(about = "Writes ringsock's manual pages into OUT_DIR")]
struct Args {
    /// Date in the pages' footers, e.g. 2026-11-27 (the package passes
    /// its source date, so rebuilds give the same pages)
    #[arg(long, default_value = "")]
    date: String,
    /// Directory to write into (must exist)
    out_dir: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match write_all(&args.out_dir, &args.date) {
        Ok(names) => {
            for n in names {
                println!("{}", n.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ringsock-man: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes every page; returns their paths.
fn write_all(out: &Path, date: &str) -> Result<Vec<PathBuf>, String> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    // Gives subcommands their display names (ringsock-ctl-daemon, ...).
    cmd.build();
    let version = cmd.get_version().unwrap_or_default().to_owned();
    let source = format!("ringsock {version}");
    let mut written = Vec::new();
    let page = |c: clap::Command| {
        Man::new(c)
            .section("8")
            .date(date)
            .source(source.as_str())
            .manual(MANUAL)
            .generate_to(out)
            .map_err(|e| format!("writing into {}: {e}", out.display()))
    };
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        written.push(page(sub.clone())?);
    }
    written.push(page(cmd)?);

    let shim = knobs::page(SHIM_MD, date, &source, MANUAL)?;
    let path = out.join("ringsock.7");
    std::fs::write(&path, shim).map_err(|e| format!("writing {}: {e}", path.display()))?;
    written.push(path);
    Ok(written)
}
