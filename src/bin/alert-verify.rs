//! `alert-verify`: the oracle. Recomputes the expected notifications from the input topic with the
//! crossing rule and compares them with what read_committed readers find. Exit 1 on any missing,
//! duplicate or unexpected notification. The logic is in `price_alerts::tools::verify`; the flags
//! in `price_alerts::cli::verify`.

use clap::Parser;
use price_alerts::cli::verify::VerifyArgs;
use price_alerts::cli::{init_logging, report};
use price_alerts::tools::verify::verify;
use price_alerts::{errln, outln};
use std::process::ExitCode;

fn main() -> ExitCode {
    let _log = init_logging();
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        // 2, not main_of's 1: 1 says the check found a difference.
        Err(e) => {
            errln!("alert-verify: {}", report(&e));
            ExitCode::from(2)
        }
    }
}

fn run() -> anyhow::Result<bool> {
    let report = verify(&VerifyArgs::parse().options()?)?;
    outln!("{report}");
    Ok(report.ok())
}
