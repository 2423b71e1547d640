//! The commands the documents show, taken out of their code blocks, and the question a test asks
//! each binary's parser about them: do these arguments still parse? Shared by `tests/docs.rs` (the
//! processor's binaries), `bench/tests/docs.rs` (the benchmarks', whose parsers live in the
//! bench crate) and `tests/doc_runs.rs`, which runs them: it takes each command with its code block
//! ([`Shown::block`]) and whether it goes to the background ([`Shown::background`]), the `scripts/`
//! invocations ([`shown_scripts`]), and finds the ones a runner script runs verbatim
//! ([`script_commands`], [`runs_verbatim`]), and which need a test of the cluster's lane
//! ([`lane_test`]). Nothing here runs a command.
//!
//! What counts as a shown command: a line of a fenced code block, or of an indented one (four
//! spaces or more outside a fence), of README.md, docs/*.md or bench/README.md, its `\`
//! continuation lines joined, a `$ ` prompt dropped, cut into commands at `&&`, `||`, `;` and `|`.
//! A command invokes a binary when, after any `NAME=value` words, its first word is
//! `target/release/NAME`, `target/debug/NAME`, or NAME itself (NAME a file of src/bin or
//! bench/src/bin), or it is `cargo run … --bin NAME -- args`. A trailing `# comment`, `&` and
//! redirections are dropped; nothing is expanded: `$VAR`, `$(…)` and `<…>` stay words, which the
//! check takes as placeholders for any valid value. A line that draws a diagram (box-drawing
//! characters or arrows) is not a command. `[x]` shows an optional part: checked as if given.
//! `...` (or `…`) marks a deliberately partial command: the words shown must parse, and a
//! required argument may be missing.

#![allow(dead_code)] // each test binary uses a different part

use clap::error::{ContextKind, ContextValue, ErrorKind};
use std::path::{Path, PathBuf};

/// `NAME=value` words before a command, as (NAME, value).
pub type Env = Vec<(String, String)>;

/// One command a page shows.
#[derive(Debug, Clone)]
pub struct Shown {
    /// The page, relative to the repository's top (`docs/pipeline.md`).
    pub page: String,
    /// The line of the page the command starts on (1-based).
    pub line: usize,
    /// The binary it invokes (`alert-rules`).
    pub binary: String,
    /// Its arguments, unquoted, without placeholders' expansion or elision marks.
    pub args: Vec<String>,
    /// The `NAME=value` words before it: an argument read from the environment (`env = NAME`)
    /// is checked as if given as `--long=value`.
    pub env: Env,
    /// It ends with (or holds) `...`: a deliberately partial example.
    pub partial: bool,
    /// The line of the page its code block starts on: the commands of one block are one example,
    /// run in order in one place (`tests/doc_runs.rs`).
    pub block: usize,
    /// It ends with `&`: it keeps running while the block's next commands run.
    pub background: bool,
}

impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: ", self.page, self.line)?;
        for (name, value) in &self.env {
            write!(f, "{name}={value} ")?;
        }
        write!(f, "{}", self.binary)?;
        for a in &self.args {
            write!(f, " {a}")?;
        }
        if self.partial {
            write!(f, " ...")?;
        }
        Ok(())
    }
}

/// The pages whose commands are checked: README.md, docs/*.md and bench/README.md.
pub fn pages(root: &Path) -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    let mut pages = vec![root.join("README.md")];
    pages.extend(docs);
    pages.push(root.join("bench/README.md"));
    pages
}

/// The binaries of a `src/bin` folder: its `.rs` files' names.
pub fn binaries(bin_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(bin_dir)
        .expect("a src/bin folder")
        .filter_map(|e| {
            let name = e.expect("a src/bin entry").file_name();
            name.to_str()?.strip_suffix(".rs").map(str::to_owned)
        })
        .collect();
    names.sort();
    names
}

/// The code lines of a Markdown text, as (line number, text without its indentation), with
/// continuation lines (`\\` at the end) joined onto the line that starts them.
pub fn code_lines(text: &str) -> Vec<(usize, String)> {
    code_blocks(text)
        .into_iter()
        .flat_map(|(_, lines)| lines)
        .collect()
}

/// The code blocks of a Markdown text, each as the line it starts on and its code lines (as
/// [`code_lines`]). A fence opens and closes a block; an indented block ends at the first line
/// that is not indented code.
pub fn code_blocks(text: &str) -> Vec<(usize, Vec<(usize, String)>)> {
    let mut out: Vec<(usize, Vec<(usize, String)>)> = Vec::new();
    let mut fence: Option<&str> = None;
    let mut continued = false;
    // Whether the line before was code of the block `out` ends with.
    let mut in_block = false;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let code = match fence {
            Some(f) if trimmed.starts_with(f) => {
                fence = None;
                None
            }
            Some(_) => Some(trimmed),
            None if trimmed.starts_with("```") => {
                fence = Some("```");
                None
            }
            None if trimmed.starts_with("~~~") => {
                fence = Some("~~~");
                None
            }
            None if line.starts_with("    ") => Some(trimmed),
            None => None,
        };
        let Some(code) = code else {
            continued = false;
            in_block = false;
            continue;
        };
        if !in_block {
            out.push((i + 1, Vec::new()));
            in_block = true;
        }
        let lines = &mut out.last_mut().expect("a block was just opened").1;
        let (body, continues) = match code.trim_end().strip_suffix('\\') {
            Some(body) => (body, true),
            None => (code.trim_end(), false),
        };
        match lines.last_mut() {
            Some((_, joined)) if continued => {
                joined.push(' ');
                joined.push_str(body);
            }
            _ => lines.push((i + 1, body.to_owned())),
        }
        continued = continues;
    }
    out.retain(|(_, lines)| !lines.is_empty());
    out
}

/// Whether a shell line sends its last command to the background (`… &`, not `&&`), its comment
/// aside.
fn ends_in_background(line: &str) -> bool {
    let commands = shell_commands(line);
    let Some(last) = commands.last().and_then(|c| c.last()) else {
        return false;
    };
    // The text after the last word of the last command: `&` there, outside the comment.
    line.rfind(last.as_str()).is_some_and(|at| {
        let rest = line[at + last.len()..].split('#').next().unwrap_or("");
        let rest = rest.trim();
        rest.starts_with('&') && !rest.starts_with("&&")
    })
}

/// A line that draws (a diagram of stages and topics), not a command.
fn draws(line: &str) -> bool {
    line.chars()
        .any(|c| ('\u{2500}'..='\u{259F}').contains(&c) || "►◄▲▼→←".contains(c))
}

/// A shell line's commands as words, split at `&&`, `||`, `;` and `|`, without the comment, a
/// trailing `&` or the redirections (operator and target). Quotes are removed; `$(…)` and `<…>`
/// stay inside their word. Not a shell: enough for the lines a page shows.
pub fn shell_commands(line: &str) -> Vec<Vec<String>> {
    let mut commands: Vec<Vec<String>> = vec![Vec::new()];
    let mut word = String::new();
    let mut in_word = false;
    let mut skip_next_word = false;
    let (mut single, mut double, mut angle) = (false, false, false);
    let mut depth = 0usize;
    let mut chars = line.chars().peekable();
    let end_word =
        |word: &mut String, in_word: &mut bool, skip: &mut bool, cmds: &mut Vec<Vec<String>>| {
            if *in_word {
                if *skip {
                    *skip = false;
                } else {
                    cmds.last_mut()
                        .expect("a command")
                        .push(std::mem::take(word));
                }
            }
            word.clear();
            *in_word = false;
        };
    while let Some(c) = chars.next() {
        if single {
            if c == '\'' {
                single = false;
            } else {
                word.push(c);
            }
            continue;
        }
        if double {
            match c {
                '"' if depth == 0 => double = false,
                '(' if word.ends_with('$') => {
                    depth += 1;
                    word.push(c);
                }
                ')' if depth > 0 => {
                    depth -= 1;
                    word.push(c);
                }
                _ => word.push(c),
            }
            continue;
        }
        if depth > 0 {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            word.push(c);
            continue;
        }
        match c {
            '\'' => {
                single = true;
                in_word = true;
            }
            '"' => {
                double = true;
                in_word = true;
            }
            '(' if word.ends_with('$') => {
                depth += 1;
                word.push(c);
            }
            '#' if !in_word => break,
            c if c.is_whitespace() => {
                end_word(&mut word, &mut in_word, &mut skip_next_word, &mut commands)
            }
            '<' if !in_word && chars.peek().is_none_or(|n| n.is_whitespace()) => {
                // An input redirection: its file is not an argument.
                skip_next_word = true;
            }
            '<' => {
                angle = true;
                in_word = true;
                word.push(c);
            }
            '>' if angle => {
                angle = false;
                word.push(c);
            }
            '>' => {
                // `>`, `>>`, `2>`, `2>&1`, `&>`: the fd before it and the target after it go.
                if !word.chars().all(|d| d.is_ascii_digit()) {
                    end_word(&mut word, &mut in_word, &mut skip_next_word, &mut commands);
                }
                word.clear();
                in_word = false;
                while chars.peek().is_some_and(|n| *n == '>' || *n == '&') {
                    chars.next();
                }
                skip_next_word = true;
            }
            '|' | ';' | '&' => {
                end_word(&mut word, &mut in_word, &mut skip_next_word, &mut commands);
                if c == '&' && chars.peek() == Some(&'>') {
                    continue;
                }
                while chars.peek().is_some_and(|n| *n == c) {
                    chars.next();
                }
                commands.push(Vec::new());
            }
            _ => {
                in_word = true;
                word.push(c);
            }
        }
    }
    end_word(&mut word, &mut in_word, &mut skip_next_word, &mut commands);
    commands.retain(|c| !c.is_empty());
    commands
}

/// `NAME=value`: an environment assignment before a command.
fn assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    })
}

/// The binary a command's words invoke, and its arguments, when it is one of `binaries`.
fn invocation(words: &[String], binaries: &[String]) -> Option<(Env, String, Vec<String>)> {
    let env = leading_env(words);
    invoked(&words[env.len()..], binaries).map(|(binary, args)| (env, binary, args))
}

/// The binary the words (without assignments) invoke, and its arguments.
fn invoked(words: &[String], binaries: &[String]) -> Option<(String, Vec<String>)> {
    let words: Vec<&String> = words.iter().collect();
    let first = words.first()?;
    let known = |name: &str| binaries.iter().any(|b| b == name);
    for dir in ["target/release/", "target/debug/"] {
        if let Some((_, name)) = first.rsplit_once(dir) {
            return known(name).then(|| {
                let args = words[1..].iter().map(|w| w.to_string()).collect();
                (name.to_owned(), args)
            });
        }
    }
    if known(first) {
        return Some((
            first.to_string(),
            words[1..].iter().map(|w| w.to_string()).collect(),
        ));
    }
    if first.as_str() == "cargo" && words.get(1).is_some_and(|w| w.as_str() == "run") {
        let dashes = words.iter().position(|w| w.as_str() == "--");
        let cargo_args = &words[..dashes.unwrap_or(words.len())];
        let name = cargo_args.iter().enumerate().find_map(|(i, w)| {
            w.strip_prefix("--bin=").map(str::to_owned).or_else(|| {
                (w.as_str() == "--bin").then(|| cargo_args.get(i + 1).map(|n| n.to_string()))?
            })
        })?;
        let args = dashes.map_or_else(Vec::new, |d| {
            words[d + 1..].iter().map(|w| w.to_string()).collect()
        });
        return known(&name).then_some((name, args));
    }
    None
}

/// Every command of the pages that invokes one of `binaries`.
pub fn shown_commands(root: &Path, binaries: &[String]) -> Vec<Shown> {
    shown_where(root, |words| invocation(words, binaries))
}

/// Every command of the pages whose words `invoke` takes for a command it knows, as
/// (assignments, binary, arguments).
fn shown_where(
    root: &Path,
    invoke: impl Fn(&[String]) -> Option<(Env, String, Vec<String>)>,
) -> Vec<Shown> {
    let mut shown = Vec::new();
    for page in pages(root) {
        let text = std::fs::read_to_string(&page).expect("reading a page");
        let name = page
            .strip_prefix(root)
            .unwrap_or(&page)
            .display()
            .to_string();
        for (block, lines) in code_blocks(&text) {
            for (line, code) in lines {
                if draws(&code) {
                    continue;
                }
                let code = code.strip_prefix("$ ").unwrap_or(&code);
                let commands = shell_commands(code);
                let last = commands.len().saturating_sub(1);
                for (i, words) in commands.into_iter().enumerate() {
                    let Some((env, binary, words)) = invoke(&words) else {
                        continue;
                    };
                    let mut args = Vec::new();
                    let mut partial = false;
                    for w in words {
                        if w == "..." || w == "…" {
                            partial = true;
                            continue;
                        }
                        // `[--wipe]`, `[--broker 2]`: an optional part, checked as given.
                        let w = if w.starts_with('[') || w.ends_with(']') && !w.contains('[') {
                            w.trim_start_matches('[').trim_end_matches(']').to_owned()
                        } else {
                            w
                        };
                        args.push(w);
                    }
                    shown.push(Shown {
                        page: name.clone(),
                        line,
                        binary,
                        args,
                        env,
                        partial,
                        block,
                        background: i == last && ends_in_background(code),
                    });
                }
            }
        }
    }
    shown
}

/// Every invocation of a `scripts/` file the pages show where a shell runs it: a command whose
/// first word (after any `NAME=value`) is `scripts/NAME`, also inside `$(…)` (`export
/// DATABASE_URL=$(scripts/postgres.sh url)`). A script named in a comment or in prose is not one;
/// [`missing_scripts`] checks that those exist.
pub fn shown_scripts(root: &Path) -> Vec<Shown> {
    shown_where(root, |words| {
        // `$(scripts/postgres.sh url)` inside an assignment or an argument: the inner command.
        let inner = words.iter().find_map(|w| {
            let (_, rest) = w.split_once("$(")?;
            let inner = rest
                .strip_suffix(')')
                .or_else(|| rest.split_once(')').map(|(i, _)| i))?;
            let cmd = shell_commands(inner).into_iter().next()?;
            script_invocation(&cmd)
        });
        script_invocation(words).or(inner)
    })
}

/// The `NAME=value` words a command's words start with.
fn leading_env(words: &[String]) -> Env {
    words
        .iter()
        .take_while(|w| assignment(w))
        .filter_map(|w| w.split_once('='))
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect()
}

/// The script a command's words run (`scripts/kafka.sh`), after any assignments, and its
/// arguments.
fn script_invocation(words: &[String]) -> Option<(Env, String, Vec<String>)> {
    let env = leading_env(words);
    let rest = &words[env.len()..];
    let first = rest.first()?;
    let script = first.strip_prefix("./").unwrap_or(first);
    (script.starts_with("scripts/") && !script.contains('$'))
        .then(|| (env, script.to_owned(), rest[1..].to_vec()))
}

/// The commands a shell script of the repository runs (`scripts/demo.sh`, `scripts/test.sh`,
/// `.ci/run`), as words, in the form the pages show them: `"$BIN/NAME"` (the demo's folder of the
/// release binaries) is `NAME`, a leading `exec` is dropped, and the commands inside `$(…)` are
/// commands too. Each is (line, words).
pub fn script_commands(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut joined = String::new();
    let mut first_line = 0;
    for (i, line) in text.lines().enumerate() {
        if joined.is_empty() {
            first_line = i + 1;
        }
        match line.trim_end().strip_suffix('\\') {
            Some(body) => {
                joined.push_str(body);
                joined.push(' ');
                continue;
            }
            None => joined.push_str(line),
        }
        let line = std::mem::take(&mut joined);
        let mut pending = vec![line.trim().to_owned()];
        while let Some(code) = pending.pop() {
            for mut words in shell_commands(&code) {
                for w in &words {
                    if let Some((_, rest)) = w.split_once("$(") {
                        if let Some(inner) = rest.rfind(')').map(|end| &rest[..end]) {
                            pending.push(inner.to_owned());
                        }
                    }
                }
                // What a shell reads before the command: `cluster) if ! exec …`.
                while words.first().is_some_and(|w| {
                    [
                        "if", "then", "elif", "else", "while", "until", "do", "!", "{", "exec",
                    ]
                    .contains(&w.as_str())
                        || w.ends_with(')') && !w.contains('(')
                }) {
                    words.remove(0);
                }
                if let Some(w) = words.first_mut() {
                    if let Some(name) = w.strip_prefix("$BIN/") {
                        *w = name.to_owned();
                    }
                }
                out.push((first_line, words));
            }
        }
    }
    out
}

/// Whether `commands` (a script's, [`script_commands`]) hold the shown command verbatim: the same
/// binary or script with the same arguments and assignments, the script's command being the
/// pages' `NAME` of `target/release/NAME`. Returns the script's line.
pub fn runs_verbatim(commands: &[(usize, Vec<String>)], shown: &Shown) -> Option<usize> {
    if shown.partial {
        return None;
    }
    let mut want: Vec<String> = shown.env.iter().map(|(n, v)| format!("{n}={v}")).collect();
    want.push(shown.binary.clone());
    want.extend(shown.args.iter().cloned());
    commands
        .iter()
        .find(|(_, words)| *words == want)
        .map(|(line, _)| *line)
}

/// A test outside `tests/doc_runs.rs` that runs shown commands, because they need a lane of
/// scripts/test.sh of their own: the 3-broker cluster's, where one test at a time may take a
/// broker down (`tests/common/cluster.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneTest {
    /// `tests/doc_runs_cluster.rs`: a cluster broker killed, stopped or started, a cluster log.
    ClusterBrokers,
    /// `tests/chaos.rs`'s short runs: each `alert-chaos` command is run turned down (its counts
    /// and durations the short run's) by the short run of its mode (the stages, the rules).
    Chaos,
}

/// Which lane test runs `shown`, if one does. tests/doc_runs.rs (which names every command's
/// runner) and each lane test ask this same question, so a command one of them counts as run
/// is one the other runs.
pub fn lane_test(shown: &Shown) -> Option<LaneTest> {
    let has = |w: &str| shown.args.iter().any(|a| a == w);
    let first = shown.args.first().map(String::as_str);
    match (shown.binary.as_str(), first) {
        ("scripts/kafka.sh", Some("broker")) => Some(LaneTest::ClusterBrokers),
        ("scripts/kafka.sh", Some("logs")) if has("--brokers") => Some(LaneTest::ClusterBrokers),
        ("alert-chaos", _) => Some(LaneTest::Chaos),
        _ => None,
    }
}

/// The clap parser of each binary of the processor (`src/bin/`), as the binary builds it; `None`
/// for a name that is not one (a new binary fails `tests/docs.rs` until it is listed here).
pub fn processor_parser(binary: &str) -> Option<clap::Command> {
    use clap::CommandFactory;
    use price_alerts::cli;
    Some(match binary {
        "alert-chaos" => <cli::chaos::ChaosArgs as CommandFactory>::command(),
        "alert-deliver" => <cli::deliver::DeliverArgs as CommandFactory>::command(),
        "alert-pipeline" => <cli::PipelineArgs as CommandFactory>::command(),
        "alert-rules" => <cli::rules::RulesArgs as CommandFactory>::command(),
        "alert-sink" => <cli::sink::SinkArgs as CommandFactory>::command(),
        "alert-verify" => <cli::verify::VerifyArgs as CommandFactory>::command(),
        "dlq-replay" => <cli::replay::ReplayCli as CommandFactory>::command(),
        "test-subscriber" => <cli::subscriber::SubscriberArgs as CommandFactory>::command(),
        "tick-gen" => <cli::tickgen::TickGenArgs as CommandFactory>::command(),
        "txn-demo" => <cli::txn_demo::TxnDemoArgs as CommandFactory>::command(),
        _ => return None,
    })
}

/// A placeholder for a value: `$VAR`, `${VAR}`, `$(…)`, `<…>`, or a word holding one.
pub fn placeholder(word: &str) -> bool {
    word.contains('$') || word.find('<').is_some_and(|i| word[i..].contains('>'))
}

/// Whether `cmd` (the binary's clap parser) takes the shown arguments, without running anything.
/// A value the parser refuses that is a placeholder is taken as valid: its argument is given a
/// parser of any non-empty string and the whole line is parsed again, so the words after it are
/// still checked. `Err` holds clap's first line (`error: unexpected argument '--x' found`).
pub fn parses(cmd: &clap::Command, shown: &Shown) -> Result<(), String> {
    let mut cmd = cmd.clone();
    let mut argv: Vec<String> = std::iter::once(shown.binary.clone())
        .chain(shown.args.iter().cloned())
        .collect();
    let mut built = cmd.clone();
    built.build();
    for (name, value) in &shown.env {
        if let Some(long) = long_of_env(&built, name) {
            argv.push(format!("--{long}={value}"));
        }
    }
    for _ in 0..=argv.len() {
        let err = match cmd.clone().try_get_matches_from(&argv) {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        match err.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => return Ok(()),
            ErrorKind::MissingRequiredArgument if shown.partial => return Ok(()),
            ErrorKind::ValueValidation | ErrorKind::InvalidValue => {
                let value = match err.get(ContextKind::InvalidValue) {
                    Some(ContextValue::String(v)) => v.clone(),
                    _ => String::new(),
                };
                let arg = match err.get(ContextKind::InvalidArg) {
                    Some(ContextValue::String(a)) => a.clone(),
                    _ => String::new(),
                };
                if placeholder(&value) {
                    if let Some(relaxed) = relax(cmd.clone(), &arg) {
                        cmd = relaxed;
                        continue;
                    }
                }
            }
            _ => {}
        }
        let rendered = err.to_string();
        return Err(rendered
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .to_owned());
    }
    Err("a placeholder the parser refuses however often relaxed".to_owned())
}

/// `cmd` with the argument clap shows as `shown` (`--threshold <THRESHOLD>`), in it or in a
/// subcommand, taking any non-empty string.
fn relax(cmd: clap::Command, shown: &str) -> Option<clap::Command> {
    // An argument shows itself only once its command is built (its number of values set).
    let mut built = cmd.clone();
    built.build();
    let (path, id) = find_arg(&built, shown)?;
    Some(relax_at(cmd, &path, id))
}

/// The long flag of the argument a built command (or a subcommand) reads from the environment
/// variable `name`.
fn long_of_env(cmd: &clap::Command, name: &str) -> Option<String> {
    let reads = |a: &&clap::Arg| a.get_env().is_some_and(|e| e == name);
    match cmd.get_arguments().find(reads) {
        Some(a) => a.get_long().map(str::to_owned),
        None => cmd.get_subcommands().find_map(|s| long_of_env(s, name)),
    }
}

/// The subcommand path and id of the argument a built command shows as `shown`.
fn find_arg(cmd: &clap::Command, shown: &str) -> Option<(Vec<String>, clap::Id)> {
    if let Some(a) = cmd.get_arguments().find(|a| a.to_string() == shown) {
        return Some((Vec::new(), a.get_id().clone()));
    }
    cmd.get_subcommands().find_map(|s| {
        let (mut path, id) = find_arg(s, shown)?;
        path.insert(0, s.get_name().to_owned());
        Some((path, id))
    })
}

fn relax_at(cmd: clap::Command, path: &[String], id: clap::Id) -> clap::Command {
    match path.split_first() {
        None => cmd.mut_arg(id, |a| {
            a.value_parser(clap::builder::NonEmptyStringValueParser::new())
        }),
        Some((sub, rest)) => cmd.mut_subcommand(sub, |s| relax_at(s, rest, id)),
    }
}

/// Every `scripts/NAME` a page's code lines name that is not a file of the repository, and every
/// `scripts/kafka.sh SUBCOMMAND` whose subcommand its usage comment does not list, as
/// `page:line: what`.
pub fn missing_scripts(root: &Path) -> (usize, Vec<String>) {
    let usage = std::fs::read_to_string(root.join("scripts/kafka.sh")).expect("scripts/kafka.sh");
    let mut subcommands: Vec<String> = Vec::new();
    for line in usage.lines().take_while(|l| l.starts_with('#')) {
        if let Some((_, rest)) = line.split_once("scripts/kafka.sh ") {
            let word = rest.split_whitespace().next().unwrap_or("");
            for sub in word.split('|') {
                let known = subcommands.iter().any(|s| s == sub);
                if !known && !sub.is_empty() && sub.chars().all(|c| c.is_ascii_lowercase()) {
                    subcommands.push(sub.to_owned());
                }
            }
        }
    }
    let mut seen = 0;
    let mut missing = Vec::new();
    for page in pages(root) {
        let text = std::fs::read_to_string(&page).expect("reading a page");
        let name = page
            .strip_prefix(root)
            .unwrap_or(&page)
            .display()
            .to_string();
        for (line, code) in code_lines(&text) {
            let mut rest = code.as_str();
            while let Some(i) = rest.find("scripts/") {
                let at_word_start = i == 0
                    || !rest[..i]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '/' || c == '.' || c == '-');
                let tail = &rest[i..];
                rest = &tail["scripts/".len()..];
                if !at_word_start {
                    continue;
                }
                let script: String = tail
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || "/._-".contains(*c))
                    .collect();
                let script = script.trim_end_matches('.');
                seen += 1;
                if !root.join(script).is_file() {
                    missing.push(format!("{name}:{line}: {script}: no such file"));
                    continue;
                }
                if script == "scripts/kafka.sh" {
                    let sub = tail[script.len()..].split_whitespace().next().unwrap_or("");
                    let sub = sub.trim_end_matches([')', '"', '\'', '`', ';']);
                    if sub.chars().all(|c| c.is_ascii_lowercase())
                        && !sub.is_empty()
                        && !subcommands.iter().any(|s| s == sub)
                    {
                        missing.push(format!(
                            "{name}:{line}: scripts/kafka.sh {sub}: not a subcommand of its usage ({})",
                            subcommands.join(", ")
                        ));
                    }
                }
            }
        }
    }
    (seen, missing)
}

/// `target/<profile>`, where cargo put the binaries a test runs (beside its `deps/`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .to_path_buf()
}

/// Waits for `child` to exit, for at most `bound`; past it, kills it and fails naming `what`.
pub fn wait_bounded(
    child: &mut std::process::Child,
    bound: std::time::Duration,
    what: &str,
) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {bound:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
