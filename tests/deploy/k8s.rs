//! What the Kubernetes schemas cannot check in deploy/k8s: that each workload runs its binary with
//! flags that parse, probes and ports where those flags serve them, a grace period above its
//! shutdown bound, an instance id of its own, and its secrets as mode-600 files only.

use super::binaries::{self, Stage};
use super::files::{entries, strings, Workload};
use price_alerts::cli::SHUTDOWN_MARGIN;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;
use yaml_rust2::Yaml;

/// Checks one workload of a stage; `docs` are every document of the manifests (its Service and
/// PodDisruptionBudget among them).
pub fn check_stage(w: &Workload, docs: &[(String, Yaml)]) -> Stage {
    let at = format!("{}: {}", w.file, w.name);
    let parsed = binaries::parse(&w.binary, &w.args)
        .unwrap_or_else(|e| panic!("{at}: the args do not parse: {e}"));
    let stage = parsed
        .stage
        .clone()
        .unwrap_or_else(|| panic!("{at}: {} is not a stage", w.binary));
    let pod = w.pod();
    let container = w.container();

    // The grace period covers a clean shutdown: the bound and the watchdog's margin.
    let grace = pod["terminationGracePeriodSeconds"]
        .as_i64()
        .unwrap_or_else(|| panic!("{at}: no terminationGracePeriodSeconds (30 s by default)"));
    assert!(
        Duration::from_secs(grace as u64) > stage.shutdown_timeout + SHUTDOWN_MARGIN,
        "{at}: grace {grace}s must exceed --shutdown-timeout {:?} and the watchdog's {SHUTDOWN_MARGIN:?}, \
         or Kubernetes kills a clean shutdown",
        stage.shutdown_timeout
    );

    // /metrics, /healthz and /readyz are served on --metrics-addr's port: the container's port
    // named http is that one, the probes ask it, and Prometheus is told to scrape it.
    let port = stage
        .metrics_addr
        .unwrap_or_else(|| panic!("{at}: no --metrics-addr: nothing would answer the probes"))
        .port();
    let declared = container["ports"]
        .as_vec()
        .and_then(|ports| ports.iter().find(|p| p["name"].as_str() == Some("http")))
        .and_then(|p| p["containerPort"].as_i64());
    assert_eq!(declared, Some(i64::from(port)), "{at}: containerPort http");
    for (probe, path) in [
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{at}: {probe}'s path");
        let probe_port = match &get["port"] {
            Yaml::String(name) => {
                assert_eq!(name, "http", "{at}: {probe} asks port {name}");
                port
            }
            Yaml::Integer(n) => *n as u16,
            other => panic!("{at}: {probe} has no port: {other:?}"),
        };
        assert_eq!(probe_port, port, "{at}: {probe}'s port");
    }
    let annotations = &w.doc["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(
        annotations["prometheus.io/scrape"].as_str(),
        Some("true"),
        "{at}: scrape annotation"
    );
    assert_eq!(
        annotations["prometheus.io/port"].as_str(),
        Some(port.to_string().as_str()),
        "{at}: the scrape port is --metrics-addr's"
    );
    assert_eq!(
        annotations["prometheus.io/path"].as_str(),
        Some("/metrics"),
        "{at}: scrape path"
    );

    // The instance id is the pod's stable name, from the variable the CLI reads; dynamic
    // membership (docs/pipeline.md, "Group membership").
    let env = container["env"].as_vec().cloned().unwrap_or_default();
    let instance = env
        .iter()
        .find(|e| e["name"].as_str() == Some("INSTANCE_ID"))
        .unwrap_or_else(|| panic!("{at}: no INSTANCE_ID"));
    assert_eq!(
        instance["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.name"),
        "{at}: the instance id is the pod's name, unique per replica and stable across restarts"
    );
    assert!(
        !w.args.iter().any(|a| a.starts_with("--instance-id")),
        "{at}: the instance id must come from the pod name"
    );
    assert!(
        !stage.static_membership,
        "{at}: the pods run with dynamic group membership"
    );
    assert!(
        matches!(w.doc["kind"].as_str(), Some("StatefulSet")),
        "{at}: a StatefulSet: a Deployment's pod names change at every restart"
    );

    // Every variable set is one the binary reads.
    let known = binaries::env_names(&w.binary);
    for e in &env {
        let name = e["name"].as_str().expect("an env name");
        assert!(
            known.contains(name),
            "{at}: {name} is set, but {} reads no such variable",
            w.binary
        );
    }

    check_secrets(w, &parsed.secret_files, &at);
    check_resources(w, &at);
    check_siblings(w, docs, &at);
    stage
}

/// The stage's secrets reach it as mode-600 files of its own user and only so: the Secret volume
/// is read by the init container alone, which copies each file with `install -m 600` into a
/// memory-backed emptyDir; every secret file the binary reads is one of those copies.
fn check_secrets(w: &Workload, secret_files: &[(&str, std::path::PathBuf)], at: &str) {
    let pod = w.pod();
    let volumes = pod["volumes"].as_vec().cloned().unwrap_or_default();
    let secret_volumes: BTreeSet<&str> = volumes
        .iter()
        .filter(|v| !v["secret"].is_badvalue())
        .map(|v| v["name"].as_str().expect("a volume name"))
        .collect();
    let mounts = |c: &Yaml| -> Vec<(String, String, bool)> {
        c["volumeMounts"]
            .as_vec()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|m| {
                (
                    m["name"].as_str().expect("a mount name").to_owned(),
                    m["mountPath"].as_str().expect("a mountPath").to_owned(),
                    m["readOnly"].as_bool().unwrap_or(false),
                )
            })
            .collect()
    };
    let container = w.container();
    for (name, path, _) in mounts(container) {
        assert!(
            !secret_volumes.contains(name.as_str()),
            "{at}: the container mounts the Secret volume {name} at {path}: its files are root's \
             (mode 0440 with fsGroup), which the binary refuses; mount the init container's copies"
        );
    }
    if secret_files.is_empty() {
        return;
    }
    assert!(
        pod["securityContext"]["fsGroup"].as_i64().is_some(),
        "{at}: without fsGroup the init container, not root, cannot read the Secret's files"
    );
    assert!(
        container["securityContext"]["runAsUser"].is_badvalue(),
        "{at}: the copies belong to the pod's user: the container must not run as another"
    );
    let init = pod["initContainers"]
        .as_vec()
        .and_then(|c| c.iter().find(|c| c["name"].as_str() == Some("secrets")))
        .unwrap_or_else(|| panic!("{at}: no init container `secrets` to copy the Secret's files"));
    let command = strings(&init["command"]);
    let (dir, sources) = match command.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["install", "-m", "600", "-t", dir, ref sources @ ..] if !sources.is_empty() => (
            dir.to_owned(),
            sources.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        ),
        _ => {
            panic!("{at}: the init container must run `install -m 600 -t DIR FILE...`: {command:?}")
        }
    };
    let volume_of = |mounts: &[(String, String, bool)], path: &str| {
        mounts
            .iter()
            .find(|(_, m, _)| Path::new(path).starts_with(m))
            .cloned()
    };
    // The copies' folder: a memory-backed emptyDir, written by the init container only.
    let init_mounts = mounts(init);
    let (copies, _, _) = volume_of(&init_mounts, &dir).unwrap_or_else(|| {
        panic!("{at}: the init container writes {dir}, which it does not mount")
    });
    let copies_volume = volumes
        .iter()
        .find(|v| v["name"].as_str() == Some(copies.as_str()))
        .expect("the copies' volume");
    assert_eq!(
        copies_volume["emptyDir"]["medium"].as_str(),
        Some("Memory"),
        "{at}: the copies stay in memory, never on the node's disk"
    );
    for source in &sources {
        let (volume, _, _) = volume_of(&init_mounts, source)
            .unwrap_or_else(|| panic!("{at}: the init container copies {source}, not mounted"));
        assert!(
            secret_volumes.contains(volume.as_str()),
            "{at}: {source} comes from {volume}, not a Secret volume"
        );
    }
    let copied: BTreeSet<String> = sources
        .iter()
        .map(|s| format!("{dir}/{}", s.rsplit('/').next().unwrap_or_default()))
        .collect();
    let main_mounts = mounts(container);
    for (flag, file) in secret_files {
        let file = file.to_str().expect("a UTF-8 path");
        assert!(
            copied.contains(file),
            "{at}: {flag} {file} is not one of the init container's mode-600 copies {copied:?}"
        );
        let (volume, _, read_only) = volume_of(&main_mounts, file)
            .unwrap_or_else(|| panic!("{at}: {flag} {file} is on no volume of the container"));
        assert_eq!(volume, copies, "{at}: {flag} {file}");
        assert!(read_only, "{at}: the container mounts the copies read-only");
    }
}

/// Every container asks for CPU and memory and is bounded in memory, and the manifest says where
/// the figures come from (bench/RESULTS.md, or that they are not measured).
fn check_resources(w: &Workload, at: &str) {
    let pod = w.pod();
    let all = pod["initContainers"]
        .as_vec()
        .into_iter()
        .flatten()
        .chain(pod["containers"].as_vec().into_iter().flatten());
    for c in all {
        let name = c["name"].as_str().unwrap_or("?");
        let r = &c["resources"];
        for (what, value) in [
            ("requests.cpu", &r["requests"]["cpu"]),
            ("requests.memory", &r["requests"]["memory"]),
            ("limits.memory", &r["limits"]["memory"]),
        ] {
            assert!(
                value.as_str().is_some(),
                "{at}: container {name} has no resources.{what}"
            );
        }
    }
    let text = super::files::text(&format!("deploy/k8s/{}", w.file));
    assert!(
        text.contains("bench/RESULTS.md"),
        "{at}: say which figures of bench/RESULTS.md the resources come from"
    );
}

/// The headless Service the StatefulSet names, and a PodDisruptionBudget, both selecting its pods.
fn check_siblings(w: &Workload, docs: &[(String, Yaml)], at: &str) {
    let labels = &w.doc["spec"]["template"]["metadata"]["labels"];
    let selects = |selector: &Yaml| {
        let pairs = entries(selector);
        !pairs.is_empty()
            && pairs
                .iter()
                .all(|(k, v)| labels[k.as_str()].as_str() == v.as_str())
    };
    assert!(
        selects(&w.doc["spec"]["selector"]["matchLabels"]),
        "{at}: its selector selects its own pods"
    );
    let service_name = w.doc["spec"]["serviceName"]
        .as_str()
        .unwrap_or_else(|| panic!("{at}: no serviceName"));
    let service = docs
        .iter()
        .find(|(_, d)| {
            d["kind"].as_str() == Some("Service")
                && d["metadata"]["name"].as_str() == Some(service_name)
        })
        .unwrap_or_else(|| panic!("{at}: no Service {service_name}"));
    assert_eq!(
        service.1["spec"]["clusterIP"].as_str(),
        Some("None"),
        "{at}: a headless Service"
    );
    assert!(
        selects(&service.1["spec"]["selector"]),
        "{at}: Service {service_name} selects the pods"
    );
    assert!(
        docs.iter().any(|(_, d)| {
            d["kind"].as_str() == Some("PodDisruptionBudget")
                && selects(&d["spec"]["selector"]["matchLabels"])
        }),
        "{at}: no PodDisruptionBudget selects its pods"
    );
}
