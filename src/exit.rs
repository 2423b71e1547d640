//! Ending the process from a watchdog thread without losing the line that says why.
//!
//! The binaries' log lines go to stderr through a writer thread and a bounded queue
//! (`cli::log`), so that a slow reader never blocks the processing loop. `std::process::exit`
//! does not wait for that thread: the last lines, the watchdog's ERROR line among them, were lost
//! at the exit (tests/sink.rs's watchdog test saw it in none of its runs), and a log collector,
//! which reads the structured lines, never learnt why the process ended. [`exit`] first drops
//! what [`flush_at_exit`] was given, the log writer's guard, whose drop flushes the queue within
//! its own bound (tracing-appender's: about a second, also when stderr's reader is stuck).
//!
//! A leaf: the health endpoint's watchdog and the command line's shutdown watchdog both exit
//! through it, and the logging set-up of `cli` hands it the guard.

use std::any::Any;
use std::sync::Mutex;

/// What is dropped just before the process exits (the log writer's guard).
static AT_EXIT: Mutex<Option<Box<dyn Any + Send>>> = Mutex::new(None);

/// Keeps `value` until [`exit`] (or [`release`]) drops it.
pub fn flush_at_exit(value: impl Any + Send) {
    if let Ok(mut slot) = AT_EXIT.lock() {
        *slot = Some(Box::new(value));
    }
}

/// Drops what [`flush_at_exit`] keeps: at a clean end, when `main` returns.
pub fn release() {
    let kept = AT_EXIT.lock().ok().and_then(|mut slot| slot.take());
    drop(kept);
}

/// Flushes (drops what [`flush_at_exit`] keeps), then exits the process with `code`.
pub fn exit(code: i32) -> ! {
    release();
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn what_is_kept_is_dropped_once_released() {
        let dropped = Arc::new(AtomicBool::new(false));
        flush_at_exit(Flag(Arc::clone(&dropped)));
        assert!(!dropped.load(Ordering::SeqCst), "kept until released");
        release();
        assert!(dropped.load(Ordering::SeqCst), "dropped at release");
        release(); // nothing kept: a no-op
    }
}
