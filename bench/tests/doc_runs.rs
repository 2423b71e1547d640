//! Every benchmark command README.md, docs/*.md and bench/README.md show runs and exits 0
//! (issue 45; `tests/doc_runs.rs` runs the processor's, `bench/tests/docs.rs` checks that these
//! parse). A full run takes minutes to hours, so each command runs with the flags it shows and
//! only its size options turned down to the smallest that still measures something: the
//! repeats, the record, tick, row and delivery counts, and the durations of [`SIZES`], whether
//! the command shows them or leaves them at their defaults. A `--replot` command runs as shown,
//! on what the commands before it in its code block wrote.
//!
//! Each code block runs in order in a folder of its own (its `bench/out/…` is there), against
//! the suite's broker (`KAFKA_BOOTSTRAP`) and PostgreSQL (`DATABASE_URL`, which stands for
//! `$(scripts/postgres.sh url)`). The benchmarks make fresh topics and databases of their own.
//! A benchmark shown on a page without a test here fails
//! [`every_benchmark_shown_has_its_test_here`]; [`NOT_YET_RUN`] names the one whose commands
//! nothing runs yet, and why.
//!
//! Broker tests: `#[ignore]`d under a plain `cargo test`; scripts/test.sh runs them.

#[path = "../../tests/doc_commands/mod.rs"]
mod doc_commands;

use doc_commands::Shown;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The repository's top: this crate is its `bench/` folder.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ sits in the repository")
        .to_path_buf()
}

/// Each benchmark's size options and the value a test run gives them (each element of a
/// comma-separated list, so that a list keeps its length). Nothing else of a command changes.
const SIZES: &[(&str, &[(&str, &str)])] = &[
    (
        "producer-bench",
        &[
            ("--repeats", "1"),
            ("--records", "1000"),
            ("--duration", "1s"),
            ("--warmup", "0"),
        ],
    ),
    (
        "pipeline-bench",
        &[
            ("--repeats", "1"),
            ("--ticks", "1000"),
            ("--latency-ticks", "100"),
        ],
    ),
    (
        "sink-bench",
        &[
            ("--repeats", "1"),
            ("--rows", "1000"),
            ("--naive-rows", "100"),
            // Fewer latency ticks than this cross no threshold, and the run waits 120 s for a row.
            ("--latency-ticks", "1000"),
        ],
    ),
    (
        "deliver-bench",
        &[
            ("--repeats", "1"),
            ("--deliveries", "1000"),
            ("--latency-for", "1s"),
        ],
    ),
];

/// Benchmarks whose shown commands nothing runs yet, and why.
const NOT_YET_RUN: &[(&str, &str)] = &[(
    "rebalance-bench",
    "each run waits out a session timeout per SIGKILL, the consumer protocol's the broker's 45 s \
     (no client knob): at --repeats 1 its default command took 145 s and its consumer-only one \
     75 s (2026-12-06: 50 s of it the SIGKILL's settling), so its three shown commands would add \
     about 220 s to lane a; bench/tests/rebalance_bench.rs runs its scenarios in the suite",
)];

/// How long one turned-down command may take.
const RUN_BOUND: Duration = Duration::from_secs(300);

/// The arguments a shown command runs with: its own, the size options turned down.
fn turned_down(shown: &Shown) -> Vec<String> {
    let mut args = shown.args.clone();
    if args.iter().any(|a| a == "--replot") {
        return args;
    }
    let sizes = SIZES
        .iter()
        .find(|(b, _)| *b == shown.binary)
        .map_or(&[][..], |(_, s)| *s);
    for (flag, small) in sizes {
        match args.iter().position(|a| a == flag) {
            Some(i) => {
                let n = args.get(i + 1).map_or(1, |v| v.split(',').count());
                args[i + 1] = vec![*small; n].join(",");
            }
            // producer-bench takes --records or --duration, not both: the one the command shows.
            None if (*flag == "--records" && args.iter().any(|a| a == "--duration"))
                || (*flag == "--duration") => {}
            None => args.extend([flag.to_string(), small.to_string()]),
        }
    }
    args
}

/// The test's PostgreSQL: `DATABASE_URL`, or the URL scripts/postgres.sh wrote.
fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        std::fs::read_to_string(root().join(".postgres/url"))
            .map(|s| s.trim().to_owned())
            .expect("no DATABASE_URL and no .postgres/url: run scripts/postgres.sh up")
    })
}

fn shown_benchmarks() -> Vec<Shown> {
    let binaries = doc_commands::binaries(&root().join("bench/src/bin"));
    doc_commands::shown_commands(&root(), &binaries)
}

/// Runs one command in `dir`; its exit code must be 0 within [`RUN_BOUND`].
fn run(dir: &std::path::Path, shown: &Shown) {
    let args = turned_down(shown);
    let what = format!("{shown}\n    run as: {} {}", shown.binary, args.join(" "));
    eprintln!("doc_runs: {what}");
    let started = Instant::now();
    let mut cmd = Command::new(doc_commands::bin_dir().join(&shown.binary));
    cmd.args(&args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in &shown.env {
        let value = match value.as_str() {
            "$(scripts/postgres.sh url)" => database_url(),
            v => {
                assert!(
                    !doc_commands::placeholder(v),
                    "{shown}: no test value for {name}={v}"
                );
                v.to_owned()
            }
        };
        cmd.env(name, value);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    // Both streams are read on threads, so a full pipe never stalls the benchmark.
    let readers: Vec<_> = [
        Box::new(child.stdout.take().expect("piped")) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().expect("piped")),
    ]
    .into_iter()
    .map(|mut s| {
        std::thread::spawn(move || {
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out
        })
    })
    .collect();
    let status = doc_commands::wait_bounded(&mut child, RUN_BOUND, &what.to_string());
    let output: Vec<String> = readers
        .into_iter()
        .map(|r| r.join().unwrap_or_default())
        .collect();
    assert!(
        status.success(),
        "{what}: exited with {status}; its output:\n{}",
        output.join("\n")
    );
    eprintln!("doc_runs: ok in {:.1?}", started.elapsed());
}

/// Runs the commands the pages show for `binary`, block by block.
fn run_shown(binary: &str) {
    let shown: Vec<Shown> = shown_benchmarks()
        .into_iter()
        .filter(|s| s.binary == binary)
        .collect();
    assert!(!shown.is_empty(), "the pages show no {binary} command");
    let mut block: Option<(String, usize, PathBuf)> = None;
    for s in &shown {
        if block
            .as_ref()
            .is_none_or(|(page, line, _)| *page != s.page || *line != s.block)
        {
            if let Some((_, _, dir)) = block.take() {
                let _ = std::fs::remove_dir_all(dir);
            }
            let dir = std::env::temp_dir().join(format!(
                "doc-runs-{binary}-{}-{}",
                s.block,
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("a folder for the block");
            block = Some((s.page.clone(), s.block, dir));
        }
        let (_, _, dir) = block.as_ref().expect("a block");
        run(dir, s);
    }
    if let Some((_, _, dir)) = block {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn every_benchmark_shown_has_its_test_here() {
    let tested: Vec<&str> = SIZES.iter().map(|(b, _)| *b).collect();
    let not_yet: Vec<&str> = NOT_YET_RUN.iter().map(|(b, _)| *b).collect();
    let shown = shown_benchmarks();
    let untested: Vec<String> = shown
        .iter()
        .filter(|s| !tested.contains(&s.binary.as_str()) && !not_yet.contains(&s.binary.as_str()))
        .map(|s| s.to_string())
        .collect();
    assert!(
        untested.is_empty(),
        "benchmark commands no test here runs: add the benchmark to SIZES and a test:\n{}",
        untested.join("\n")
    );
    for b in not_yet {
        assert!(
            shown.iter().any(|s| s.binary == b),
            "NOT_YET_RUN names {b}, which no page shows any more"
        );
    }
    for s in shown.iter().filter(|s| tested.contains(&s.binary.as_str())) {
        eprintln!("{s}\n    run as: {}", turned_down(s).join(" "));
    }
}

#[test]
fn sizes_are_turned_down_and_nothing_else_changes() {
    let shown = |binary: &str, args: &[&str]| Shown {
        page: "test".into(),
        line: 1,
        binary: binary.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        env: Vec::new(),
        partial: false,
        block: 1,
        background: false,
    };
    let args = |s: &Shown| turned_down(s).join(" ");
    assert_eq!(
        args(&shown(
            "producer-bench",
            &[
                "--sizes",
                "100,1024",
                "--records",
                "1000000,300000",
                "--repeats",
                "5"
            ]
        )),
        "--sizes 100,1024 --records 1000,1000 --repeats 1 --warmup 0"
    );
    assert_eq!(
        args(&shown(
            "producer-bench",
            &["--sizes", "1k", "--duration", "10s"]
        )),
        "--sizes 1k --duration 1s --repeats 1 --warmup 0"
    );
    assert_eq!(
        args(&shown(
            "producer-bench",
            &["--replot", "bench/out/results.json"]
        )),
        "--replot bench/out/results.json"
    );
    assert_eq!(
        args(&shown("deliver-bench", &["--fanouts", "10"])),
        "--fanouts 10 --repeats 1 --deliveries 1000 --latency-for 1s"
    );
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn producer_bench_commands_run() {
    run_shown("producer-bench");
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn pipeline_bench_commands_run() {
    run_shown("pipeline-bench");
}

#[test]
#[ignore = "needs a Kafka broker and PostgreSQL: run scripts/test.sh"]
fn sink_bench_commands_run() {
    run_shown("sink-bench");
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn deliver_bench_commands_run() {
    run_shown("deliver-bench");
}
