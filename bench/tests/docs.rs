//! Every command README.md, docs/*.md or bench/README.md shows for a benchmark binary still
//! parses: no renamed or removed flag (asked of the benchmark's own clap parser, which lives in
//! this crate; nothing is run). `tests/docs.rs` asks the processor's binaries, and
//! `tests/doc_commands` says what counts as a shown command.

#[path = "../../tests/doc_commands/mod.rs"]
mod doc_commands;

use std::path::PathBuf;

/// The repository's top: this crate is its `bench/` folder.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ sits in the repository")
        .to_path_buf()
}

/// The clap parser of each binary in `bench/src/bin/`, as the binary builds it; `None` for a name
/// that is not one (a new benchmark fails the test below until it is listed here).
fn parser_of(binary: &str) -> Option<clap::Command> {
    use clap::CommandFactory;
    use price_alerts_bench as bench;
    Some(match binary {
        "deliver-bench" => <bench::deliver::cli::BenchCli as CommandFactory>::command(),
        "pipeline-bench" => <bench::pipeline::cli::BenchCli as CommandFactory>::command(),
        "producer-bench" => <bench::producer::options::BenchCli as CommandFactory>::command(),
        "rebalance-bench" => <bench::rebalance::cli::BenchCli as CommandFactory>::command(),
        "recovery-bench" => <bench::recovery::cli::BenchCli as CommandFactory>::command(),
        "rules-bench" => <bench::rules::cli::BenchCli as CommandFactory>::command(),
        "sink-bench" => <bench::sink::cli::BenchCli as CommandFactory>::command(),
        _ => return None,
    })
}

#[test]
fn every_benchmark_has_its_parser_here() {
    let binaries = doc_commands::binaries(&root().join("bench/src/bin"));
    let unknown: Vec<&String> = binaries.iter().filter(|b| parser_of(b).is_none()).collect();
    assert!(
        unknown.is_empty(),
        "bench/src/bin has binaries whose parser parser_of does not know: {unknown:?}"
    );
}

#[test]
fn every_command_shown_for_a_benchmark_parses() {
    let binaries = doc_commands::binaries(&root().join("bench/src/bin"));
    let shown = doc_commands::shown_commands(&root(), &binaries);
    let mut stale = Vec::new();
    for command in &shown {
        let parser = parser_of(&command.binary).expect("a binary of bench/src/bin");
        if let Err(e) = doc_commands::parses(&parser, command) {
            stale.push(format!("{command}\n    {e}"));
        }
    }
    eprintln!("{} commands shown for the benchmarks", shown.len());
    assert!(shown.len() >= 8, "found the commands: {shown:#?}");
    assert!(
        stale.is_empty(),
        "commands shown in the pages that their benchmark no longer parses:\n{}",
        stale.join("\n")
    );
}
