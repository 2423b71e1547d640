//! Tools around the processor, each behind a thin binary:
//!
//! - [`demo`] (`txn-demo`): the commit/abort experiment, read_committed 5 versus
//!   read_uncommitted 10.
//! - [`generate`] (`tick-gen`): a seeded tick stream and the rules it was made for.
//! - [`verify`] (`alert-verify`) runs the oracle ([`crate::oracle`], below the stages, since
//!   alert-sink's table check shares its comparison): expected notifications against committed
//!   ones, in the notifications topic or alert-sink's table.
//! - [`replay`] (`dlq-replay`): dead letters back to their source topic, exactly once, with a
//!   replay ledger ([`crate::dlq::ledger`]); inspecting a DLQ.
//! - [`chaos`] (`alert-chaos`): pipeline instances and brokers of a 3-broker cluster killed,
//!   paused and bounced while a stream is processed, then exactly-once checked.
//! - [`subscriber`] (`test-subscriber`): local webhook receivers for alert-deliver that accept,
//!   fail for a while or answer a fixed status, counting by Idempotency-Key (the demo's part 4).
//! - [`token_endpoint`]: a local OIDC token endpoint (client credentials in, RS256 JWT out) for
//!   the OAUTHBEARER tests: short-lived, refused and bad tokens, and an endpoint that is down.

pub mod alerts;
pub mod chaos;
pub mod demo;
pub mod generate;
pub mod replay;
pub mod subscriber;
pub mod token_endpoint;
pub mod verify;
