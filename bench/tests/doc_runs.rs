//! Every benchmark command README.md, docs/*.md and bench/README.md show runs and exits 0
//! (issue 45; `tests/doc_runs.rs` runs the processor's, `bench/tests/docs.rs` checks that these
//! parse). A full run takes minutes to hours, so each command runs with the flags it shows and
//! only its size options turned down to the smallest that still measures something: the
//! repeats, the record, tick, row, delivery, partition and symbol counts, the tick rate, and the
//! durations (rebalance-bench's classic session among them: each SIGKILL waits it out) of
//! [`SIZES`], whether the command shows them or leaves them at their defaults. A `--replot`
//! command runs as shown, on what the commands before it in its code block wrote.
//!
//! Each code block runs in order in a folder of its own (its `bench/out/…` is there), against
//! the suite's broker (`KAFKA_BOOTSTRAP`) and PostgreSQL (`DATABASE_URL`, which stands for
//! `$(scripts/postgres.sh url)`). The benchmarks make fresh topics and databases of their own.
//! rebalance-bench's runs mostly wait out sessions, so they go side by side, each in a folder of
//! its own, and what they wrote must also hold sane figures ([`rebalance_bench_commands_run`]).
//! A benchmark shown on a page without a test here fails
//! [`every_benchmark_shown_has_its_test_here`]; [`NOT_YET_RUN`] would name one whose commands
//! nothing runs yet, and why.
//!
//! Broker tests: `#[ignore]`d under a plain `cargo test`; scripts/test.sh runs them, this file in
//! its lane a, but for rebalance-bench's test, in lane b.

#[path = "../../tests/doc_commands/mod.rs"]
mod doc_commands;

use doc_commands::Shown;
use std::io::Read;
use std::path::{Path, PathBuf};
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
    (
        "rebalance-bench",
        &[
            ("--repeats", "1"),
            ("--partitions", "6"),
            ("--rate", "300"),
            ("--symbols", "60"),
            // Each SIGKILL waits out the killed member's session: the classic one is the bench's
            // to set, 45 s by default (the consumer protocol's is the broker's 45 s, no client
            // knob). 10 s still leaves it apart from the survivors' idle figures.
            ("--classic-session-timeout", "10s"),
        ],
    ),
];

/// Benchmarks whose shown commands nothing runs yet, and why: none now.
const NOT_YET_RUN: &[(&str, &str)] = &[];

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

/// Runs one command in `dir`; its exit code must be 0 within [`RUN_BOUND`]. Returns its stdout.
fn run(dir: &Path, shown: &Shown) -> String {
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
    output.into_iter().next().unwrap_or_default()
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
        args(&shown(
            "rebalance-bench",
            &[
                "--repeats",
                "1",
                "--protocols",
                "consumer",
                "--partitions",
                "6"
            ]
        )),
        "--repeats 1 --protocols consumer --partitions 6 --rate 300 --symbols 60 \
         --classic-session-timeout 10s"
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

/// rebalance-bench's commands, and what their runs measured. Each run waits out a session per
/// SIGKILL, the consumer protocol's the broker's 45 s, and the machine is idle meanwhile (a run
/// uses about 15 CPU seconds in 2 minutes), so the runs of a block go side by side, each in a
/// folder of its own, instead of one after the other: together they take about as long as the
/// longest. Each run's `results.json` must then hold sane figures ([`rebalance_figures_are_sane`]),
/// and each `--replot` command runs on the output of every run before it in its block (the page's
/// order leaves it the last one's; the others' are as cheap) and must write the same table, CSVs
/// and JSON again, and a PNG.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn rebalance_bench_commands_run() {
    let started = Instant::now();
    let shown: Vec<Shown> = shown_benchmarks()
        .into_iter()
        .filter(|s| s.binary == "rebalance-bench")
        .collect();
    assert!(
        !shown.is_empty(),
        "the pages show no rebalance-bench command"
    );
    let replots = |s: &Shown| s.args.iter().any(|a| a == "--replot");
    let mut blocks: Vec<Vec<&Shown>> = Vec::new();
    for s in &shown {
        match blocks.last_mut() {
            Some(b) if b[0].page == s.page && b[0].block == s.block => b.push(s),
            _ => blocks.push(vec![s]),
        }
    }
    for block in blocks {
        // Each run in a folder of its own, all at once.
        let runs: Vec<(PathBuf, &Shown)> = block
            .iter()
            .filter(|s| !replots(s))
            .map(|s| {
                let dir = std::env::temp_dir().join(format!(
                    "doc-runs-rebalance-bench-{}-{}-{}",
                    s.block,
                    s.line,
                    std::process::id()
                ));
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).expect("a folder for the run");
                (dir, *s)
            })
            .collect();
        std::thread::scope(|scope| {
            let running: Vec<_> = runs
                .iter()
                .map(|(dir, s)| scope.spawn(move || run(dir, s)))
                .collect();
            for r in running {
                if let Err(panic) = r.join() {
                    std::panic::resume_unwind(panic);
                }
            }
        });
        for (dir, s) in &runs {
            rebalance_figures_are_sane(dir, &turned_down(s));
        }
        for replot in block.iter().filter(|s| replots(s)) {
            for (dir, _) in runs.iter().filter(|(_, s)| s.line < replot.line) {
                replot_writes_the_same_again(dir, replot);
            }
        }
        for (dir, _) in runs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    eprintln!(
        "doc_runs: rebalance-bench's commands took {:.1?}",
        started.elapsed()
    );
}

/// What a rebalance-bench run with `args` wrote in `dir`, read with the bench's own types, must
/// hold a result for every event of every protocol and repeat the arguments ask for (parsed by its
/// own command line), each settled, with an idle figure for every partition; and figures that
/// could only come from watching the group: after the SIGKILL the killed member's partitions
/// cannot have moved before its session expired (at the earliest a session timeout less a
/// heartbeat interval after the kill, the member's last heartbeat being that old at most), so a
/// run that measured nothing, or measured the wrong thing, fails here.
fn rebalance_figures_are_sane(dir: &Path, args: &[String]) {
    use clap::Parser as _;
    use price_alerts::kafka::KafkaConfig;
    use price_alerts_bench::rebalance::{self, cli::BenchCli, Event};

    let cli = BenchCli::try_parse_from(
        std::iter::once("rebalance-bench").chain(args.iter().map(String::as_str)),
    )
    .expect("rebalance-bench's parser takes the arguments it just ran with");
    let opts = cli.options(KafkaConfig::new("unused"), PathBuf::new());
    let out = dir.join(opts.log_dir.parent().expect("the logs are in --out"));
    for file in REBALANCE_OUTPUTS {
        assert!(out.join(file).exists(), "{file} written");
    }
    let report = rebalance::read_report(&out.join("results.json")).expect("the run's results.json");
    eprintln!(
        "{}",
        std::fs::read_to_string(out.join("results.md")).expect("results.md")
    );

    assert_eq!(report.partitions, opts.partitions);
    assert_eq!(
        report.runs.len(),
        opts.repeats * opts.protocols.len(),
        "one run per protocol and repeat"
    );
    for protocol in opts.protocols.iter().map(|p| p.as_str()) {
        let session = report.session(protocol).expect("session settings");
        let session_s = session.session_timeout_ms as f64 / 1e3;
        let heartbeat_s = session.heartbeat_interval_ms as f64 / 1e3;
        if protocol == "classic" {
            assert_eq!(session_s, opts.classic_session_timeout.as_secs_f64());
        } else {
            // The broker's, read from it: at least its minimum, 45 s unless lowered.
            assert!(session_s >= 1.0, "{session:?}");
        }
        for event in Event::ALL {
            let results: Vec<_> = report
                .events()
                .filter(|e| e.protocol == protocol && e.event == event)
                .collect();
            assert_eq!(results.len(), opts.repeats, "{protocol} {event}");
            for e in results {
                assert!(e.settled, "{e}");
                assert_eq!(e.idle_s.len(), opts.partitions as usize, "{e}");
                let idle: Vec<f64> = e.idle_s.iter().map(|s| s.expect("a figure")).collect();
                assert!(
                    idle.iter().all(|s| s.is_finite() && *s > 0.0),
                    "{protocol} {event}: {idle:?}"
                );
                let max = e.max_idle_s().expect("figures");
                match event {
                    Event::Sigterm => {
                        // A clean stop: the instance committed, left and exited 0.
                        assert_eq!(e.exit.as_deref(), Some("exit status: 0"), "{e}");
                    }
                    Event::Sigkill => {
                        assert!(
                            max >= session_s - heartbeat_s,
                            "{protocol}: a killed member's partitions idled {max:.2} s, less than its session ({session_s} s) less a heartbeat ({heartbeat_s} s): {e}"
                        );
                        assert!(max <= session_s + 60.0, "{e}");
                        // The survivor's own partitions kept going: not every partition waited.
                        let waited = idle
                            .iter()
                            .filter(|s| **s >= session_s - heartbeat_s)
                            .count();
                        assert!(waited < idle.len(), "{e}");
                    }
                    Event::Join => {
                        assert!(e.anchor_s.is_some(), "the new instance committed: {e}");
                    }
                }
            }
        }
    }
    let rows = std::fs::read_to_string(out.join("idle.csv")).expect("idle.csv");
    // A header, and a row per partition, event and run.
    assert_eq!(
        rows.lines().count(),
        1 + opts.partitions as usize * Event::ALL.len() * report.runs.len()
    );
}

/// What a rebalance-bench run writes besides its logs.
const REBALANCE_OUTPUTS: [&str; 5] = [
    "results.json",
    "results.md",
    "idle.csv",
    "summary.csv",
    "idle.png",
];

/// Runs the `--replot` command `shown` in `dir`, where a run wrote its outputs: with all of them
/// but its `results.json` removed first, it must write them again, the same, and print the table.
fn replot_writes_the_same_again(dir: &Path, shown: &Shown) {
    let at = shown
        .args
        .iter()
        .position(|a| a == "--replot")
        .expect("a --replot command");
    let results = dir.join(&shown.args[at + 1]);
    let out = results.parent().expect("results.json's folder");
    let before: Vec<(&str, Vec<u8>)> = REBALANCE_OUTPUTS
        .iter()
        .map(|f| (*f, std::fs::read(out.join(f)).expect("the run's output")))
        .collect();
    for (file, _) in &before {
        if *file != "results.json" {
            std::fs::remove_file(out.join(file)).expect("removing an output");
        }
    }
    let printed = run(dir, shown);
    // The table, the CSVs and the PNG byte for byte. results.json holds the same report: read
    // back as serde_json reads it (without its float_roundtrip feature the last digit of a
    // 17-digit figure can move, 1.8502359249999998 being written again as 1.850235925).
    let report = |json: &[u8]| {
        let (report, _): (price_alerts_bench::rebalance::Report, serde_json::Value) =
            serde_json::from_slice(json).expect("rebalance-bench's results");
        serde_json::to_string(&report).expect("a report")
    };
    for (file, was) in &before {
        let now =
            std::fs::read(out.join(file)).unwrap_or_else(|e| panic!("{file} written again: {e}"));
        if *file == "results.json" {
            assert_eq!(report(&now), report(was), "results.json written again");
        } else {
            assert!(now == *was, "{file} written again differs from the run's");
        }
    }
    let table = std::fs::read_to_string(out.join("results.md")).expect("results.md");
    assert_eq!(
        printed.trim_end(),
        table.trim_end(),
        "the replot prints results.md"
    );
}
