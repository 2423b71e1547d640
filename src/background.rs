//! Threads that work beside a stage (the group lag and DLQ backlog watchers) and end with it.
//!
//! Why not detached: such a thread holds a librdkafka client of its own. A process that returns
//! from `main` while the thread is still inside librdkafka runs its exit handlers (OpenSSL's
//! cleanup among them, which a TLS connection of that client still uses) under the thread's feet.
//! So dropping a [`Background`] stops its thread and waits until the thread's work, and with it the
//! client, has been dropped; for a bounded time only ([`STOP_WAIT`]): a thread inside a call that
//! never returns (librdkafka #5456, #5511) is left behind with a warning, because the shutdown
//! bound is a promise.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// How long dropping a [`Background`] waits for its thread.
pub const STOP_WAIT: Duration = Duration::from_secs(2);

/// A running thread; dropping it stops the thread and waits for it (see the module docs).
pub struct Background {
    name: String,
    stop: Arc<AtomicBool>,
    /// Disconnected once the thread has ended and dropped everything its work held.
    ended: mpsc::Receiver<()>,
}

impl Background {
    /// Runs `work` on a thread named `name`. The flag it is given turns true when it is to stop;
    /// it should look at it at least every few hundred milliseconds.
    pub fn spawn(
        name: &str,
        work: impl FnOnce(&AtomicBool) + Send + 'static,
    ) -> std::io::Result<Background> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let (ended_tx, ended) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                // Dropped last, after `work` and everything it captured.
                let _ended = ended_tx;
                work(&flag);
            })?;
        Ok(Background {
            name: name.to_owned(),
            stop,
            ended,
        })
    }

    /// Stops the thread and waits for it for at most `bound`; true when it ended.
    pub fn stop_within(&self, bound: Duration) -> bool {
        self.stop.store(true, Ordering::Relaxed);
        matches!(
            self.ended.recv_timeout(bound),
            Err(mpsc::RecvTimeoutError::Disconnected)
        )
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if !self.stop_within(STOP_WAIT) {
            tracing::warn!(thread = %self.name, wait = ?STOP_WAIT, "a background thread did not stop in time; leaving it behind");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Holds a flag up while alive: what a client held by the work stands for.
    struct Held(Arc<AtomicBool>);
    impl Drop for Held {
        fn drop(&mut self) {
            // Slow to drop, as a librdkafka client is.
            std::thread::sleep(Duration::from_millis(200));
            self.0.store(false, Ordering::SeqCst);
        }
    }

    #[test]
    fn dropping_stops_the_thread_and_waits_until_what_it_held_is_dropped() {
        let alive = Arc::new(AtomicBool::new(true));
        let held = Held(Arc::clone(&alive));
        let bg = Background::spawn("test-bg", move |stop| {
            let _held = held;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
            }
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(alive.load(Ordering::SeqCst));
        drop(bg);
        assert!(
            !alive.load(Ordering::SeqCst),
            "the drop returned before the thread's client was dropped"
        );
    }

    #[test]
    fn a_thread_that_does_not_stop_is_left_behind_within_the_bound() {
        let bg = Background::spawn("test-stuck", |_| {
            std::thread::sleep(Duration::from_secs(30))
        })
        .unwrap();
        let t = Instant::now();
        assert!(!bg.stop_within(Duration::from_millis(100)));
        assert!(t.elapsed() < Duration::from_secs(2));
        // Its drop waits STOP_WAIT at most, then leaves it.
        let t = Instant::now();
        drop(bg);
        assert!(t.elapsed() < STOP_WAIT + Duration::from_secs(1));
    }
}
