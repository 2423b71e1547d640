//! librdkafka's blocking calls (metadata round trips, the waits between them) from async code.
//!
//! An async function that makes such a call inline holds up the thread that polls it for as long
//! as the broker takes, up to the call's bound (30 s for the topic set-up): a tokio worker
//! serves nothing else meanwhile, and with one CPU (`taskset -c 0`, a container's single core)
//! the runtime has one worker, so the HTTP endpoint of `/healthz` would go silent, and an
//! orchestrator's probe could kill a healthy pod that only waits for a slow broker (issue 43,
//! item 6). [`off_runtime`] runs the call on a thread of its own and awaits its answer.
//!
//! Why a plain thread rather than `tokio::task::spawn_blocking`: the async callers run on tokio
//! (the binaries) and also under `futures::executor::block_on` (the demo, the tools, the tests,
//! the benchmarks), where `spawn_blocking` has no runtime to run on and panics. Each call is
//! bounded by its own timeout, so a thread whose caller went away (its future dropped) ends when
//! its call does.

use anyhow::{anyhow, Context as _};

/// Runs `call` on a thread named `name` and waits for its result without blocking the caller's
/// thread.
pub async fn off_runtime<T: Send + 'static>(
    name: &str,
    call: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<T> {
    let (tx, rx) = futures::channel::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            // The caller may have gone away meanwhile: its answer is dropped with it.
            let _ = tx.send(call());
        })
        .with_context(|| format!("starting the thread of {name}"))?;
    rx.await
        .map_err(|_| anyhow!("{name}: its thread ended without an answer (it panicked)"))
}

#[cfg(test)]
mod tests {
    use super::off_runtime;

    #[test]
    fn the_answer_comes_back_under_any_executor() {
        let v = futures::executor::block_on(off_runtime("t", || 7)).unwrap();
        assert_eq!(v, 7);
        let e = futures::executor::block_on(off_runtime("t", || -> i32 { panic!("boom") }));
        assert!(e.unwrap_err().to_string().contains("panicked"));
    }
}
