//! The command line of `alert-rules`: manage live alerts while the pipeline runs.

use super::KafkaArgs;
use crate::rules::live::{parse_positive, Alert, FieldError, Watch};
use crate::tools::alerts::Request;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "alert-rules",
    version,
    about = "Put, delete, list and load live price alerts (the rules topic <app-id>-rules)"
)]
pub struct RulesArgs {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Application id of the pipeline: the rules topic is <app-id>-rules.
    #[arg(long, default_value = "price-alerts", global = true)]
    pub app_id: String,
    /// The rules topic, if not <app-id>-rules.
    #[arg(long, env = "RULES_TOPIC", global = true)]
    pub rules_topic: Option<String>,
    /// The input topic: a missing rules topic is created with its partition count.
    #[arg(long, default_value = "market-updates", global = true)]
    pub input: String,
    #[command(subcommand)]
    pub command: RulesCommand,
}

#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Creates or replaces one alert.
    Put(PutArgs),
    /// Deletes one alert.
    Delete {
        /// The alert's id.
        id: String,
    },
    /// Lists the alerts in force, as a table or as JSON.
    List {
        /// One JSON object per alert, in an array.
        #[arg(long)]
        json: bool,
    },
    /// Publishes a rules file (TOML: [symbols] SYMBOL = ["threshold", ...]): one alert per
    /// threshold, id <SYMBOL>-<threshold>, watching both directions.
    Load {
        file: PathBuf,
        /// Who the loaded alerts are for.
        #[arg(long)]
        subscriber: Option<String>,
        /// alert-deliver's subscriptions file: a subscriber it does not name is refused.
        #[arg(long)]
        subscriptions: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub struct PutArgs {
    /// The alert's id: 1 to 64 bytes of A-Z, a-z, 0-9, '.', '_', '-'.
    pub id: String,
    /// The symbol whose ticks it watches.
    #[arg(long)]
    pub symbol: String,
    /// The threshold, an exact decimal (e.g. 10000 or 9525.50).
    #[arg(long)]
    pub threshold: String,
    /// up, down or both.
    #[arg(long, default_value = "both")]
    pub direction: String,
    /// Who it is for: the name of a subscriber of alert-deliver.
    #[arg(long)]
    pub subscriber: Option<String>,
    /// Fires once, then is deleted.
    #[arg(long)]
    pub one_shot: bool,
    /// Re-arm band: after firing up it fires up again only once the price was below threshold -
    /// band (down: at or above threshold + band).
    #[arg(long)]
    pub rearm_band: Option<String>,
    /// alert-deliver's subscriptions file: a subscriber it does not name is refused.
    #[arg(long)]
    pub subscriptions: Option<PathBuf>,
}

impl PutArgs {
    /// The alert, every field checked; a refusal names the field.
    pub fn alert(&self) -> Result<Alert, FieldError> {
        let field = |field: &'static str, reason: String| FieldError { field, reason };
        let alert = Alert {
            symbol: self.symbol.clone(),
            threshold: parse_positive("threshold", &self.threshold, false)?,
            direction: Watch::parse(&self.direction).map_err(|r| field("direction", r))?,
            subscriber: self.subscriber.clone(),
            one_shot: self.one_shot,
            rearm_band: self
                .rearm_band
                .as_deref()
                .map(|b| parse_positive("rearm_band", b, true))
                .transpose()?
                .filter(|b| !b.is_zero()),
        };
        alert.check()?;
        Ok(alert)
    }
}

impl RulesArgs {
    /// What to do, refused (naming the field, or the subscriber the subscriptions file does not
    /// know) before anything is sent.
    pub fn request(&self) -> anyhow::Result<Request> {
        Ok(match &self.command {
            RulesCommand::Put(p) => {
                let alert = p.alert()?;
                check_subscriber(alert.subscriber.as_deref(), p.subscriptions.as_deref())?;
                Request::Put {
                    id: p.id.clone(),
                    alert,
                }
            }
            RulesCommand::Delete { id } => Request::Delete { id: id.clone() },
            RulesCommand::List { json } => Request::List { json: *json },
            RulesCommand::Load {
                file,
                subscriber,
                subscriptions,
            } => {
                check_subscriber(subscriber.as_deref(), subscriptions.as_deref())?;
                Request::Load {
                    file: file.clone(),
                    subscriber: subscriber.clone(),
                }
            }
        })
    }
}

/// Refuses a subscriber that the subscriptions file (if given) does not name.
pub fn check_subscriber(
    subscriber: Option<&str>,
    subscriptions: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let (Some(name), Some(path)) = (subscriber, subscriptions) else {
        return Ok(());
    };
    let subs = crate::deliver::subscriptions::Subscriptions::load(path)?;
    if subs.get(name).is_none() {
        let known: Vec<&str> = subs.iter().map(|s| s.name.as_str()).collect();
        anyhow::bail!(
            "subscriber: {name:?} is not in {} (known: {})",
            path.display(),
            known.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(args: &[&str]) -> Result<Alert, String> {
        let mut argv = vec!["alert-rules", "put"];
        argv.extend_from_slice(args);
        match RulesArgs::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            RulesCommand::Put(p) => p.alert().map_err(|e| e.to_string()),
            _ => unreachable!(),
        }
    }

    #[test]
    fn bad_input_is_refused_with_the_field() {
        assert!(put(&["a1", "--symbol", "BBCA", "--threshold", "10000"]).is_ok());
        assert!(put(&["a1", "--symbol", "BBCA", "--threshold", "ten"])
            .unwrap_err()
            .starts_with("threshold:"));
        assert!(put(&["a1", "--symbol", "BBCA", "--threshold=-5"])
            .unwrap_err()
            .starts_with("threshold:"));
        assert!(put(&["a1", "--symbol", "bbca", "--threshold", "5"])
            .unwrap_err()
            .starts_with("symbol:"));
        assert!(put(&[
            "a1",
            "--symbol",
            "BBCA",
            "--threshold",
            "5",
            "--direction",
            "sideways"
        ])
        .unwrap_err()
        .starts_with("direction: unknown direction"));
        assert!(put(&[
            "a1",
            "--symbol",
            "BBCA",
            "--threshold",
            "5",
            "--rearm-band",
            "x"
        ])
        .unwrap_err()
        .starts_with("rearm_band:"));
        let a = put(&[
            "a1",
            "--symbol",
            "BBCA",
            "--threshold",
            "9525.50",
            "--direction",
            "up",
            "--one-shot",
            "--rearm-band",
            "0",
        ])
        .unwrap();
        assert_eq!(a.threshold.to_string(), "9525.50");
        assert!(a.one_shot);
        assert_eq!(a.rearm_band, None, "a zero band is no band");
    }
}
