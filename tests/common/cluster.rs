//! The local 3-broker cluster of the cluster tests (chaos, coordinator, restore, restore_leader):
//! its address, the script that controls its brokers, and signals to one broker's JVM.

use price_alerts::kafka::KafkaConfig;
use price_alerts::tools::chaos::cluster::{Cluster, DEFAULT_CLUSTER_BOOTSTRAP};
use std::path::PathBuf;
use std::process::Command;

/// The cluster at `KAFKA_CLUSTER_BOOTSTRAP` (default the local one), driven through this
/// checkout's scripts/kafka.sh, or `KAFKA_SH` (`CHAOS_KAFKA_SH` too, its older name): the script
/// of the checkout that started the brokers, when the tests run from another worktree (a script
/// controls only the brokers started from its own checkout: it recognises them by path).
pub fn cluster() -> Cluster {
    let bootstrap = std::env::var("KAFKA_CLUSTER_BOOTSTRAP")
        .unwrap_or_else(|_| DEFAULT_CLUSTER_BOOTSTRAP.to_owned());
    let kafka_sh = std::env::var_os("KAFKA_SH")
        .or_else(|| std::env::var_os("CHAOS_KAFKA_SH"))
        .map_or_else(
            || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka.sh")),
            PathBuf::from,
        );
    Cluster {
        kafka_sh,
        kafka: KafkaConfig::new(bootstrap),
        brokers: 3,
    }
}

/// One test at a time takes a broker of the shared cluster down (the tests of one binary run
/// on two threads): each holds this for its whole run.
pub fn cluster_to_myself() -> std::sync::MutexGuard<'static, ()> {
    static CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that failed while holding it has given the cluster back all the same.
    CLUSTER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The pid of broker `id`'s JVM (`scripts/kafka.sh broker K pid`), for a test that signals it
/// itself (a SIGSTOP, or a SIGKILL that must land within milliseconds of an event).
pub fn broker_pid(cluster: &Cluster, id: i32) -> u32 {
    let out = Command::new(&cluster.kafka_sh)
        .args(["broker", &id.to_string(), "pid"])
        .env("KAFKA_BROKERS", cluster.brokers.to_string())
        .output()
        .expect("running kafka.sh broker K pid");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| {
            panic!(
                "no pid for broker {id} from {} (is KAFKA_SH the script that started the cluster?): {}",
                cluster.kafka_sh.display(),
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// Sends signal `sig` (a name: STOP, CONT, KILL) to process `pid`.
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// Creates the one-partition compacted topic `name` (a changelog, as the pipeline's) with its
/// replicas on `replicas`, the first its preferred leader, and the topic configs `configs`.
pub fn create_changelog_on(
    kafka: &KafkaConfig,
    name: &str,
    replicas: &[i32],
    configs: &[(&str, &str)],
) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        kafka.admin().create().expect("admin client");
    let assignment = [replicas];
    let mut topic = NewTopic::new(name, 1, TopicReplication::Variable(&assignment))
        .set("cleanup.policy", "compact");
    for (k, v) in configs {
        topic = topic.set(k, v);
    }
    let results = futures::executor::block_on(admin.create_topics(
        [&topic],
        &AdminOptions::new().operation_timeout(Some(std::time::Duration::from_secs(30))),
    ))
    .expect("create_topics");
    for r in results {
        r.expect("changelog created");
    }
}
