//! The command line of `txn-demo`: the commit/abort experiment's flags. Here, not in the binary,
//! so that a test can ask the parser whether a command shown in the documents still parses
//! (`tests/docs.rs`).

use super::KafkaArgs;
use clap::Parser;

// No `///` on the struct: clap turns a struct's doc comment into help text, and the help is kept
// as it was.
#[derive(Parser)]
#[command(
    name = "txn-demo",
    version,
    about = "Kafka transactions: 5 committed versus 10 uncommitted readers"
)]
pub struct TxnDemoArgs {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Prefix of the run's topics and group (default: a fresh random one, so runs never mix).
    #[arg(long)]
    pub topic_prefix: Option<String>,
    /// Partitions of the input topic.
    #[arg(long, default_value_t = 3)]
    pub partitions: i32,
    /// Keep the run's topics instead of deleting them at the end.
    #[arg(long)]
    pub keep_topics: bool,
}
