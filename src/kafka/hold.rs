//! TEST ONLY: holds a process right before one of its transactional calls, so that a broker test
//! can break the cluster while the call is about to run (`--test-hold-send-offsets <FILE>` of
//! alert-pipeline and alert-deliver; tests/coordinator.rs).
//!
//! A hang inside `send_offsets_to_transaction` after the group coordinator's broker is lost
//! (librdkafka #5456, #5511) depends on the coordinator being gone when the call starts; a live
//! stream makes that moment a matter of luck. With the hook the test decides it:
//!
//! ```text
//!  test: create FILE ─────────────────────────────► wait for FILE.held ─► kill the coordinator ─► remove FILE
//!  process: before send_offsets: FILE exists? ─► settle ─► write FILE.held (its pid) ─► wait ─► the call
//! ```
//!
//! `settle` is what the caller does first: the transactional callers flush, so that every record
//! of the held transaction is acknowledged before the test breaks a broker. Otherwise a record
//! still in flight to the lost broker times out and fails the transaction before the call is
//! made, and the test shows the abort path instead of the call.
//!
//! Off by default (no file named, nothing checked). The wait polls every 50 ms and ends when the
//! file is removed, when the process is asked to stop (where the caller has its stop flag), or
//! after [`HOLD_AT_MOST`] however the test went, so a forgotten file never holds a process for ever.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How often the file is looked at while held.
const POLL: Duration = Duration::from_millis(50);
/// The longest hold, whatever the file does.
pub const HOLD_AT_MOST: Duration = Duration::from_secs(600);

/// If `file` is named and exists, runs `settle`, writes `<file>.held` (this process's pid) and
/// waits until `file` is removed, `stop` is set, or [`HOLD_AT_MOST`] has passed; `call` names the
/// call held.
pub fn hold_before(
    file: Option<&Path>,
    call: &str,
    stop: Option<&AtomicBool>,
    settle: impl FnOnce(),
) {
    let Some(file) = file else { return };
    if !file.exists() {
        return;
    }
    settle();
    let held = held_path(file);
    // Written whole, then renamed into place: a watcher that sees the file reads the pid, never
    // the empty file between its creation and the write (a fresh-clone run read "" once).
    let mut partial = held.clone().into_os_string();
    partial.push(".partial");
    let written = std::fs::write(&partial, std::process::id().to_string())
        .and_then(|()| std::fs::rename(&partial, &held));
    if let Err(e) = written {
        // The test waits for this file; without it, it fails with its own message.
        warn!(path = %held.display(), error = %e, "test hook: cannot write the held file");
    }
    info!(call, path = %file.display(), "test hook: holding before this call until the file is removed");
    let started = Instant::now();
    while file.exists()
        && !stop.is_some_and(|s| s.load(Ordering::Relaxed))
        && started.elapsed() < HOLD_AT_MOST
    {
        std::thread::sleep(POLL);
    }
    let _ = std::fs::remove_file(&held);
    info!(call, held_for = ?started.elapsed(), "test hook: released");
}

/// `<file>.held`: where a held process says so.
pub fn held_path(file: &Path) -> std::path::PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".held");
    name.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_while_the_file_exists_and_not_without_it() {
        let dir = std::env::temp_dir().join(format!(
            "hold-test-{}",
            crate::kafka::topics::unique_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("hold");
        let mut settled = 0;
        // Not named, or named and absent: no hold, nothing settled.
        hold_before(None, "call", None, || settled += 1);
        hold_before(Some(&file), "call", None, || settled += 1);
        assert_eq!(settled, 0);

        std::fs::write(&file, b"").unwrap();
        let releaser = {
            let file = file.clone();
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(10);
                while !held_path(&file).exists() {
                    assert!(Instant::now() < deadline, "never held");
                    std::thread::sleep(POLL);
                }
                let pid = std::fs::read_to_string(held_path(&file)).unwrap();
                std::fs::remove_file(&file).unwrap();
                pid
            })
        };
        let started = Instant::now();
        hold_before(Some(&file), "call", None, || settled += 1);
        assert_eq!(settled, 1, "settled once, before holding");
        assert_eq!(releaser.join().unwrap(), std::process::id().to_string());
        assert!(!held_path(&file).exists(), "the held file goes on release");
        assert!(started.elapsed() < Duration::from_secs(10));

        // A stop request ends the hold although the file stays.
        std::fs::write(&file, b"").unwrap();
        let stop = AtomicBool::new(true);
        hold_before(Some(&file), "call", Some(&stop), || {});
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
