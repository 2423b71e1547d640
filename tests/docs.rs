//! The documents ship with the repository: every relative link in a Markdown file resolves to a
//! file inside it, and no document sends a reader to a place a clone does not have (the design
//! once lived in a workspace folder beside the repository).

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

/// The targets of the inline links `[text](target)` of a Markdown text.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = text;
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
            if target.is_empty()
                || target.starts_with('#')
                || target.contains("://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            let path = target.split('#').next().unwrap_or("");
            let resolved = file.parent().expect("a document's folder").join(path);
            match resolved.canonicalize() {
                Ok(p) if p.starts_with(&root) => {}
                Ok(p) => broken.push(format!("{shown}: {target} leaves the repository ({p:?})")),
                Err(e) => broken.push(format!("{shown}: {target}: {e}")),
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
