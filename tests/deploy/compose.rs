//! What the compose specification's schema cannot check in docker-compose.yml: each service of
//! the project's image runs its binary with flags that parse, a stage is probed and scraped where
//! its flags serve, is given time for its clean shutdown, and the services agree with each other
//! (what the deliverer calls is what the receiver serves, the ticks go where the pipeline reads).

use super::binaries::{self, Parsed, Role};
use super::files::{self, entries, repo, strings, ComposeService};
use price_alerts::cli::SHUTDOWN_MARGIN;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use yaml_rust2::Yaml;

/// The Prometheus job of each stage: the names tests/prometheus.rs and the dashboard use.
const JOBS: &[(&str, &str)] = &[
    ("alert-pipeline", "pipeline"),
    ("alert-sink", "sink"),
    ("alert-deliver", "deliver"),
];

/// Every service of the project's image, parsed by its binary's clap struct.
pub fn parsed_services() -> Vec<(ComposeService, Parsed)> {
    files::compose_services()
        .into_iter()
        .filter(|s| {
            s.binary
                .as_deref()
                .is_some_and(|b| binaries::role(b).is_some())
        })
        .map(|s| {
            let binary = s.binary.clone().expect("ours");
            let parsed = binaries::parse(&binary, &s.args).unwrap_or_else(|e| {
                panic!("{COMPOSE}: {}: the command does not parse: {e}", s.name)
            });
            (s, parsed)
        })
        .collect()
}

const COMPOSE: &str = files::COMPOSE;

/// One stage's service: probed on its /readyz, time to stop cleanly, one instance id, the
/// variables it is given known to it.
pub fn check_stage(s: &ComposeService, p: &Parsed) -> u16 {
    let at = format!("{COMPOSE}: {}", s.name);
    let stage = p.stage.as_ref().expect("a stage");
    let port = stage
        .metrics_addr
        .unwrap_or_else(|| panic!("{at}: no --metrics-addr: nothing to probe or scrape"))
        .port();
    let probe = strings(&s.raw["healthcheck"]["test"]).join(" ");
    assert!(
        probe.contains(&format!("/dev/tcp/127.0.0.1/{port} ")) && probe.contains("GET /readyz "),
        "{at}: the healthcheck must ask /readyz on --metrics-addr's port {port}: {probe}"
    );
    let grace = s.raw["stop_grace_period"]
        .as_str()
        .unwrap_or_else(|| panic!("{at}: no stop_grace_period: compose kills after 10 s"));
    let grace = price_alerts::cli::duration(grace).unwrap_or_else(|e| panic!("{at}: {e}"));
    assert!(
        grace > stage.shutdown_timeout + SHUTDOWN_MARGIN,
        "{at}: stop_grace_period {grace:?} must exceed --shutdown-timeout {:?} and the \
         watchdog's {SHUTDOWN_MARGIN:?}, or `docker compose stop` kills a clean shutdown",
        stage.shutdown_timeout
    );
    assert!(!stage.static_membership, "{at}: dynamic membership");
    let env = s.environment();
    assert!(
        env.iter().any(|(k, v)| k == "INSTANCE_ID" && !v.is_empty()),
        "{at}: a stable INSTANCE_ID, so a restart fences its predecessor at once"
    );
    assert!(
        s.raw["scale"].is_badvalue() && s.raw["deploy"]["replicas"].is_badvalue(),
        "{at}: one replica: replicas here would share the instance id and fence each other"
    );
    port
}

/// The variables a service of ours sets are ones its binary reads.
pub fn check_environment(s: &ComposeService) {
    let binary = s.binary.as_deref().expect("ours");
    if binaries::role(binary).is_none() {
        return;
    }
    let known = binaries::env_names(binary);
    for (name, _) in s.environment() {
        assert!(
            known.contains(&name),
            "{COMPOSE}: {}: {name} is set, but {binary} reads no such variable",
            s.name
        );
    }
}

/// Prometheus scrapes every stage on its --metrics-addr port, in the job the dashboard groups
/// by, and loads the alert rules; Grafana is given the dashboard and the data source.
pub fn check_monitoring(stages: &[(String, String, u16)], services: &[ComposeService]) {
    let prometheus = services
        .iter()
        .find(|s| s.name == "prometheus")
        .expect("a prometheus service");
    let args = strings(&prometheus.raw["command"]);
    let config = args
        .iter()
        .find_map(|a| a.strip_prefix("--config.file="))
        .expect("prometheus --config.file=");
    let host = prometheus
        .host_path_of(Path::new(config))
        .unwrap_or_else(|| panic!("{COMPOSE}: prometheus reads {config}, which is not mounted"));
    assert_eq!(
        host,
        repo("deploy/prometheus/prometheus.yml"),
        "{COMPOSE}: prometheus' configuration"
    );
    let prom = files::load("deploy/prometheus/prometheus.yml").remove(0);
    assert!(
        strings(&prom["rule_files"])
            .iter()
            .any(|r| r == "alerts.yml"),
        "deploy/prometheus/prometheus.yml loads the project's alert rules"
    );
    let jobs: Vec<(String, Vec<String>)> = prom["scrape_configs"]
        .as_vec()
        .expect("scrape_configs")
        .iter()
        .map(|j| {
            let targets = j["static_configs"]
                .as_vec()
                .into_iter()
                .flatten()
                .flat_map(|c| strings(&c["targets"]))
                .collect();
            (
                j["job_name"].as_str().expect("job_name").to_owned(),
                targets,
            )
        })
        .collect();
    for (service, binary, port) in stages {
        let job = JOBS
            .iter()
            .find(|(b, _)| b == binary)
            .map(|(_, j)| *j)
            .unwrap_or_else(|| panic!("{binary}: which Prometheus job? (tests/deploy/compose.rs)"));
        let target = format!("{service}:{port}");
        assert!(
            jobs.iter().any(|(j, t)| j == job && t.contains(&target)),
            "deploy/prometheus/prometheus.yml: job {job} does not scrape {target} (--metrics-addr of {service}): {jobs:?}"
        );
    }

    let grafana = services
        .iter()
        .find(|s| s.name == "grafana")
        .expect("a grafana service");
    let dashboard = grafana
        .volumes()
        .into_iter()
        .find(|(source, _)| source == "./deploy/grafana/price-alerts.json")
        .map(|(_, target)| target)
        .expect("grafana mounts deploy/grafana/price-alerts.json");
    let provider = files::load("deploy/grafana/provisioning/dashboards/price-alerts.yml").remove(0);
    let folder = provider["providers"][0]["options"]["path"]
        .as_str()
        .expect("the dashboards' folder");
    assert_eq!(
        Path::new(&dashboard).parent(),
        Some(Path::new(folder)),
        "grafana provisions the folder the dashboard is mounted in"
    );
    assert!(
        grafana
            .volumes()
            .iter()
            .any(|(s, t)| s == "./deploy/grafana/provisioning" && t == "/etc/grafana/provisioning"),
        "grafana reads deploy/grafana/provisioning"
    );
    let source = files::load("deploy/grafana/provisioning/datasources/prometheus.yml").remove(0);
    assert_eq!(
        source["datasources"][0]["url"].as_str(),
        Some("http://prometheus:9090"),
        "grafana's data source is the prometheus service"
    );
}

/// The services agree with each other: the deliverer calls what the receiver serves, the tick
/// stream goes where the pipeline reads with its partition count, its alerts are the rules it
/// was generated for.
pub fn check_wiring(parsed: &[(ComposeService, Parsed)]) {
    let one = |binary: &str| -> Vec<&(ComposeService, Parsed)> {
        parsed
            .iter()
            .filter(|(s, _)| s.binary.as_deref() == Some(binary))
            .collect()
    };
    // alert-deliver's subscribers are the receiver's paths.
    let [(deliver, deliver_args)] = one("alert-deliver")[..] else {
        panic!("{COMPOSE}: one alert-deliver service")
    };
    let [(webhook, receiver)] = one("test-subscriber")[..] else {
        panic!("{COMPOSE}: one webhook receiver (test-subscriber)")
    };
    let file = deliver_args
        .subscriptions
        .as_ref()
        .expect("--subscriptions");
    let host = deliver.host_path_of(file).unwrap_or_else(|| {
        panic!(
            "{COMPOSE}: {}: --subscriptions {} is not a file of the repository mounted there",
            deliver.name,
            file.display()
        )
    });
    let subscriptions = price_alerts::deliver::subscriptions::Subscriptions::load(&host)
        .unwrap_or_else(|e| panic!("{}: {e}", host.display()));
    let port = receiver.listen.expect("--listen").port();
    for s in subscriptions.iter() {
        assert_eq!(
            s.url.as_str(),
            format!("http://{}:{port}/hook/{}", webhook.name, s.name),
            "{}: subscriber {}'s URL is not the receiver's path for it",
            host.display(),
            s.name
        );
        assert!(
            receiver.subscribers.contains(&s.name),
            "{COMPOSE}: {} serves no subscriber {}",
            webhook.name,
            s.name
        );
    }

    // The ticks: where the pipeline reads, with the partitions it would create; the alerts loaded
    // are the rules of the same symbols and seed.
    let [(_, pipeline)] = one("alert-pipeline")[..] else {
        panic!("{COMPOSE}: one alert-pipeline service")
    };
    let stage = pipeline.stage.as_ref().expect("a stage");
    let ticks = one("tick-gen");
    let sender = ticks
        .iter()
        .find(|(_, p)| !p.rules_only)
        .unwrap_or_else(|| panic!("{COMPOSE}: a tick-gen service that sends ticks"));
    assert_eq!(sender.1.topic, stage.input, "{}: the topic", sender.0.name);
    assert_eq!(
        sender.1.partitions, stage.partitions,
        "{}: the partitions",
        sender.0.name
    );
    let rules = ticks
        .iter()
        .find(|(_, p)| p.rules_only)
        .unwrap_or_else(|| panic!("{COMPOSE}: a tick-gen service that writes the rules"));
    assert_eq!(
        rules.1.generated, sender.1.generated,
        "{}: the rules of other symbols or another seed than {}'s ticks",
        rules.0.name, sender.0.name
    );
    let out = rules.1.rules_out.as_ref().expect("--rules-out");
    let [(loader, load)] = one("alert-rules")
        .into_iter()
        .filter(|(_, p)| p.loads.is_some())
        .collect::<Vec<_>>()[..]
    else {
        panic!("{COMPOSE}: one alert-rules service that loads the tick rules")
    };
    assert_eq!(
        load.loads.as_ref(),
        Some(out),
        "{}: the file it loads",
        loader.name
    );
    assert_eq!(
        rules.0.volume_of(out),
        loader.volume_of(out),
        "{} and {} share the rules file's volume",
        rules.0.name,
        loader.name
    );
    assert!(
        rules.0.volume_of(out).is_some(),
        "{}: the rules go to a volume",
        rules.0.name
    );
}

/// Dependencies and volumes are declared, the one-shot services end, and a service every `up`
/// starts depends on none that a profile leaves out.
pub fn check_structure(services: &[ComposeService]) {
    let doc = files::compose();
    let names: BTreeSet<&str> = services.iter().map(|s| s.name.as_str()).collect();
    let volumes: BTreeSet<String> = entries(&doc["volumes"])
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    for s in services {
        let at = format!("{COMPOSE}: {}", s.name);
        let depends: Vec<String> = match &s.raw["depends_on"] {
            Yaml::Array(_) => strings(&s.raw["depends_on"]),
            h => entries(h).into_iter().map(|(k, _)| k).collect(),
        };
        for d in depends {
            assert!(
                names.contains(d.as_str()),
                "{at}: depends on {d}, which is no service"
            );
            let other = services.iter().find(|o| o.name == d).expect("found");
            if s.profiles().is_empty() {
                assert!(
                    other.profiles().is_empty(),
                    "{at}: starts with every up but depends on {d}, of profiles {:?}",
                    other.profiles()
                );
            }
        }
        for (source, target) in s.volumes() {
            if let Some(path) = source.strip_prefix("./") {
                assert!(
                    repo(path).exists(),
                    "{at}: mounts {source} at {target}: no such path"
                );
            } else {
                assert!(
                    volumes.contains(&source),
                    "{at}: volume {source} is not declared"
                );
            }
        }
        // The schema takes any string here; docker refuses all but these at `up`.
        if let Some(restart) = s.raw["restart"].as_str() {
            let known = matches!(restart, "no" | "always" | "unless-stopped" | "on-failure")
                || restart
                    .strip_prefix("on-failure:")
                    .is_some_and(|n| n.parse::<u32>().is_ok());
            assert!(known, "{at}: restart: {restart} is no restart policy");
        }
        if s.binary.as_deref().and_then(binaries::role) == Some(Role::Service) {
            assert!(
                s.profiles().is_empty(),
                "{at}: a stage starts with every up"
            );
        }
    }
}

/// The `secrets` service (deploy/compose/secrets.sh) makes the files alert-sink reads, in the
/// volume alert-sink mounts them from, owner-only and owned by the image's user.
pub fn check_secret_maker(services: &[ComposeService], sink: &ComposeService, files: &[PathBuf]) {
    let maker = services
        .iter()
        .find(|s| s.binary.as_deref() == Some("sh"))
        .unwrap_or_else(|| panic!("{COMPOSE}: no secrets service (sh deploy/compose/secrets.sh)"));
    let script = maker
        .args
        .first()
        .and_then(|a| maker.host_path_of(Path::new(a)))
        .unwrap_or_else(|| panic!("{COMPOSE}: {}: its script is not mounted", maker.name));
    let text = std::fs::read_to_string(&script).expect("the script");
    let at = script.display();
    let dir = text
        .lines()
        .find_map(|l| l.strip_prefix("dir="))
        .unwrap_or_else(|| panic!("{at}: no dir="));
    assert!(
        text.contains("umask 077") && text.contains("chmod 600"),
        "{at}: mode 600"
    );
    assert!(
        text.contains("chown 10001:10001"),
        "{at}: the image user's files"
    );
    let written = maker
        .volume_of(Path::new(dir))
        .unwrap_or_else(|| panic!("{COMPOSE}: {} writes {dir}, which is no volume", maker.name));
    for file in files {
        let volume = sink.volume_of(file).unwrap_or_else(|| {
            panic!(
                "{COMPOSE}: {} reads {} from no volume",
                sink.name,
                file.display()
            )
        });
        assert_eq!(
            volume,
            written,
            "{COMPOSE}: {} reads {} from another volume than the secrets'",
            sink.name,
            file.display()
        );
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a file name");
        assert!(
            text.contains(&format!("$dir/{name}")),
            "{at}: makes no {name}"
        );
    }
}
