//! The validators of other projects, run on the deployment files: kubernetes-validate and
//! check-jsonschema from the virtualenv scripts/validators.sh makes (.validators/, at the
//! versions of scripts/validators.txt), promtool from the distribution's prometheus package. A
//! missing one fails the test that needs it, naming how to install it: never a silent pass.

use super::files::repo;
use std::path::PathBuf;
use std::process::Command;

/// A program of the validators' virtualenv.
fn venv_tool(name: &str) -> PathBuf {
    let path = repo(".validators/bin").join(name);
    assert!(
        path.is_file(),
        "{} not found: run scripts/validators.sh (scripts/test.sh does), which installs the \
         versions of scripts/validators.txt into .validators/",
        path.display()
    );
    path
}

/// Runs `program` with `args` in the repository; its status and everything it printed.
fn run(program: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(program)
        .args(args)
        .current_dir(repo("."))
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// kubernetes-validate --strict on one manifest (a path in the repository), which holds
/// `documents` resources. Strict: a field the API does not have (a misspelt key) fails. Each
/// resource must be reported passed: the tool only warns, and exits 0, on a kind or apiVersion
/// it has no schema for (a misspelt `kind`), and finds nothing in an empty file.
pub fn kubernetes_validate(manifest: &str, documents: usize) {
    let (ok, text) = run(&venv_tool("kubernetes-validate"), &["--strict", manifest]);
    assert!(
        ok,
        "kubernetes-validate --strict {manifest} failed:\n{text}"
    );
    assert!(
        !text.contains("WARN") && !text.contains("Couldn't find schema"),
        "kubernetes-validate could not check all of {manifest}:\n{text}"
    );
    let passed = text.matches(" passed for resource ").count();
    assert_eq!(
        passed, documents,
        "kubernetes-validate passed {passed} resources of {manifest}'s {documents}:\n{text}"
    );
}

/// docker-compose.yml against the compose specification's JSON schema, the copy that
/// check-jsonschema carries (`vendor.compose-spec`, refreshed from compose-spec/compose-spec with
/// each of its releases; scripts/validators.txt says why that one).
pub fn compose_schema(file: &str) {
    let (ok, text) = run(
        &venv_tool("check-jsonschema"),
        &["--builtin-schema", "vendor.compose-spec", file],
    );
    assert!(
        ok && text.contains("ok -- validation done"),
        "{file} does not pass the compose specification's schema:\n{text}"
    );
}

/// promtool (the distribution's prometheus package) with `args`, in deploy/prometheus.
pub fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(repo("deploy/prometheus"))
        .output()
        .expect("promtool not found: install the distribution's prometheus package (scripts/test.sh does)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
}
