//! Writing one batch: its rows, its dead letters and the offsets past it, in ONE database
//! transaction, so they commit together or not at all.
//!
//! ```text
//!  BEGIN
//!    INSERT INTO alerts SELECT … FROM UNNEST($1::text[], …) ON CONFLICT (id) DO NOTHING
//!    INSERT INTO sink_dead_letters SELECT … FROM UNNEST(…)   ON CONFLICT (origin…) DO NOTHING
//!    INSERT INTO sink_offsets SELECT … FROM UNNEST(…)
//!      ON CONFLICT (consumer_group, topic, kafka_partition)
//!      DO UPDATE SET next_offset = GREATEST(sink_offsets.next_offset, EXCLUDED.next_offset)
//!  COMMIT
//! ```
//! Three statements whatever the batch size, pipelined on the connection: three round trips per
//! batch (BEGIN, the statements, COMMIT), not one per row.
//!
//! # Why a redo is harmless, and why the offsets never move back
//! Every row and dead letter has a primary key taken from the record (notification id; origin
//! topic/partition/offset), so writing a record twice stores it once. A batch of partition p holds
//! every record from the position its instance started p at (the stored offset when it was
//! assigned p) onwards, so whatever offset a batch stores, every record below it is stored too.
//! When an instance A writes p after B has taken p over (A's revoke lost, or A paused and resumed
//! late), A's rows conflict with B's or fill in the same ids, and `GREATEST` keeps B's larger
//! offset: p's offset only ever moves forward, and only past stored records.
//!
//! Row locks are taken in one order by every writer (rows sorted by id, then dead letters by
//! origin, then offsets by partition), so two instances writing the same partition during a
//! handover wait for each other instead of deadlocking.
//!
//! # Refused rows
//! If the database refuses the batch's data (SQLSTATE class 22 or 23, what Rust could not check
//! beforehand), the batch is written again row by row, each row under a savepoint: the refused rows
//! become dead letters and the rest is stored, still in one transaction with the offsets.

use super::db::{classify, DbError};
use super::options::{HoldAt, TestHold};
use super::record::{AlertRow, DeadLetter, RawRecord, RecordError};
use std::collections::BTreeMap;
use tokio_postgres::{Client, Statement};
use tracing::warn;

const INSERT_ALERTS: &str = "
INSERT INTO alerts (id, symbol, threshold, direction, price, previous_price, seq, tick_ts,
                    source_topic, source_partition, source_offset,
                    notification_topic, notification_partition, notification_offset)
SELECT id, symbol, threshold, direction, price, previous_price, seq, tick_ts,
       source_topic, source_partition, source_offset, $12, notification_partition, notification_offset
FROM UNNEST($1::text[], $2::text[], $3::numeric[], $4::text[], $5::numeric[], $6::numeric[], $7::int8[],
            $8::timestamptz[], $9::text[], $10::int4[], $11::int8[], $13::int4[], $14::int8[])
     AS u(id, symbol, threshold, direction, price, previous_price, seq, tick_ts,
          source_topic, source_partition, source_offset, notification_partition, notification_offset)
ON CONFLICT (id) DO NOTHING";

const INSERT_DEAD_LETTERS: &str = "
INSERT INTO sink_dead_letters (origin_topic, origin_partition, origin_offset, consumer_group, error_class,
                               error_message, record_key, record_value, record_headers, record_timestamp,
                               service, service_version)
SELECT $1, p, o, $2, c, m, k, v, h, ts, $3, $4
FROM UNNEST($5::int4[], $6::int8[], $7::text[], $8::text[], $9::bytea[], $10::bytea[], $11::jsonb[],
            $12::timestamptz[]) AS u(p, o, c, m, k, v, h, ts)
ON CONFLICT (origin_topic, origin_partition, origin_offset) DO NOTHING";

const UPSERT_OFFSETS: &str = "
INSERT INTO sink_offsets (consumer_group, topic, kafka_partition, next_offset)
SELECT $1, $2, p, o FROM UNNEST($3::int4[], $4::int8[]) AS u(p, o)
ON CONFLICT (consumer_group, topic, kafka_partition)
DO UPDATE SET next_offset = GREATEST(sink_offsets.next_offset, EXCLUDED.next_offset), updated_at = now()";

const SELECT_OFFSETS: &str = "
SELECT kafka_partition, next_offset FROM sink_offsets WHERE consumer_group = $1 AND topic = $2";

/// How many times a batch is run again after a serialization failure or deadlock.
const RETRIES: u32 = 3;

/// What one batch holds.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    /// Rows to store, each with its record as it came (a refused row is dead-lettered with it).
    pub rows: Vec<(AlertRow, RawRecord)>,
    pub dead: Vec<DeadLetter>,
    /// The next offset to read per partition once this batch is stored.
    pub next_offsets: BTreeMap<i32, i64>,
}

impl Batch {
    pub fn records(&self) -> usize {
        self.rows.len() + self.dead.len()
    }

    /// Drops the records of `partitions`; returns how many.
    pub fn drop_partitions(&mut self, partitions: &[i32]) -> usize {
        let before = self.records();
        self.rows
            .retain(|(r, _)| !partitions.contains(&r.partition));
        self.dead.retain(|d| !partitions.contains(&d.partition));
        for p in partitions {
            self.next_offsets.remove(p);
        }
        before - self.records()
    }
}

/// What writing a batch did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Written {
    /// Rows new to the table.
    pub inserted: u64,
    /// Rows that were there already (a redo).
    pub conflicted: u64,
    /// Dead letters per class (those stored now, the refused rows included).
    pub dead_letters: BTreeMap<&'static str, u64>,
}

/// One connection and its prepared statements.
pub struct Store {
    client: Client,
    insert_alerts: Statement,
    insert_dead_letters: Statement,
    upsert_offsets: Statement,
    select_offsets: Statement,
}

fn err(e: tokio_postgres::Error) -> DbError {
    classify(&e)
}

impl Store {
    /// Prepares the statements on a connected client (the schema must be migrated).
    pub async fn new(client: Client) -> Result<Self, DbError> {
        let (a, d, u, s) = futures::try_join!(
            client.prepare(INSERT_ALERTS),
            client.prepare(INSERT_DEAD_LETTERS),
            client.prepare(UPSERT_OFFSETS),
            client.prepare(SELECT_OFFSETS),
        )
        .map_err(err)?;
        Ok(Store {
            client,
            insert_alerts: a,
            insert_dead_letters: d,
            upsert_offsets: u,
            select_offsets: s,
        })
    }

    /// The stored next offsets of `group` on `topic`, by partition.
    pub async fn offsets(&self, group: &str, topic: &str) -> Result<BTreeMap<i32, i64>, DbError> {
        let rows = self
            .client
            .query(&self.select_offsets, &[&group, &topic])
            .await
            .map_err(err)?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Writes `batch` in one transaction (see the module docs); `hold` is the test switch.
    pub async fn write(
        &mut self,
        group: &str,
        topic: &str,
        batch: &mut Batch,
        hold: Option<(&TestHold, u64)>,
    ) -> Result<Written, DbError> {
        batch.rows.sort_by(|a, b| a.0.id.cmp(&b.0.id));
        batch.dead.sort_by_key(|d| (d.partition, d.offset));
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.write_once(group, topic, batch, hold).await {
                Err(DbError::Retry(e)) if attempt <= RETRIES => {
                    warn!(attempt, error = %e, "batch conflicted; writing it again")
                }
                Err(DbError::Rejected { sqlstate, message }) => {
                    warn!(%sqlstate, error = %message, "the database refused rows of the batch; finding them one by one");
                    return self.write_row_by_row(group, topic, batch, hold).await;
                }
                other => return other,
            }
        }
    }

    async fn write_once(
        &mut self,
        group: &str,
        topic: &str,
        batch: &Batch,
        hold: Option<(&TestHold, u64)>,
    ) -> Result<Written, DbError> {
        let txn = self.client.transaction().await.map_err(err)?;
        let rows: Vec<&AlertRow> = batch.rows.iter().map(|(r, _)| r).collect();
        let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        let symbols: Vec<&str> = rows.iter().map(|r| r.symbol.as_str()).collect();
        let thresholds: Vec<_> = rows.iter().map(|r| r.threshold).collect();
        let directions: Vec<&str> = rows.iter().map(|r| r.direction.as_str()).collect();
        let prices: Vec<_> = rows.iter().map(|r| r.price).collect();
        let previous: Vec<_> = rows.iter().map(|r| r.previous_price).collect();
        let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
        let tick_ts: Vec<_> = rows.iter().map(|r| r.tick_ts).collect();
        let source_topics: Vec<&str> = rows.iter().map(|r| r.source_topic.as_str()).collect();
        let source_partitions: Vec<i32> = rows.iter().map(|r| r.source_partition).collect();
        let source_offsets: Vec<i64> = rows.iter().map(|r| r.source_offset).collect();
        let partitions: Vec<i32> = rows.iter().map(|r| r.partition).collect();
        let offsets: Vec<i64> = rows.iter().map(|r| r.offset).collect();
        let (off_p, off_o): (Vec<i32>, Vec<i64>) =
            batch.next_offsets.iter().map(|(p, o)| (*p, *o)).unzip();
        let d = DeadLetterColumns::of(&batch.dead);
        let alert_params: [&(dyn tokio_postgres::types::ToSql + Sync); 14] = [
            &ids,
            &symbols,
            &thresholds,
            &directions,
            &prices,
            &previous,
            &seqs,
            &tick_ts,
            &source_topics,
            &source_partitions,
            &source_offsets,
            &topic,
            &partitions,
            &offsets,
        ];
        let offset_params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&group, &topic, &off_p, &off_o];
        // Pipelined: the three statements go out together and run in this order. Every answer is
        // awaited and the first failing statement's error is the one reported: after a refused row
        // the later statements fail only with "transaction aborted" (25P02), which says nothing,
        // and which error a poll happens to see first is not guaranteed.
        let (alerts, dead, offsets) = futures::join!(
            txn.execute(&self.insert_alerts, &alert_params),
            d.insert(&txn, &self.insert_dead_letters, topic, group),
            txn.execute(&self.upsert_offsets, &offset_params),
        );
        let inserted = alerts.map_err(err)?;
        dead.map_err(err)?;
        offsets.map_err(err)?;
        hold_if(hold, HoldAt::InDbTxn, batch);
        txn.commit().await.map_err(err)?;
        let mut written = Written {
            inserted,
            conflicted: rows.len() as u64 - inserted,
            ..Written::default()
        };
        for dl in &batch.dead {
            *written.dead_letters.entry(dl.class).or_default() += 1;
        }
        Ok(written)
    }

    /// The batch again, each row under a savepoint: rows the database refuses become dead letters.
    async fn write_row_by_row(
        &mut self,
        group: &str,
        topic: &str,
        batch: &mut Batch,
        hold: Option<(&TestHold, u64)>,
    ) -> Result<Written, DbError> {
        // The batch itself changes only once this transaction has committed: after an outage
        // half-way, the same batch is written again whole.
        let mut txn = self.client.transaction().await.map_err(err)?;
        let mut written = Written::default();
        let mut dead = batch.dead.clone();
        let mut refused = Vec::new();
        for (i, (r, raw)) in batch.rows.iter().enumerate() {
            let sp = txn.savepoint("row").await.map_err(err)?;
            let result = sp
                .execute(
                    &self.insert_alerts,
                    &[
                        &[r.id.as_str()].as_slice(),
                        &[r.symbol.as_str()].as_slice(),
                        &[r.threshold].as_slice(),
                        &[r.direction.as_str()].as_slice(),
                        &[r.price].as_slice(),
                        &[r.previous_price].as_slice(),
                        &[r.seq].as_slice(),
                        &[r.tick_ts].as_slice(),
                        &[r.source_topic.as_str()].as_slice(),
                        &[r.source_partition].as_slice(),
                        &[r.source_offset].as_slice(),
                        &topic,
                        &[r.partition].as_slice(),
                        &[r.offset].as_slice(),
                    ],
                )
                .await;
            match result {
                Ok(n) => {
                    sp.commit().await.map_err(err)?;
                    written.inserted += n;
                    written.conflicted += 1 - n;
                }
                Err(e) => match classify(&e) {
                    DbError::Rejected { sqlstate, message } => {
                        sp.rollback().await.map_err(err)?;
                        let why = RecordError::Rejected {
                            sqlstate,
                            reason: message,
                        };
                        warn!(partition = r.partition, offset = r.offset, class = why.class(), error = %why, "notification dead-lettered");
                        dead.push(DeadLetter::new(r.partition, r.offset, raw.clone(), &why));
                        refused.push(i);
                    }
                    other => return Err(other),
                },
            }
        }
        dead.sort_by_key(|d| (d.partition, d.offset));
        let d = DeadLetterColumns::of(&dead);
        let (off_p, off_o): (Vec<i32>, Vec<i64>) =
            batch.next_offsets.iter().map(|(p, o)| (*p, *o)).unzip();
        d.insert(&txn, &self.insert_dead_letters, topic, group)
            .await
            .map_err(err)?;
        txn.execute(&self.upsert_offsets, &[&group, &topic, &off_p, &off_o])
            .await
            .map_err(err)?;
        hold_if(hold, HoldAt::InDbTxn, batch);
        txn.commit().await.map_err(err)?;
        for dl in &dead {
            *written.dead_letters.entry(dl.class).or_default() += 1;
        }
        for i in refused.into_iter().rev() {
            batch.rows.remove(i);
        }
        batch.dead = dead;
        Ok(written)
    }
}

/// The dead letters of a batch as column arrays.
struct DeadLetterColumns<'a> {
    partitions: Vec<i32>,
    offsets: Vec<i64>,
    classes: Vec<&'a str>,
    messages: Vec<&'a str>,
    keys: Vec<Option<&'a [u8]>>,
    values: Vec<Option<&'a [u8]>>,
    headers: Vec<&'a serde_json::Value>,
    timestamps: Vec<Option<time::OffsetDateTime>>,
}

impl<'a> DeadLetterColumns<'a> {
    fn of(dead: &'a [DeadLetter]) -> Self {
        DeadLetterColumns {
            partitions: dead.iter().map(|d| d.partition).collect(),
            offsets: dead.iter().map(|d| d.offset).collect(),
            classes: dead.iter().map(|d| d.class).collect(),
            messages: dead.iter().map(|d| d.message.as_str()).collect(),
            keys: dead.iter().map(|d| d.raw.key.as_deref()).collect(),
            values: dead.iter().map(|d| d.raw.value.as_deref()).collect(),
            headers: dead.iter().map(|d| &d.raw.headers).collect(),
            timestamps: dead.iter().map(|d| d.raw.timestamp).collect(),
        }
    }

    async fn insert(
        &self,
        txn: &tokio_postgres::Transaction<'_>,
        stmt: &Statement,
        topic: &str,
        group: &str,
    ) -> Result<u64, tokio_postgres::Error> {
        if self.partitions.is_empty() {
            return Ok(0);
        }
        txn.execute(
            stmt,
            &[
                &topic,
                &group,
                &crate::dlq::SERVICE,
                &crate::dlq::VERSION,
                &self.partitions,
                &self.offsets,
                &self.classes,
                &self.messages,
                &self.keys,
                &self.values,
                &self.headers,
                &self.timestamps,
            ],
        )
        .await
    }
}

/// TEST ONLY: writes the batch's offsets to the hold file and stops this thread for good, so the
/// test can SIGKILL the process at exactly this point. The loop beats no more: a test that does
/// not kill it sees the watchdog end it after its bound ([`super::run::watchdog_bound`]).
pub fn hold_if(hold: Option<(&TestHold, u64)>, at: HoldAt, batch: &Batch) {
    let Some((h, n)) = hold else { return };
    if h.at != at || h.batch != n {
        return;
    }
    let offsets: BTreeMap<String, i64> = batch
        .next_offsets
        .iter()
        .map(|(p, o)| (p.to_string(), *o))
        .collect();
    let tmp = h.file.with_extension("tmp");
    let body = serde_json::json!({ "at": format!("{at:?}"), "batch": n, "next_offsets": offsets });
    if std::fs::write(&tmp, body.to_string())
        .and_then(|()| std::fs::rename(&tmp, &h.file))
        .is_err()
    {
        tracing::error!(file = %h.file.display(), "test hold: cannot write the hold file");
    }
    tracing::error!(?at, batch = n, "test hold: stopped here until killed");
    loop {
        std::thread::park();
    }
}
