//! `producer-bench`: producer throughput of the plain, idempotent and transactional modes on a real
//! broker (logic in `price_alerts_bench::producer`). Prints the table to stdout and writes results.json,
//! summary.csv, runs.csv and throughput.png into --out-dir.
//!
//! Ctrl-C stops after the current run's next check; the runs so far are reported (marked
//! interrupted) and the topics deleted. A second Ctrl-C exits at once.

use clap::Parser;
use price_alerts::cli::main_of;
use price_alerts_bench::producer::{self as bench, options::BenchCli};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn main() -> ExitCode {
    main_of("producer-bench", run)
}

fn run() -> anyhow::Result<ExitCode> {
    let cli = BenchCli::parse();
    if let Some(results) = &cli.replot {
        for path in bench::replot(results)? {
            price_alerts::errln!("wrote {}", path.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let opts = cli.options()?;
    let stop = Arc::new(AtomicBool::new(false));
    watch_ctrl_c(Arc::clone(&stop));
    let report = bench::run(&opts, &stop)?;
    price_alerts::outln!("{report}");
    if let Some(dir) = &opts.out_dir {
        for path in bench::write_outputs(&report, dir)? {
            price_alerts::errln!("wrote {}", path.display());
        }
    }
    Ok(if report.interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// Sets `stop` on the first Ctrl-C and exits on the second, from a small thread of its own (the
/// benchmark itself is blocking code).
fn watch_ctrl_c(stop: Arc<AtomicBool>) {
    let spawned = std::thread::Builder::new()
        .name("ctrl-c".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if tokio::signal::ctrl_c().await.is_ok() {
                    price_alerts::errln!(
                        "producer-bench: stopping after the current run (Ctrl-C again to quit now)"
                    );
                    stop.store(true, Ordering::Relaxed);
                    if tokio::signal::ctrl_c().await.is_ok() {
                        std::process::exit(130);
                    }
                }
            });
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no Ctrl-C handler: Ctrl-C will end the benchmark without cleanup");
    }
}
