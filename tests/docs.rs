//! The documents ship with the repository: every relative link in a Markdown file resolves to a
//! file inside it, a link to `page.md#anchor` (or `#anchor` on the same page) names a heading that
//! page has, and no document sends a reader to a place a clone does not have (the design once
//! lived in a workspace folder beside the repository). README.md stays a front door: at most
//! [`README_MAX_LINES`] lines, the rest of the text in `docs/` (issue 45). Every command a page
//! shows for one of the processor's binaries still parses: no renamed or removed flag, no missing
//! subcommand (asked of the binary's own clap parser, not run; `doc_commands` says what counts as
//! a shown command, and `bench/tests/docs.rs` asks the benchmarks'), and every script a page shows
//! exists.

mod doc_commands;

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every Markdown file of the repository, outside build output and local state.
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("reading a folder of the repository") {
        let path = entry.expect("a folder entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" {
                markdown_files(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The longest README.md may be: what it is, the two commands, the binaries and links; every
/// other subject has its page in `docs/`.
const README_MAX_LINES: usize = 200;

/// A Markdown text without its fenced code blocks (three backticks or three tildes), whose
/// lines are neither headings nor links.
fn outside_code_fences(text: &str) -> String {
    let mut out = String::new();
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        match fence {
            Some(f) if trimmed.starts_with(f) => fence = None,
            Some(_) => {}
            None if trimmed.starts_with("```") => fence = Some("```"),
            None if trimmed.starts_with("~~~") => fence = Some("~~~"),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// GitHub's anchor of a heading's text: lower case, every character but letters, digits, `-`, `_`
/// and spaces dropped, spaces made `-` (so "2a. Live alerts: the rules topic" is
/// `2a-live-alerts-the-rules-topic`).
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text's ATX headings (`#` to `######`), outside code fences; a
/// repeated heading gets GitHub's `-1`, `-2`, … suffixes.
fn anchors(text: &str) -> Vec<String> {
    let mut bases: Vec<String> = Vec::new();
    let mut anchors = Vec::new();
    for line in outside_code_fences(text).lines() {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#'));
        let repeats = bases.iter().filter(|b| **b == base).count();
        anchors.push(match repeats {
            0 => base.clone(),
            n => format!("{base}-{n}"),
        });
        bases.push(base);
    }
    anchors
}

/// The targets of the inline links `[text](target)` of a Markdown text, outside code fences.
fn link_targets(text: &str) -> Vec<String> {
    let text = outside_code_fences(text);
    let mut targets = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.to_owned());
        }
    }
    targets
}

#[test]
fn every_relative_link_in_the_documents_resolves_inside_the_repository() {
    let root = root().canonicalize().expect("the repository");
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    assert!(files.len() >= 4, "found the documents: {files:?}");
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("reading a document");
        let shown = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        for target in link_targets(&text) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                file.parent().expect("a document's folder").join(path)
            };
            let resolved = match resolved.canonicalize() {
                Ok(p) if p.starts_with(&root) => p,
                Ok(p) => {
                    broken.push(format!("{shown}: {target} leaves the repository ({p:?})"));
                    continue;
                }
                Err(e) => {
                    broken.push(format!("{shown}: {target}: {e}"));
                    continue;
                }
            };
            let Some(anchor) = anchor else { continue };
            if resolved.extension().is_none_or(|e| e != "md") {
                broken.push(format!(
                    "{shown}: {target}: an anchor into a file that is not Markdown"
                ));
                continue;
            }
            let page = std::fs::read_to_string(&resolved).expect("reading a linked document");
            let known = anchors(&page);
            if !known.iter().any(|a| a == anchor) {
                broken.push(format!(
                    "{shown}: {target}: no heading of {} has the anchor #{anchor} (it has: {})",
                    resolved.strip_prefix(&root).unwrap_or(&resolved).display(),
                    known.join(", ")
                ));
            }
        }
        if text.contains("../shared") || text.contains("DESIGN.md") {
            broken.push(format!("{shown}: points at the workspace's shared design"));
        }
    }
    assert!(
        broken.is_empty(),
        "links that a clone cannot follow:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_readme_links_the_design() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    assert!(
        link_targets(&readme).iter().any(|t| t == "docs/design.md"),
        "README.md links docs/design.md"
    );
}

#[test]
fn the_readme_is_a_front_door_of_at_most_200_lines() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move a subject to its page in docs/"
    );
}

#[test]
fn the_readme_links_every_page_of_docs() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let targets = link_targets(&readme);
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let name = entry.expect("a docs/ entry").file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".md") {
            let page = format!("docs/{name}");
            if !targets
                .iter()
                .any(|t| t.split('#').next() == Some(page.as_str()))
            {
                missing.push(page);
            }
        }
    }
    assert!(missing.is_empty(), "README.md does not link {missing:?}");
}

#[test]
fn anchors_are_github_s() {
    assert_eq!(
        slug("2a. Live alerts: the rules topic and the join"),
        "2a-live-alerts-the-rules-topic-and-the-join"
    );
    assert_eq!(
        slug("The commit/abort experiment"),
        "the-commitabort-experiment"
    );
    assert_eq!(slug("Tests (`tests/security.rs`)"), "tests-testssecurityrs");
    assert_eq!(
        slug("Past Kafka's edge: alert-sink"),
        "past-kafkas-edge-alert-sink"
    );
    assert_eq!(
        anchors("# A\n```\n# not a heading\n```\n## A\n#nope\n### B ##\n"),
        ["a", "a-1", "b"]
    );
}

/// The clap parser of each binary in `src/bin/` ([`doc_commands::processor_parser`]).
fn parser_of(binary: &str) -> Option<clap::Command> {
    doc_commands::processor_parser(binary)
}

#[test]
fn every_binary_of_the_processor_has_its_parser_here() {
    let binaries = doc_commands::binaries(&root().join("src/bin"));
    let unknown: Vec<&String> = binaries.iter().filter(|b| parser_of(b).is_none()).collect();
    assert!(
        unknown.is_empty(),
        "src/bin has binaries whose parser parser_of does not know: {unknown:?}"
    );
}

#[test]
fn every_command_shown_for_a_binary_of_the_processor_parses() {
    let binaries = doc_commands::binaries(&root().join("src/bin"));
    let shown = doc_commands::shown_commands(&root(), &binaries);
    let mut stale = Vec::new();
    for command in &shown {
        let parser = parser_of(&command.binary).expect("a binary of src/bin");
        if let Err(e) = doc_commands::parses(&parser, command) {
            stale.push(format!("{command}\n    {e}"));
        }
    }
    eprintln!(
        "{} commands shown for the processor's binaries: {}",
        shown.len(),
        counts(&shown)
    );
    // The pages show most binaries; a parser that sees none would prove nothing.
    assert!(shown.len() >= 20, "found the commands: {shown:#?}");
    assert!(
        stale.is_empty(),
        "commands shown in the pages that their binary no longer parses:\n{}",
        stale.join("\n")
    );
}

/// "README.md 2, docs/pipeline.md 14, …": how many commands each page shows.
fn counts(shown: &[doc_commands::Shown]) -> String {
    let mut pages: Vec<(String, usize)> = Vec::new();
    for c in shown {
        match pages.iter_mut().find(|(p, _)| *p == c.page) {
            Some((_, n)) => *n += 1,
            None => pages.push((c.page.clone(), 1)),
        }
    }
    let pages: Vec<String> = pages.iter().map(|(p, n)| format!("{p} {n}")).collect();
    pages.join(", ")
}

#[test]
fn every_script_shown_exists_and_kafka_sh_knows_its_subcommand() {
    let (seen, missing) = doc_commands::missing_scripts(&root());
    eprintln!("{seen} script invocations shown");
    assert!(seen >= 10, "found the scripts the pages show: {seen}");
    assert!(
        missing.is_empty(),
        "scripts shown in the pages that the repository does not have:\n{}",
        missing.join("\n")
    );
}

#[test]
fn shown_commands_are_taken_as_a_shell_would_split_them() {
    let words = |line: &str| doc_commands::shell_commands(line);
    assert_eq!(
        words("alert-rules list --json   # or not"),
        [["alert-rules", "list", "--json"]]
    );
    assert_eq!(
        words("alert-pipeline --live-rules &"),
        [vec!["alert-pipeline", "--live-rules"]]
    );
    assert_eq!(
        words("DATABASE_URL=$(scripts/postgres.sh url) sink-bench --repeats 3 2>&1 | tee log"),
        [
            vec![
                "DATABASE_URL=$(scripts/postgres.sh url)",
                "sink-bench",
                "--repeats",
                "3"
            ],
            vec!["tee", "log"]
        ]
    );
    assert_eq!(
        words("dlq-replay --class 'permanent.*' > out.txt && alert-rules load -"),
        [
            vec!["dlq-replay", "--class", "permanent.*"],
            vec!["alert-rules", "load", "-"]
        ]
    );
    assert_eq!(
        words("curl -s http://<pod>:9898/readyz < /dev/null"),
        [["curl", "-s", "http://<pod>:9898/readyz"]]
    );
    assert_eq!(
        doc_commands::code_lines("text\n\n    a --x \\\n        --y\n```sh\nb\n```\n"),
        [(3, "a --x  --y".to_owned()), (6, "b".to_owned())]
    );
}

#[test]
fn a_placeholder_stands_for_a_valid_value_and_a_stale_flag_fails() {
    let parses = |binary: &str, args: &[&str], partial| {
        let shown = doc_commands::Shown {
            page: "test".into(),
            line: 1,
            binary: binary.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: Vec::new(),
            partial,
            block: 1,
            background: false,
        };
        doc_commands::parses(&parser_of(binary).expect("a binary"), &shown)
    };
    // `--live-rules`: alert-pipeline wants it or `--rules FILE`.
    let pipeline = |args: &[&str]| {
        let args = [&["--live-rules"], args].concat();
        parses("alert-pipeline", &args, false)
    };
    assert_eq!(
        pipeline(&["--max-batch", "5000", "--commit-interval", "1s"]),
        Ok(())
    );
    assert_eq!(
        pipeline(&["--max-batch", "$N", "--commit-interval", "<interval>"]),
        Ok(())
    );
    assert_eq!(pipeline(&["--max-batch=${N}"]), Ok(()));
    // A placeholder does not hide a stale flag after it, nor does a wrong real value pass.
    assert!(pipeline(&["--max-batch", "$N", "--no-such-flag"]).is_err());
    assert!(pipeline(&["--max-batch", "ten"]).is_err());
    assert!(pipeline(&["--help"]).is_ok());
    // A partial example may leave a required argument out; a whole one may not.
    let put = ["put", "a1", "--direction", "up"];
    assert!(parses("alert-rules", &put, false).is_err());
    assert_eq!(parses("alert-rules", &put, true), Ok(()));
    assert!(parses("alert-rules", &["puts", "a1"], true).is_err());
}
