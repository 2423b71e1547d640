//! The commands the documents show, taken out of their code blocks, and the question a test asks
//! each binary's parser about them: do these arguments still parse? Shared by `tests/docs.rs` (the
//! processor's binaries) and `bench/tests/docs.rs` (the benchmarks', whose parsers live in the
//! bench crate). Nothing here runs a command.
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
/// continuation lines (`\` at the end) joined onto the line that starts them.
pub fn code_lines(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut fence: Option<&str> = None;
    let mut continued = false;
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
            continue;
        };
        let (body, continues) = match code.trim_end().strip_suffix('\\') {
            Some(body) => (body, true),
            None => (code.trim_end(), false),
        };
        match out.last_mut() {
            Some((_, joined)) if continued => {
                joined.push(' ');
                joined.push_str(body);
            }
            _ => out.push((i + 1, body.to_owned())),
        }
        continued = continues;
    }
    out
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
    let env: Env = words
        .iter()
        .take_while(|w| assignment(w))
        .filter_map(|w| w.split_once('='))
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
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
    let mut shown = Vec::new();
    for page in pages(root) {
        let text = std::fs::read_to_string(&page).expect("reading a page");
        let name = page
            .strip_prefix(root)
            .unwrap_or(&page)
            .display()
            .to_string();
        for (line, code) in code_lines(&text) {
            if draws(&code) {
                continue;
            }
            let code = code.strip_prefix("$ ").unwrap_or(&code);
            for words in shell_commands(code) {
                let Some((env, binary, words)) = invocation(&words, binaries) else {
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
                });
            }
        }
    }
    shown
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
