//! `sink-bench`: alert-sink's rows/s into PostgreSQL (batched against one row per transaction)
//! and the end-to-end latency from tick append to row visible; interleaved, repeated, medians.
//!
//! Its flags, and what it does with them, are in [`price_alerts_bench::sink::cli`].

use clap::Parser as _;
use price_alerts::cli::main_of;
use price_alerts_bench::sink::cli::BenchCli;
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("sink-bench", || {
        BenchCli::parse().run().map(|()| ExitCode::SUCCESS)
    })
}
