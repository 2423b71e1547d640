//! The start-up authorisation check: does this principal hold the rights the binary needs, and
//! if not, which one is missing, named as an operator grants it ("Write on Topic notifications").
//!
//! Without it a missing ACL shows up late and vague: a consumer that never gets records, a
//! transaction that aborts, librdkafka retrying for ever. Each binary states what it needs
//! ([`Needs`]) and [`check`] asks the broker, before anything is read or written:
//!
//! - topics: a metadata request per topic. Kafka answers TOPIC_AUTHORIZATION_FAILED when the
//!   principal may not even Describe the topic; since Read and Write each imply Describe, that
//!   means every right the binary needs on it is missing. (A principal that may Describe a topic
//!   through some other ACL but not Write it passes here; its first transaction then fails with
//!   TOPIC_AUTHORIZATION_FAILED, which the pipeline reports and retries like a Write revoked
//!   while running: see docs/security.md.)
//! - the consumer group: an OffsetFetch for the group (Describe on the group, implied by Read).
//! - the transactional id: `init_transactions` itself, which fails with
//!   TRANSACTIONAL_ID_AUTHORIZATION_FAILED; [`from_kafka_error`] names it.
//!
//! Unknown topics are not this check's business: the binaries create or refuse them themselves.

use super::config::KafkaConfig;
use super::logging::Logged;
use crate::backoff::Setbacks;
use rdkafka::client::Client;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, TopicPartitionList};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Bound on each broker round trip of the check.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// What a binary needs of the cluster.
#[derive(Debug, Clone, Default)]
pub struct Needs {
    /// Topics it reads (Read).
    pub read: Vec<String>,
    /// Topics it writes (Write).
    pub write: Vec<String>,
    /// The consumer group it reads with and commits to (Read).
    pub group: Option<String>,
}

/// One right the principal lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// Kafka's operation name: Read, Write, IdempotentWrite.
    pub operation: &'static str,
    /// Kafka's resource type: Topic, Group, TransactionalId, Cluster.
    pub resource: &'static str,
    pub name: String,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {} {}", self.operation, self.resource, self.name)
    }
}

/// The principal lacks rights: which, and who it is.
#[derive(Debug, Clone, thiserror::Error)]
pub struct AccessError {
    /// `User:<sasl.username>`, when SASL names one.
    pub principal: Option<String>,
    pub missing: Vec<Missing>,
}

impl fmt::Display for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rights: Vec<String> = self.missing.iter().map(Missing::to_string).collect();
        match &self.principal {
            Some(p) => write!(f, "not authorised: {p} lacks {}", rights.join(", "))?,
            None => write!(f, "not authorised: missing {}", rights.join(", "))?,
        }
        write!(
            f,
            " (docs/security.md lists each binary's ACLs; scripts/acls.sh applies them)"
        )
    }
}

impl AccessError {
    pub fn new(kafka: &KafkaConfig, missing: Vec<Missing>) -> Self {
        AccessError {
            principal: principal(kafka),
            missing,
        }
    }
}

/// The principal the broker sees, as far as the configuration tells: `User:<sasl.username>`
/// for SCRAM and PLAIN; for OAUTHBEARER with OIDC, `User:<sasl.oauthbearer.client.id>`. Kafka
/// takes an OAUTHBEARER principal from the token's `sub` claim (`sasl.oauthbearer.sub.claim.name`),
/// which holds the client id on the local broker and with most client-credentials set-ups; an
/// identity provider that puts another value there (Keycloak's `sub` is the service account's
/// user id) needs its broker to map another claim, or ACLs on that value.
pub fn principal(kafka: &KafkaConfig) -> Option<String> {
    let p = &kafka.properties;
    let oidc = p
        .get("sasl.oauthbearer.method")
        .is_some_and(|m| m.eq_ignore_ascii_case("oidc"));
    let name = if oidc {
        p.get("sasl.oauthbearer.client.id")
    } else {
        p.get("sasl.username")
    };
    name.map(|u| format!("User:{u}"))
}

/// Says that `right` was refused while running ("Write on Topic notifications"): one WARN line
/// naming the principal and the right, and one count of `alerts_not_authorised_total{right}`,
/// which the NotAuthorised alert watches. `what` says what the refusal cost ("transaction aborted
/// and input rewound"); the caller retries after `retry_in`, the `attempts`-th setback in a row.
/// The pipeline and alert-deliver say it alike (docs/security.md, "A right revoked while running").
pub fn say_refused(
    kafka: &KafkaConfig,
    right: &str,
    what: &str,
    attempts: u32,
    retry_in: Duration,
) {
    let principal = principal(kafka).unwrap_or_else(|| "this client".to_owned());
    crate::metrics::not_authorised(right);
    tracing::warn!(
        principal = %principal,
        right = %right,
        attempts,
        retry_in = ?retry_in,
        "not authorised: {what}; retrying until the right is granted"
    );
}

/// Rights refused to a client while it runs, said as [`say_refused`] says them but at most once
/// per back-off step however often the client reports them (a consumer reports a refused fetch
/// per partition and fetch, a refused commit per commit), and `authorised again` once each is
/// granted: for a loop that does not itself back off on a refusal because librdkafka retries
/// for it (alert-sink's consumer).
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    /// Per refused right: its setbacks in a row, and when it may be said again.
    refused: BTreeMap<String, (Setbacks, Instant)>,
}

impl Refusals {
    /// `right` was refused; `what` says what the refusal costs. Said when it is due; true when
    /// it was.
    pub fn refused(&mut self, kafka: &KafkaConfig, right: &str, what: &str) -> bool {
        let now = Instant::now();
        let (setbacks, due) = self
            .refused
            .entry(right.to_owned())
            .or_insert_with(|| (Setbacks::default(), now));
        if now < *due {
            tracing::debug!(right = %right, "not authorised (said already)");
            return false;
        }
        let retry_in = setbacks.set_back();
        *due = now + retry_in;
        say_refused(kafka, right, what, setbacks.in_a_row(), retry_in);
        true
    }

    /// `right` worked again: `authorised again` if it had been refused.
    pub fn granted(&mut self, right: &str, what: &str) {
        if let Some((setbacks, _)) = self.refused.remove(right) {
            tracing::info!(right = %right, after_refusals = setbacks.in_a_row(), "authorised again: {what}");
        }
    }

    /// Whether no right is refused.
    pub fn is_empty(&self) -> bool {
        self.refused.is_empty()
    }

    /// Whether `right` is refused now.
    #[cfg(test)]
    fn is_refused(&self, right: &str) -> bool {
        self.refused.contains_key(right)
    }

    /// Whether `right` is refused and due to be said again: when a caller that hears of it only
    /// once (a consumer reports a refused fetch once per partition, then waits) should ask.
    pub fn due(&self, right: &str) -> bool {
        self.refused
            .get(right)
            .is_some_and(|(_, due)| Instant::now() >= *due)
    }

    /// `right` could not be asked about: ask again after the current back-off step, unsaid.
    pub fn defer(&mut self, right: &str) {
        if let Some((setbacks, due)) = self.refused.get_mut(right) {
            *due = Instant::now() + crate::backoff::after(setbacks.in_a_row().max(1));
        }
    }
}

/// Bound on the metadata round trip that asks which of a consumer's topics the broker refuses:
/// short, since the consumer's loop waits for it.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How soon a refused fetch that could not be traced to its topic (the broker did not answer) is
/// traced again, while nothing arrives.
const TRACE_AGAIN: Duration = Duration::from_secs(5);

/// The Read rights a consumer needs while it runs (on each of its topics, on its group), watched
/// for the loop of a consumer that does not itself back off on a refusal because librdkafka
/// retries for it (alert-sink's, alert-deliver's): a right taken away is named with what it costs,
/// once per back-off step for as long as it lasts ([`Refusals`]), and `authorised again` once it
/// works.
///
/// librdkafka reports a refused fetch once per partition, without the topic, and then retries
/// silently until the right is back. So the loop asks the broker again each back-off step while
/// nothing arrives ([`ReadRights::recheck`]), and a consumer of several topics asks which one it
/// was: the broker says so for a principal that may not even Describe the topic ([`refused`]).
/// One that still may (Write implies Describe: alert-deliver's buckets with `retry-read` alone
/// taken away) cannot be told from a metadata request; the refusal is then named once, with the
/// topics that delivered nothing since (`Read on Topic a or b`), and `authorised again` when one
/// of them delivers a record.
pub struct ReadRights {
    kafka: KafkaConfig,
    topics: Vec<String>,
    group: String,
    /// What a refused fetch costs, and what a refused group costs ("nothing is stored …").
    costs: (&'static str, &'static str),
    state: std::sync::Mutex<ReadState>,
}

#[derive(Default)]
struct ReadState {
    refusals: Refusals,
    /// Since when a refused fetch has not been traced to its topic (several topics).
    untraced_since: Option<Instant>,
    /// When the broker was last asked about every topic, to trace a refused fetch.
    traced_at: Option<Instant>,
    /// When each topic last delivered a record.
    fetched_at: BTreeMap<String, Instant>,
    /// The refusals named by elimination: the right as said, and the topics it may be.
    guessed: Vec<(String, Vec<String>)>,
}

impl ReadRights {
    /// `topics` and `group` as the consumer reads them; `fetch_cost` and `group_cost` say what a
    /// refused Read on a topic and on the group cost.
    pub fn new(
        kafka: &KafkaConfig,
        topics: Vec<String>,
        group: &str,
        fetch_cost: &'static str,
        group_cost: &'static str,
    ) -> Self {
        ReadRights {
            kafka: kafka.clone(),
            topics,
            group: group.to_owned(),
            costs: (fetch_cost, group_cost),
            state: Default::default(),
        }
    }

    /// Whether `code` is a refused Read (on a topic or the group): for a context's error
    /// callback, which leaves the saying to [`ReadRights::on_error`] and logs it at debug.
    pub fn is_refusal(code: Option<RDKafkaErrorCode>) -> bool {
        matches!(
            code,
            Some(
                RDKafkaErrorCode::TopicAuthorizationFailed
                    | RDKafkaErrorCode::GroupAuthorizationFailed
            )
        )
    }

    /// A consumer error from the loop's poll: a refused Read is said (when due) and true is
    /// returned; anything else is the caller's. A refused fetch of a consumer of several topics
    /// is traced to its topic ([`ReadRights::recheck`]).
    pub fn on_error<C: ClientContext>(
        &self,
        client: &Client<C>,
        code: Option<RDKafkaErrorCode>,
    ) -> bool {
        match code {
            Some(RDKafkaErrorCode::TopicAuthorizationFailed) => {
                if let [topic] = self.topics.as_slice() {
                    self.topic_refused(topic);
                } else {
                    if let Ok(mut st) = self.state.lock() {
                        st.untraced_since.get_or_insert_with(Instant::now);
                    }
                    self.recheck(client);
                }
                true
            }
            Some(RDKafkaErrorCode::GroupAuthorizationFailed) => {
                self.group_refused();
                true
            }
            _ => false,
        }
    }

    /// Read on `topic` was refused (a fetch, or a commit's partition error).
    pub fn topic_refused(&self, topic: &str) {
        self.say(&Self::topic_right(topic), self.costs.0);
    }

    /// Read on the group was refused (a heartbeat, a commit).
    pub fn group_refused(&self) {
        self.say(&self.group_right(), self.costs.1);
    }

    /// A record of `topic` arrived: Read on it works.
    pub fn fetched(&self, topic: &str) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        let now = Instant::now();
        match st.fetched_at.get_mut(topic) {
            Some(at) => *at = now,
            None => {
                st.fetched_at.insert(topic.to_owned(), now);
            }
        }
        if st.refusals.is_empty() {
            // The common case, once per record: no right to format and look up.
            return;
        }
        st.refusals
            .granted(&Self::topic_right(topic), "records fetched");
        let (back, still): (Vec<_>, Vec<_>) = std::mem::take(&mut st.guessed)
            .into_iter()
            .partition(|(_, topics)| topics.iter().any(|t| t == topic));
        st.guessed = still;
        for (right, _) in back {
            st.refusals.granted(&right, "records fetched");
        }
    }

    /// The group answered (a commit went through, partitions were assigned): Read on it works.
    pub fn group_answered(&self, how: &str) {
        self.granted(&self.group_right(), how);
    }

    /// Nothing arrived: asks the broker about each topic whose refused Read is due to be said
    /// again, and about every topic while a refused fetch is untraced (at most once per
    /// [`TRACE_AGAIN`]); then says or clears each. The round stops at the first question the
    /// broker does not answer, so it blocks the loop for at most [`PROBE_TIMEOUT`] more than the
    /// answered ones.
    pub fn recheck<C: ClientContext>(&self, client: &Client<C>) {
        let (ask, since): (Vec<&String>, Option<Instant>) = {
            let Ok(mut st) = self.state.lock() else {
                return;
            };
            let trace = st.untraced_since.is_some()
                && st.traced_at.is_none_or(|at| at.elapsed() >= TRACE_AGAIN);
            if trace {
                st.traced_at = Some(Instant::now());
            }
            let ask = self
                .topics
                .iter()
                .filter(|t| trace || st.refusals.due(&Self::topic_right(t)))
                .collect();
            (ask, st.untraced_since.filter(|_| trace))
        };
        let mut traced = false;
        for topic in ask {
            let right = Self::topic_right(topic);
            match refused(client, topic, PROBE_TIMEOUT) {
                Ok(true) => {
                    traced = true;
                    self.topic_refused(topic);
                }
                Ok(false) => self.granted(&right, "the topic may be read again"),
                Err(e) => {
                    tracing::debug!(topic = %topic, error = format!("{e:#}"), "could not ask whether the topic is refused");
                    if let Ok(mut st) = self.state.lock() {
                        st.refusals.defer(&right);
                    }
                    return;
                }
            }
        }
        let Some(since) = since else {
            return;
        };
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        st.untraced_since = None;
        if traced {
            return;
        }
        // Describe is granted on each: the topics that delivered nothing since the refusal.
        let quiet: Vec<String> = self
            .topics
            .iter()
            .filter(|t| st.fetched_at.get(*t).is_none_or(|at| *at < since))
            .cloned()
            .collect();
        if quiet.is_empty() {
            return;
        }
        let right = format!("Read on Topic {}", quiet.join(" or "));
        st.refusals.refused(&self.kafka, &right, self.costs.0);
        if !st.guessed.iter().any(|(r, _)| *r == right) {
            st.guessed.push((right, quiet));
        }
    }

    fn topic_right(topic: &str) -> String {
        format!("Read on Topic {topic}")
    }

    fn group_right(&self) -> String {
        format!("Read on Group {}", self.group)
    }

    fn say(&self, right: &str, what: &str) {
        if let Ok(mut st) = self.state.lock() {
            st.refusals.refused(&self.kafka, right, what);
        }
    }

    fn granted(&self, right: &str, how: &str) {
        if let Ok(mut st) = self.state.lock() {
            st.refusals.granted(right, how);
        }
    }
}

/// [`check`] for async callers: on a blocking thread, since it waits on broker round trips.
pub async fn check_async(kafka: &KafkaConfig, needs: Needs) -> anyhow::Result<()> {
    let kafka = kafka.clone();
    tokio::task::spawn_blocking(move || check(&kafka, &needs))
        .await
        .map_err(|e| anyhow::anyhow!("the access check panicked: {e}"))?
}

/// Checks `needs` against the broker. Blocking. Returns every missing right at once, so one round
/// of ACL fixes is enough; other failures (no broker) are left to the connect check before it.
pub fn check(kafka: &KafkaConfig, needs: &Needs) -> anyhow::Result<()> {
    let client: BaseConsumer<Logged> = kafka.admin().create_with_context(Logged)?;
    let mut missing = Vec::new();
    let topics = needs
        .read
        .iter()
        .map(|t| ("Read", t))
        .chain(needs.write.iter().map(|t| ("Write", t)));
    for (operation, topic) in topics {
        if refused(client.client(), topic, CHECK_TIMEOUT)? {
            missing.push(Missing {
                operation,
                resource: "Topic",
                name: topic.clone(),
            });
        }
    }
    if let Some(group) = &needs.group {
        if group_denied(kafka, group, needs.read.first().map_or("-", String::as_str))? {
            missing.push(Missing {
                operation: "Read",
                resource: "Group",
                name: group.clone(),
            });
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(AccessError::new(kafka, missing).into())
}

/// Whether the broker refuses `client`'s principal even Describe on `topic` (so every other right
/// on it too): one metadata round trip, bounded by `timeout`.
pub fn refused<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<bool> {
    let metadata = client.fetch_metadata(Some(topic), timeout)?;
    Ok(metadata
        .topics()
        .iter()
        .any(|t| t.error() == Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED)))
}

/// Whether the broker refuses `kafka`'s principal the group `group` (read through `topic`), as
/// the start's check asks it: for a stage waiting to make its group consumer again after the
/// group was refused while it ran.
pub fn group_read_refused(kafka: &KafkaConfig, group: &str, topic: &str) -> anyhow::Result<bool> {
    group_denied(kafka, group, topic)
}

/// Whether the broker refuses the group: an OffsetFetch for it (any partition will do, the
/// group's authorisation comes first). librdkafka does not return the refusal from the call: it
/// reports FindCoordinator's GROUP_AUTHORIZATION_FAILED as an error event and retries, so the
/// call is repeated in short slices while the events are watched.
fn group_denied(kafka: &KafkaConfig, group: &str, topic: &str) -> anyhow::Result<bool> {
    let mut cfg = kafka.admin();
    cfg.set("group.id", group);
    // The check asks whether the group is refused, not for stable offsets: read_committed (the
    // default) makes the OffsetFetch wait while a transaction holds pending offsets for the group,
    // which is exactly the case of a restart after a crash mid-commit (the predecessor is fenced
    // only after this check), and the check would then wait its whole timeout.
    cfg.set("isolation.level", "read_uncommitted");
    let consumer: BaseConsumer<Denials> = cfg.create_with_context(Denials::default())?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let deadline = Instant::now() + CHECK_TIMEOUT;
    loop {
        let result = consumer.committed_offsets(tpl.clone(), Duration::from_millis(500));
        // Serve the error events queued meanwhile.
        let _ = consumer.poll(Duration::ZERO);
        let refused = |e: &KafkaError| {
            e.rdkafka_error_code() == Some(RDKafkaErrorCode::GroupAuthorizationFailed)
        };
        if result.as_ref().err().is_some_and(refused) || consumer.context().group_refused() {
            return Ok(true);
        }
        // Answered, or no answer in time: either way not a refusal this check can name.
        if result.is_ok() || Instant::now() >= deadline {
            return Ok(false);
        }
    }
}

/// A client context that notes a GROUP_AUTHORIZATION_FAILED error event (and logs the others).
/// librdkafka reports a refused FindCoordinator this way only, once per change of error.
#[derive(Default)]
pub(super) struct Denials {
    group_refused: AtomicBool,
}

impl Denials {
    pub(super) fn group_refused(&self) -> bool {
        self.group_refused.load(Ordering::Relaxed)
    }

    /// The group answered: a refusal noted before is over.
    pub(super) fn clear(&self) {
        self.group_refused.store(false, Ordering::Relaxed);
    }
}

impl ClientContext for Denials {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        super::logging::log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::GroupAuthorizationFailed) {
            // The check reports it, naming the group; no second line about it.
            self.group_refused.store(true, Ordering::Relaxed);
            return;
        }
        super::logging::error(&error, reason);
    }
}

impl ConsumerContext for Denials {}

/// The right a Kafka error says is missing, if it is a refused transactional id (named
/// `transactional_id`) or cluster right. (A refused topic has no name in a produce error; the
/// pipeline asks the broker instead, [`refused`].)
pub fn from_kafka_error(
    kafka: &KafkaConfig,
    err: &KafkaError,
    transactional_id: &str,
) -> Option<AccessError> {
    let missing = match err.rdkafka_error_code()? {
        RDKafkaErrorCode::TransactionalIdAuthorizationFailed => Missing {
            operation: "Write",
            resource: "TransactionalId",
            name: transactional_id.to_owned(),
        },
        RDKafkaErrorCode::ClusterAuthorizationFailed => Missing {
            operation: "IdempotentWrite",
            resource: "Cluster",
            name: "kafka-cluster".to_owned(),
        },
        _ => return None,
    };
    Some(AccessError::new(kafka, vec![missing]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_right_as_an_operator_grants_it() {
        let kafka = KafkaConfig::new("h:1")
            .with_overrides(&["sasl.username=pipeline"])
            .unwrap();
        let err = AccessError::new(
            &kafka,
            vec![
                Missing {
                    operation: "Write",
                    resource: "TransactionalId",
                    name: "price-alerts-0".into(),
                },
                Missing {
                    operation: "Read",
                    resource: "Group",
                    name: "price-alerts".into(),
                },
            ],
        );
        let text = err.to_string();
        assert!(
            text.starts_with("not authorised: User:pipeline lacks Write on TransactionalId price-alerts-0, Read on Group price-alerts"),
            "{text}"
        );
    }

    #[test]
    fn an_oidc_client_is_named_by_its_client_id() {
        let mut kafka = KafkaConfig::new("127.0.0.1:9092");
        for (k, v) in [
            ("sasl.mechanism", "OAUTHBEARER"),
            ("sasl.oauthbearer.method", "oidc"),
            ("sasl.oauthbearer.client.id", "pipeline"),
        ] {
            kafka.set(k, v).unwrap();
        }
        assert_eq!(principal(&kafka).as_deref(), Some("User:pipeline"));
        assert_eq!(principal(&KafkaConfig::new("127.0.0.1:9092")), None);
    }

    #[test]
    fn a_refusal_reported_per_fetch_is_said_once_per_backoff_step_until_granted() {
        let kafka = KafkaConfig::new("127.0.0.1:1");
        let mut r = Refusals::default();
        let right = "Read on Topic notifications";
        assert!(r.refused(&kafka, right, "fetches refused"));
        // The consumer reports it again at once (another partition, another fetch): not said.
        assert!(!r.refused(&kafka, right, "fetches refused"));
        assert!(r.is_refused(right));
        // Another right is its own.
        assert!(r.refused(&kafka, "Read on Group g", "commits refused"));
        // Due again after the first back-off step (100 ms).
        std::thread::sleep(crate::backoff::after(1) + Duration::from_millis(20));
        assert!(r.refused(&kafka, right, "fetches refused"));
        assert!(!r.refused(&kafka, right, "fetches refused"));
        assert!(!r.due(right));
        std::thread::sleep(crate::backoff::after(2) + Duration::from_millis(20));
        assert!(r.due(right));
        r.defer(right);
        assert!(!r.due(right) && r.is_refused(right));
        r.granted(right, "records fetched");
        assert!(!r.is_refused(right) && !r.due(right) && r.is_refused("Read on Group g"));
        // Refused again later: said at once, the back-off from its start.
        assert!(r.refused(&kafka, right, "fetches refused"));
    }
}
