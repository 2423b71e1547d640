//! `deliver-bench`: alert-deliver's deliveries/s by fan-out, subscribers in the file and
//! connection mode, against a plain at-most-once reference with the same HTTP client; its latency
//! at half saturation, its RSS and CPU, and the healthy subscribers' share during an outage.
//! `deliver-bench reference` is the reference itself, which the bench starts as a child.
//!
//! Its flags, and what it does with them, are in [`price_alerts_bench::deliver::cli`].

use clap::Parser as _;
use price_alerts::cli::main_of;
use price_alerts_bench::deliver::cli::BenchCli;
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("deliver-bench", || {
        BenchCli::parse().run().map(|()| ExitCode::SUCCESS)
    })
}
