//! `rules-bench`: how soon a live alert put with `alert-rules put` is in force, at a paced stream.
//!
//! Its flags, and what it does with them, are in [`price_alerts_bench::rules::cli`].

use clap::Parser as _;
use price_alerts::cli::main_of;
use price_alerts_bench::rules::cli::BenchCli;
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("rules-bench", || {
        BenchCli::parse().run().map(|()| ExitCode::SUCCESS)
    })
}
