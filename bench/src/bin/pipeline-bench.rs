//! `pipeline-bench`: the pipeline's cost of exactly-once (throughput, end-to-end latency, peak
//! RSS) at several commit intervals, against at-least-once; interleaved, repeated, medians.
//!
//! Its flags, and what it does with them, are in [`price_alerts_bench::pipeline::cli`].

use clap::Parser as _;
use price_alerts::cli::main_of;
use price_alerts_bench::pipeline::cli::BenchCli;
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("pipeline-bench", || {
        BenchCli::parse().run().map(|()| ExitCode::SUCCESS)
    })
}
