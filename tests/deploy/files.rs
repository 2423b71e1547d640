//! Reading the deployment files: the Kubernetes manifests of deploy/k8s, docker-compose.yml and
//! the Dockerfile both run, and the folder of binaries they are checked against.

use std::path::{Path, PathBuf};
use yaml_rust2::{Yaml, YamlLoader};

pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

pub fn text(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub fn load(path: &str) -> Vec<Yaml> {
    YamlLoader::load_from_str(&text(path)).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
}

/// A sequence of strings (args, command), or an empty one when absent.
pub fn strings(y: &Yaml) -> Vec<String> {
    match y {
        Yaml::Array(items) => items
            .iter()
            .map(|i| match i {
                Yaml::String(s) => s.clone(),
                Yaml::Integer(n) => n.to_string(),
                other => panic!("not a string: {other:?}"),
            })
            .collect(),
        Yaml::BadValue | Yaml::Null => Vec::new(),
        other => panic!("not a list of strings: {other:?}"),
    }
}

/// The entries of a mapping (empty when absent).
pub fn entries(y: &Yaml) -> Vec<(String, &Yaml)> {
    match y.as_hash() {
        Some(h) => h
            .iter()
            .map(|(k, v)| (k.as_str().expect("a string key").to_owned(), v))
            .collect(),
        None => Vec::new(),
    }
}

/// The names of the binaries of `src/bin`.
pub fn binaries() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repo("src/bin"))
        .expect("src/bin")
        .filter_map(Result::ok)
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".rs"))
                .map(str::to_owned)
        })
        .collect();
    names.sort();
    names
}

/// The image's default program (`ENTRYPOINT`) and the binaries it copies out of the build.
pub fn dockerfile() -> (String, Vec<String>) {
    let text = text("Dockerfile");
    let entrypoint = text
        .lines()
        .find_map(|l| l.strip_prefix("ENTRYPOINT "))
        .map(|e| {
            e.trim()
                .trim_matches(['[', ']'])
                .trim()
                .trim_matches('"')
                .to_owned()
        })
        .expect("an ENTRYPOINT");
    let copied = text
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("target/release/"))
        .map(str::to_owned)
        .collect();
    (entrypoint, copied)
}

/// The Kubernetes manifests: every `.yml` of deploy/k8s but the kustomization.
pub fn k8s_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(repo("deploy/k8s"))
        .expect("deploy/k8s")
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|n| n.ends_with(".yml") || n.ends_with(".yaml"))
        .filter(|n| !n.starts_with("kustomization."))
        .collect();
    files.sort();
    files
}

/// Every document of every manifest, with its file.
pub fn k8s_docs() -> Vec<(String, Yaml)> {
    k8s_files()
        .into_iter()
        .flat_map(|f| {
            load(&format!("deploy/k8s/{f}"))
                .into_iter()
                .map(move |d| (f.clone(), d))
        })
        .collect()
}

/// A workload of the manifests: a StatefulSet (or Deployment) and the binary its main container
/// runs (its `command`, or the image's ENTRYPOINT).
pub struct Workload {
    pub file: String,
    pub name: String,
    pub doc: Yaml,
    pub binary: String,
    pub args: Vec<String>,
}

impl Workload {
    pub fn pod(&self) -> &Yaml {
        &self.doc["spec"]["template"]["spec"]
    }
    pub fn container(&self) -> &Yaml {
        &self.pod()["containers"][0]
    }
}

pub fn workloads() -> Vec<Workload> {
    let (entrypoint, _) = dockerfile();
    k8s_docs()
        .into_iter()
        .filter(|(_, d)| matches!(d["kind"].as_str(), Some("StatefulSet" | "Deployment")))
        .map(|(file, doc)| {
            let name = doc["metadata"]["name"].as_str().expect("a name").to_owned();
            let containers = doc["spec"]["template"]["spec"]["containers"]
                .as_vec()
                .expect("containers");
            assert_eq!(containers.len(), 1, "{file}: {name}: one container a pod");
            let command = strings(&containers[0]["command"]);
            let binary = command
                .first()
                .cloned()
                .unwrap_or_else(|| entrypoint.clone());
            assert!(
                command.len() <= 1,
                "{file}: {name}: arguments go in args, not after the command"
            );
            let args = strings(&containers[0]["args"]);
            Workload {
                file,
                name,
                doc,
                binary,
                args,
            }
        })
        .collect()
}

/// A service of docker-compose.yml. `binary` is what it runs of the project's image (its
/// entrypoint, or the image's ENTRYPOINT); `None` for another image (Kafka, PostgreSQL, ...).
pub struct ComposeService {
    pub name: String,
    pub raw: Yaml,
    pub binary: Option<String>,
    pub args: Vec<String>,
}

impl ComposeService {
    /// The profiles it belongs to; none: it starts with every `up`.
    pub fn profiles(&self) -> Vec<String> {
        strings(&self.raw["profiles"])
    }

    /// Its environment, as name and value (the mapping form; the list form `NAME=value` too).
    pub fn environment(&self) -> Vec<(String, String)> {
        match &self.raw["environment"] {
            Yaml::Hash(_) => entries(&self.raw["environment"])
                .into_iter()
                .map(|(k, v)| {
                    let v = match v {
                        Yaml::String(s) => s.clone(),
                        Yaml::Integer(n) => n.to_string(),
                        Yaml::Boolean(b) => b.to_string(),
                        Yaml::Null => String::new(),
                        other => panic!("{}: {k} = {other:?}", self.name),
                    };
                    (k, v)
                })
                .collect(),
            list => strings(list)
                .into_iter()
                .map(|e| match e.split_once('=') {
                    Some((k, v)) => (k.to_owned(), v.to_owned()),
                    None => (e, String::new()),
                })
                .collect(),
        }
    }

    /// Its volumes (short syntax), as source and target: a named volume or a host path.
    pub fn volumes(&self) -> Vec<(String, String)> {
        strings(&self.raw["volumes"])
            .into_iter()
            .map(|v| {
                let mut parts = v.split(':');
                let source = parts.next().unwrap_or_default().to_owned();
                let target = parts
                    .next()
                    .unwrap_or_else(|| panic!("{}: volume {v} has no target", self.name));
                (source, target.to_owned())
            })
            .collect()
    }

    /// The host file or folder of the repository mounted where `path` is, and the rest of `path`
    /// below the mount.
    pub fn host_path_of(&self, path: &Path) -> Option<PathBuf> {
        self.volumes().into_iter().find_map(|(source, target)| {
            let rest = path.strip_prefix(&target).ok()?;
            let source = source.strip_prefix("./")?;
            Some(repo(source).join(rest))
        })
    }

    /// The named volume mounted where `path` is.
    pub fn volume_of(&self, path: &Path) -> Option<String> {
        self.volumes()
            .into_iter()
            .find(|(source, target)| {
                !source.starts_with('.') && !source.starts_with('/') && path.starts_with(target)
            })
            .map(|(source, _)| source)
    }
}

pub const COMPOSE: &str = "docker-compose.yml";

pub fn compose() -> Yaml {
    load(COMPOSE).remove(0)
}

pub fn compose_services() -> Vec<ComposeService> {
    let (entrypoint, _) = dockerfile();
    let doc = compose();
    entries(&doc["services"])
        .into_iter()
        .map(|(name, raw)| {
            let ours = raw["build"].as_hash().is_some()
                || raw["image"].as_str() == Some("price-alerts:local");
            let given = strings(&raw["entrypoint"]);
            let binary = ours.then(|| given.first().cloned().unwrap_or_else(|| entrypoint.clone()));
            let mut args: Vec<String> = given.iter().skip(1).cloned().collect();
            args.extend(strings(&raw["command"]));
            ComposeService {
                name,
                raw: raw.clone(),
                binary,
                args,
            }
        })
        .collect()
}

/// `kafka.version` of scripts/kafka/pom.xml: the Kafka that scripts/kafka.sh runs.
pub fn scripts_kafka_version() -> String {
    let pom = text("scripts/kafka/pom.xml");
    let start = pom
        .find("<kafka.version>")
        .expect("kafka.version in pom.xml")
        + 15;
    let end = start + pom[start..].find('<').expect("</kafka.version>");
    pom[start..end].trim().to_owned()
}
