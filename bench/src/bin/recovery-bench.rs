//! `recovery-bench`: after a SIGKILL of an instance holding a large state, how long its restart
//! takes to restore the state and reach its first commit; repeated, p50 and max.
//!
//! Its flags, and what it does with them, are in [`price_alerts_bench::recovery::cli`].

use clap::Parser as _;
use price_alerts::cli::main_of;
use price_alerts_bench::recovery::cli::BenchCli;
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("recovery-bench", || {
        BenchCli::parse().run().map(|()| ExitCode::SUCCESS)
    })
}
