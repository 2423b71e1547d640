//! What ships beside the binaries: the Prometheus alert rules (checked and unit-tested by
//! promtool, and naming only metrics that alert-pipeline, alert-sink or alert-deliver export) and the Kubernetes StatefulSet (its flags parse,
//! its probes point at the real endpoints, its grace period covers the shutdown timeout, its pods
//! run with dynamic group membership and an instance id of their own).

use clap::Parser;
use price_alerts::cli::PipelineArgs;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use yaml_rust2::{Yaml, YamlLoader};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn load(path: &str) -> Vec<Yaml> {
    let text = std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
}

fn promtool(args: &[&str]) {
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

#[test]
#[ignore = "needs promtool (the prometheus package): run scripts/test.sh"]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    promtool(&["check", "rules", "alerts.yml"]);
    promtool(&["test", "rules", "alerts.test.yml"]);
}

#[test]
fn alert_rules_name_only_metrics_that_exist_and_link_the_runbook() {
    // What the three stages export: the processor's catalogue (alert-deliver and alert-sink
    // export some of it too), alert-sink's and alert-deliver's.
    let known: BTreeSet<&str> = price_alerts::metrics::CATALOGUE
        .iter()
        .chain(price_alerts::sink::metrics::CATALOGUE)
        .map(|(name, _, _)| *name)
        .chain(price_alerts::deliver::metrics::CATALOGUE.iter().copied())
        .collect();
    let runbook = std::fs::read_to_string(repo("docs/runbook.md")).expect("docs/runbook.md");
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| h.to_lowercase().replace(' ', "-").replace(',', ""))
        .collect();
    let doc = &load("deploy/prometheus/alerts.yml")[0];
    let mut alerts = 0;
    for group in doc["groups"].as_vec().expect("groups") {
        for rule in group["rules"].as_vec().expect("rules") {
            alerts += 1;
            let name = rule["alert"].as_str().expect("alert name");
            let expr = rule["expr"].as_str().expect("expr");
            let used: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("alerts_"))
                .collect();
            assert!(!used.is_empty(), "{name} uses no metric of ours");
            for metric in used {
                assert!(
                    known.contains(metric),
                    "{name} uses {metric}, which none of the stages exports"
                );
            }
            let link = rule["annotations"]["runbook"]
                .as_str()
                .unwrap_or_else(|| panic!("{name} has no runbook link"));
            let anchor = link
                .strip_prefix("docs/runbook.md#")
                .expect("a link into docs/runbook.md");
            assert!(
                anchors.contains(anchor),
                "{name} links to #{anchor}, which docs/runbook.md lacks"
            );
        }
    }
    assert!(alerts >= 7, "the rules an on-call needs");
}

#[test]
fn the_statefulset_runs_the_pipeline_with_real_flags_probes_and_grace() {
    let docs = load("deploy/k8s/pipeline.yml");
    let set = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("StatefulSet"))
        .expect("a StatefulSet");
    let pod = &set["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_vec()
        .expect("args")
        .iter()
        .filter_map(Yaml::as_str)
        .collect();

    // The flags are the binary's own: they parse.
    let argv = std::iter::once("alert-pipeline").chain(args.iter().copied());
    let parsed = PipelineArgs::try_parse_from(argv)
        .unwrap_or_else(|e| panic!("the manifest's args do not parse: {e}"));

    let grace = pod["terminationGracePeriodSeconds"]
        .as_i64()
        .expect("a termination grace period");
    assert!(
        Duration::from_secs(grace as u64) > parsed.shutdown_timeout,
        "grace {grace}s must exceed --shutdown-timeout {:?}, or Kubernetes kills a clean shutdown",
        parsed.shutdown_timeout
    );
    let port = parsed
        .metrics_addr
        .expect("--metrics-addr serves the probes")
        .port();
    let declared = container["ports"]
        .as_vec()
        .expect("ports")
        .iter()
        .find(|p| p["name"].as_str() == Some("http"));
    assert_eq!(
        declared.and_then(|p| p["containerPort"].as_i64()),
        Some(i64::from(port))
    );
    assert_eq!(
        container["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    assert_eq!(
        container["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );

    // The instance id is the pod's stable name, from the environment the CLI reads.
    let env = container["env"].as_vec().expect("env");
    let instance = env
        .iter()
        .find(|e| e["name"].as_str() == Some("INSTANCE_ID"))
        .expect("INSTANCE_ID");
    assert_eq!(
        instance["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.name")
    );
    assert!(
        !args.iter().any(|a| a.starts_with("--instance-id")),
        "the instance id must come from the pod name"
    );
    // Dynamic membership, the default (README, "Group membership"): a static member killed
    // between the rounds of a cooperative rebalance can leave partitions without an owner.
    assert!(
        !parsed.membership.static_membership,
        "the pods run with dynamic group membership"
    );
    assert_eq!(set["spec"]["serviceName"].as_str(), Some("price-alerts"));
}
