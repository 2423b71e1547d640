//! What ships beside the binaries, checked without Docker or a cluster, in seconds:
//!
//! - the Prometheus alert rules: promtool checks and unit-tests them, and they name only metrics
//!   that alert-pipeline, alert-sink or alert-deliver export, each linked to its runbook section;
//! - the Kubernetes manifests of deploy/k8s: kubernetes-validate against the API's schemas, and
//!   against the binaries (their own clap structs parse the args; probes, ports, scrape
//!   annotations on --metrics-addr; a grace period above the shutdown bound; the instance id from
//!   the pod name; secrets as mode-600 copies only; resources, Service and disruption budget);
//! - docker-compose.yml: the compose specification's schema, and the same against the binaries,
//!   plus the services' agreement with each other and with the Prometheus and Grafana files;
//! - both: every stage of src/bin has a workload in each, Kafka is the version of the scripts,
//!   and no secret is written in either.
//!
//! The tests that run another project's validator are #[ignore]d (scripts/test.sh runs them, after
//! scripts/validators.sh installed kubernetes-validate and check-jsonschema); they fail, naming
//! the install, when the validator is missing.

#[path = "deploy/binaries.rs"]
mod binaries;
#[path = "deploy/compose.rs"]
mod compose;
#[path = "deploy/files.rs"]
mod files;
#[path = "deploy/k8s.rs"]
mod k8s;
#[path = "deploy/validators.rs"]
mod validators;

use binaries::Role;
use files::{load, repo};
use std::collections::BTreeSet;

#[test]
#[ignore = "needs promtool (the prometheus package): run scripts/test.sh"]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    validators::promtool(&["check", "rules", "alerts.yml"]);
    validators::promtool(&["test", "rules", "alerts.test.yml"]);
}

#[test]
#[ignore = "needs promtool (the prometheus package): run scripts/test.sh"]
fn the_compose_prometheus_configuration_passes_promtool_check_config() {
    // The configuration and the rule files it loads, as Prometheus would read them.
    validators::promtool(&["check", "config", "prometheus.yml"]);
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
#[ignore = "needs kubernetes-validate (scripts/validators.sh): run scripts/test.sh"]
fn every_kubernetes_manifest_passes_the_kubernetes_schemas() {
    let manifests = files::k8s_files();
    assert!(manifests.len() >= 3, "a manifest per stage: {manifests:?}");
    for m in manifests {
        let documents = load(&format!("deploy/k8s/{m}")).len();
        validators::kubernetes_validate(&format!("deploy/k8s/{m}"), documents);
    }
}

#[test]
#[ignore = "needs check-jsonschema (scripts/validators.sh): run scripts/test.sh"]
fn docker_compose_passes_the_compose_specification_schema() {
    validators::compose_schema(files::COMPOSE);
}

#[test]
fn every_stage_has_a_workload_in_kubernetes_and_a_service_in_compose() {
    let bins = files::binaries();
    let placed: Vec<&str> = binaries::ROLES.iter().map(|(b, _, _)| *b).collect();
    for b in &bins {
        assert!(
            placed.contains(&b.as_str()),
            "src/bin/{b}.rs: say where it runs in tests/deploy/binaries.rs (ROLES): a stage needs \
             a workload in deploy/k8s and a service in docker-compose.yml"
        );
    }
    for b in &placed {
        assert!(
            bins.iter().any(|x| x == b),
            "ROLES names {b}, which src/bin does not have"
        );
    }
    let workloads = files::workloads();
    let services = files::compose_services();
    let (_, copied) = files::dockerfile();
    let run: Vec<(String, &str)> = workloads
        .iter()
        .map(|w| (w.binary.clone(), "deploy/k8s"))
        .chain(
            services
                .iter()
                .filter_map(|s| s.binary.clone().map(|b| (b, files::COMPOSE))),
        )
        .collect();
    for (binary, place) in &run {
        if binaries::HELPERS.iter().any(|(h, _)| h == binary) {
            continue;
        }
        let role = binaries::role(binary)
            .unwrap_or_else(|| panic!("{place} runs {binary}, which is no binary of src/bin"));
        assert!(
            copied.contains(binary),
            "{place} runs {binary}, which the Dockerfile does not copy into the image"
        );
        if *place == "deploy/k8s" {
            assert_eq!(role, Role::Service, "deploy/k8s runs {binary}, not a stage");
        }
    }
    for (binary, role, why) in binaries::ROLES {
        let in_k8s = workloads.iter().filter(|w| w.binary == *binary).count();
        let in_compose = services
            .iter()
            .filter(|s| s.binary.as_deref() == Some(binary))
            .count();
        match role {
            Role::Service => {
                assert_eq!(in_k8s, 1, "{binary} ({why}): one workload in deploy/k8s");
                assert_eq!(
                    in_compose,
                    1,
                    "{binary} ({why}): one service in {}",
                    files::COMPOSE
                );
            }
            Role::Compose => {
                assert!(
                    in_compose >= 1,
                    "{binary} ({why}): a service in {}",
                    files::COMPOSE
                );
            }
            Role::Manual => {}
        }
    }
}

#[test]
fn kubernetes_workloads_run_their_binaries_with_real_flags_probes_grace_and_secrets() {
    let docs = files::k8s_docs();
    let workloads = files::workloads();
    assert!(!workloads.is_empty(), "no workload in deploy/k8s");
    for w in &workloads {
        k8s::check_stage(w, &docs);
    }
    for (file, doc) in &docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        assert!(
            matches!(kind, "Service" | "StatefulSet" | "PodDisruptionBudget"),
            "{file}: a {kind:?}: what is it for? (a Secret holds values, which never go in here)"
        );
    }
}

#[test]
fn the_kustomization_applies_every_manifest() {
    let k = &load("deploy/k8s/kustomization.yml")[0];
    assert_eq!(k["kind"].as_str(), Some("Kustomization"));
    let listed: BTreeSet<String> = files::strings(&k["resources"]).into_iter().collect();
    let present: BTreeSet<String> = files::k8s_files().into_iter().collect();
    assert_eq!(
        listed, present,
        "deploy/k8s/kustomization.yml's resources must be every manifest of deploy/k8s"
    );
    let images: Vec<&str> = k["images"]
        .as_vec()
        .into_iter()
        .flatten()
        .filter_map(|i| i["name"].as_str())
        .collect();
    for w in files::workloads() {
        let image = w.container()["image"].as_str().expect("an image");
        let name = image.split(':').next().unwrap_or_default();
        assert!(
            images.contains(&name),
            "{}: image {image} is not set by the kustomization's images",
            w.file
        );
    }
}

#[test]
fn compose_services_run_their_binaries_with_real_flags_probes_grace_and_wiring() {
    let services = files::compose_services();
    compose::check_structure(&services);
    let parsed = compose::parsed_services();
    let mut stages = Vec::new();
    for (s, p) in &parsed {
        compose::check_environment(s);
        let binary = s.binary.clone().expect("ours");
        if binaries::role(&binary) == Some(Role::Service) {
            let port = compose::check_stage(s, p);
            stages.push((s.name.clone(), binary, port));
        }
    }
    compose::check_monitoring(&stages, &services);
    compose::check_wiring(&parsed);
    let (sink, sink_args) = parsed
        .iter()
        .find(|(s, _)| s.binary.as_deref() == Some("alert-sink"))
        .expect("alert-sink");
    let files: Vec<std::path::PathBuf> = sink_args
        .secret_files
        .iter()
        .filter(|(flag, _)| *flag == "--database-url-file")
        .map(|(_, f)| f.clone())
        .collect();
    assert_eq!(
        files.len(),
        1,
        "{}: alert-sink reads its URL from --database-url-file",
        files::COMPOSE
    );
    compose::check_secret_maker(&services, sink, &files);
}

#[test]
fn compose_runs_the_kafka_version_the_scripts_run() {
    let version = files::scripts_kafka_version();
    let kafka = files::compose_services()
        .into_iter()
        .find(|s| s.name == "kafka")
        .expect("a kafka service");
    let image = kafka.raw["image"].as_str().expect("an image");
    // `${KAFKA_IMAGE:-apache/kafka:X}`: the default is what runs unless overridden.
    let default = image
        .strip_prefix("${KAFKA_IMAGE:-")
        .and_then(|i| i.strip_suffix('}'))
        .unwrap_or(image);
    assert_eq!(
        default,
        format!("apache/kafka:{version}"),
        "{}: Kafka must be scripts/kafka/pom.xml's {version}, as the tests and benchmarks run it",
        files::COMPOSE
    );
    // Comments aside: a second image of Kafka (a tool's, say) must take the same version.
    let named = files::text(files::COMPOSE)
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| l.split(" #").next().unwrap_or_default())
        .filter(|l| l.contains("apache/kafka:"))
        .count();
    assert_eq!(named, 1, "one place names the Kafka image");
}

/// The host's port of the compose project's PostgreSQL is where `secrets host-url` points, and
/// below Linux's ephemeral range (32768-60999), as scripts/postgres.sh's default: a port in that
/// range can be held by a host client connection's local port, and the mapping's bind then fails.
#[test]
fn compose_publishes_postgres_where_host_url_points_below_the_ephemeral_range() {
    let postgres = files::compose_services()
        .into_iter()
        .find(|s| s.name == "postgres")
        .expect("a postgres service");
    let published: Vec<u16> = files::strings(&postgres.raw["ports"])
        .iter()
        .filter_map(|p| {
            p.strip_prefix("127.0.0.1:")?
                .strip_suffix(":5432")?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(
        published.len(),
        1,
        "{}: postgres publishes 5432 on one port of 127.0.0.1",
        files::COMPOSE
    );
    let secrets = "deploy/compose/secrets.sh";
    let host_url_ports: Vec<u16> = files::text(secrets)
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            l.split("@127.0.0.1:")
                .nth(1)?
                .split('/')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(
        host_url_ports,
        published,
        "{secrets}: host-url points where {} publishes PostgreSQL",
        files::COMPOSE
    );
    assert!(
        published[0] < 32768,
        "{}: PostgreSQL's host port {} lies in the ephemeral range",
        files::COMPOSE,
        published[0]
    );
}

#[test]
fn no_secret_is_written_in_the_manifests_or_compose() {
    let secret_env = binaries::secret_env_names();
    assert!(secret_env.contains("DATABASE_URL"), "{secret_env:?}");
    // A password inside a URL (scheme://user:password@host), anywhere in either.
    let url_password = |text: &str| {
        text.split("://").skip(1).any(|rest| {
            let authority = rest
                .split(['/', ' ', '"', '\'', '\n'])
                .next()
                .unwrap_or_default();
            authority
                .rsplit_once('@')
                .is_some_and(|(userinfo, _)| userinfo.contains(':'))
        })
    };
    let looks_secret = |name: &str| {
        let n = name.to_ascii_uppercase();
        secret_env.contains(name)
            || ((n.contains("PASSWORD") || n.contains("SECRET") || n.contains("TOKEN"))
                && !n.ends_with("_FILE"))
    };
    let mut checked = 0;
    for file in files::k8s_files()
        .into_iter()
        .map(|f| format!("deploy/k8s/{f}"))
        .chain([files::COMPOSE.to_owned()])
    {
        assert!(
            !url_password(&files::text(&file)),
            "{file}: a password in a URL"
        );
        checked += 1;
    }
    assert!(checked >= 4);
    for (file, doc) in files::k8s_docs() {
        assert_ne!(
            doc["kind"].as_str(),
            Some("Secret"),
            "{file}: a Secret's values"
        );
        let pod = &doc["spec"]["template"]["spec"];
        let containers = pod["containers"]
            .as_vec()
            .into_iter()
            .flatten()
            .chain(pod["initContainers"].as_vec().into_iter().flatten());
        for c in containers {
            let at = format!("{file}: {}", c["name"].as_str().unwrap_or("?"));
            let args: Vec<String> = files::strings(&c["command"])
                .into_iter()
                .chain(files::strings(&c["args"]))
                .collect();
            if let Some(why) = binaries::secret_in_args(&args) {
                panic!("{at}: {why}: a command line is readable by every local user");
            }
            assert!(
                c["envFrom"].is_badvalue(),
                "{at}: envFrom: secrets come as files"
            );
            for e in c["env"].as_vec().into_iter().flatten() {
                let name = e["name"].as_str().unwrap_or_default();
                assert!(
                    !looks_secret(name),
                    "{at}: {name}: secrets come as files, never env"
                );
                assert!(
                    e["valueFrom"]["secretKeyRef"].is_badvalue(),
                    "{at}: {name} from a Secret: secrets come as files, never env"
                );
            }
        }
    }
    for s in files::compose_services() {
        let at = format!("{}: {}", files::COMPOSE, s.name);
        for (name, _) in s.environment() {
            assert!(
                !looks_secret(&name),
                "{at}: {name}: secrets come as files, never env"
            );
        }
        if let Some(why) = binaries::secret_in_args(&s.args) {
            panic!("{at}: {why}: a command line is readable by every local user");
        }
        assert!(
            s.raw["env_file"].is_badvalue(),
            "{at}: env_file: its variables are not checked here, and secrets come as files"
        );
    }
}
