//! `rebalance-bench`: how long each partition goes without committed progress when an instance
//! of three is stopped (SIGTERM), killed (SIGKILL) or added, under the classic group protocol and
//! KIP-848's consumer protocol, interleaved; p50, p99 and max over the repeats, a plot.
//!
//! Its flags, and what it does with them, are in [`price_alerts_bench::rebalance::cli`].

use clap::Parser as _;
use price_alerts::cli::main_of;
use price_alerts_bench::rebalance::cli::BenchCli;
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("rebalance-bench", || {
        BenchCli::parse().run().map(|()| ExitCode::SUCCESS)
    })
}
