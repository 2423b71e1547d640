//! Logging of the binaries: structured lines on stderr, filtered by `RUST_LOG`.
//!
//! - `RUST_LOG` takes tracing's filter syntax; the default is `warn,price_alerts=info`
//!   (`RUST_LOG=debug` shows every transaction, `RUST_LOG=librdkafka=debug` librdkafka's own lines).
//! - Colour only when stderr is a terminal and `NO_COLOR` is not set: redirected logs carry no
//!   escape codes.
//! - Lines are handed to a writer thread through a bounded queue and dropped when it is full
//!   (lossy), so a slow or stuck reader never blocks the processing loop; a closed stderr is
//!   swallowed, never a panic. A watchdog's exit flushes the queue first ([`crate::exit`]).

use std::io::{self, IsTerminal as _, Write};
use tracing_appender::non_blocking::NonBlockingBuilder;

/// Log lines that may wait for the writer thread before new ones are dropped.
const QUEUED_LINES: usize = 10_000;

/// Keeps the log writer thread alive; dropping it flushes what is queued (briefly). The writer's
/// guard itself is kept by [`crate::exit`], so that a watchdog's exit flushes it too.
pub struct LogGuard {
    _private: (),
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        crate::exit::release();
    }
}

/// Installs the subscriber (once per process; a second call is a no-op) and returns the guard
/// that flushes queued lines when dropped.
pub fn init_logging() -> LogGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,price_alerts=info"));
    let colour =
        io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let (writer, worker) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(QUEUED_LINES)
        .thread_name("log-writer")
        .finish(Stderr);
    let installed = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(writer)
        .try_init()
        .is_ok();
    if installed {
        crate::exit::flush_at_exit(worker);
    }
    LogGuard { _private: () }
}

/// stderr whose errors are swallowed: a reader that went away must cost log lines, not the
/// process (the writer thread would otherwise report the failure with a panicking `eprintln!`).
struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}
