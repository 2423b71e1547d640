//! `alert-chaos`: the chaos runner on the local cluster of `scripts/kafka.sh up --brokers 3`.
//! Exit 0 only if exactly-once held: offsets at the input's end, 0 missing, 0 duplicate,
//! 0 unexpected, no hanging transaction, every dead letter once, and (all stages, the default)
//! the alerts table and every subscriber's accepted keys equal to the oracle. Defaults: the
//! short all-stage run.

use clap::Parser;
use price_alerts::cli::chaos::ChaosArgs;
use price_alerts::cli::main_of;
use price_alerts::tools::chaos;
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("alert-chaos", || {
        let o = ChaosArgs::parse().options()?;
        price_alerts::outln!(
            "alert-chaos: seed {}; instance logs in {}",
            o.seed,
            o.work_dir.display()
        );
        let report = chaos::run(&o)?;
        price_alerts::outln!("{report}");
        Ok(if report.ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    })
}
