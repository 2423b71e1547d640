//! Which dead letters a replay or an inspection takes: by class, subscriber (the delivery DLQ's
//! `retry.subscriber`), DLQ partition and DLQ offset range. Pure, no I/O.
//!
//! A class filter is checked against [`dlq::CLASSES`] before anything is read: a misspelt class
//! (`nonsense.class`, `Poison`) or a prefix that matches no class (`nonsense.*`) selects nothing,
//! and a run that selects nothing by mistake looks like a run that found nothing to do. It is
//! refused instead, with the list of the classes there are.
//!
//! Partitions and offsets are the dead letter's own coordinates in the DLQ (what `inspect --show`
//! prints and what the replay ledger is keyed by), not the coordinates of the failed tick in its
//! source topic (`dlq.original.*`): they are unique per dead letter, and they are what Kafka's own
//! tools show.

use crate::dlq;

/// Why a selection is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("unknown class {given:?}; known classes: {}", known.join(", "))]
    UnknownClass {
        given: String,
        known: &'static [&'static str],
    },
    #[error("class pattern {given:?} matches no known class; known classes: {}", known.join(", "))]
    NoClassMatches {
        given: String,
        known: &'static [&'static str],
    },
    #[error("the offset range is empty: --from-offset {from} is past --to-offset {to}")]
    EmptyRange { from: i64, to: i64 },
    #[error("partition {partition} does not exist: {topic} has {count} partitions")]
    NoSuchPartition {
        partition: i32,
        topic: String,
        count: i32,
    },
}

/// A filter over dead letters; the default selects every one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Class patterns: a class, or a prefix ending in `*` (`permanent.*`); empty: every class.
    classes: Vec<String>,
    /// Subscribers (`retry.subscriber` of alert-deliver's dead letters); empty: any, or none.
    subscribers: Vec<String>,
    /// DLQ partitions; empty: every partition.
    partitions: Vec<i32>,
    /// Smallest DLQ offset taken in each selected partition.
    from_offset: Option<i64>,
    /// Largest DLQ offset taken in each selected partition (inclusive).
    to_offset: Option<i64>,
}

impl Selection {
    /// Every dead letter.
    pub fn all() -> Self {
        Selection::default()
    }

    /// The dead letters of `classes` (all when empty); each must be a known class or a prefix
    /// pattern that matches at least one.
    pub fn classes(classes: &[String]) -> Result<Self, SelectError> {
        for given in classes {
            let known = dlq::CLASSES;
            match given.strip_suffix('*') {
                Some(prefix) if !known.iter().any(|c| c.starts_with(prefix)) => {
                    return Err(SelectError::NoClassMatches {
                        given: given.clone(),
                        known,
                    });
                }
                None if !known.contains(&given.as_str()) => {
                    return Err(SelectError::UnknownClass {
                        given: given.clone(),
                        known,
                    });
                }
                _ => {}
            }
        }
        Ok(Selection {
            classes: classes.to_vec(),
            ..Selection::default()
        })
    }

    /// Only the dead letters of these subscribers (all when empty); a dead letter without a
    /// subscriber (a tick's) is not selected by a subscriber filter.
    pub fn for_subscribers(self, subscribers: &[String]) -> Self {
        Selection {
            subscribers: subscribers.to_vec(),
            ..self
        }
    }

    /// Only these DLQ partitions (all when empty).
    pub fn in_partitions(self, partitions: &[i32]) -> Self {
        let mut partitions = partitions.to_vec();
        partitions.sort_unstable();
        partitions.dedup();
        Selection { partitions, ..self }
    }

    /// Only DLQ offsets from `from` to `to`, both inclusive, in every selected partition.
    pub fn in_offsets(self, from: Option<i64>, to: Option<i64>) -> Result<Self, SelectError> {
        if let (Some(from), Some(to)) = (from, to) {
            if from > to {
                return Err(SelectError::EmptyRange { from, to });
            }
        }
        Ok(Selection {
            from_offset: from,
            to_offset: to,
            ..self
        })
    }

    /// Whether `class` is selected.
    pub fn class(&self, class: &str) -> bool {
        self.classes.is_empty()
            || self.classes.iter().any(|f| match f.strip_suffix('*') {
                Some(prefix) => class.starts_with(prefix),
                None => f == class,
            })
    }

    /// Whether the dead letter at DLQ `partition`/`offset` of `class` (for `subscriber`) is selected.
    pub fn matches(
        &self,
        partition: i32,
        offset: i64,
        class: &str,
        subscriber: Option<&str>,
    ) -> bool {
        (self.partitions.is_empty() || self.partitions.contains(&partition))
            && (self.subscribers.is_empty()
                || subscriber.is_some_and(|s| self.subscribers.iter().any(|x| x == s)))
            && !matches!(self.from_offset, Some(from) if offset < from)
            && !matches!(self.to_offset, Some(to) if offset > to)
            && self.class(class)
    }

    /// The partitions to read of `topic`, which has `count`: the selected ones, each checked.
    pub fn partitions_of(&self, topic: &str, count: i32) -> Result<Vec<i32>, SelectError> {
        if self.partitions.is_empty() {
            return Ok((0..count).collect());
        }
        match self.partitions.iter().find(|&&p| p < 0 || p >= count) {
            Some(&partition) => Err(SelectError::NoSuchPartition {
                partition,
                topic: topic.to_owned(),
                count,
            }),
            None => Ok(self.partitions.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes(v: &[&str]) -> Result<Selection, SelectError> {
        Selection::classes(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn class_patterns() {
        assert!(Selection::all().class("poison"));
        let poison = classes(&["poison"]).unwrap();
        assert!(poison.class("poison") && !poison.class("permanent.not_json"));
        let permanent = classes(&["permanent.*"]).unwrap();
        assert!(permanent.class("permanent.not_json") && !permanent.class("transient.exhausted"));
        assert!(classes(&["transient.exhausted", "poison"])
            .unwrap()
            .class("poison"));
        assert!(classes(&["*"]).unwrap().class("transient.exhausted"));
    }

    #[test]
    fn unknown_classes_are_refused_with_the_known_ones() {
        let err = classes(&["poison", "nonsense.class"]).unwrap_err();
        assert!(
            matches!(&err, SelectError::UnknownClass { given, .. } if given == "nonsense.class")
        );
        let msg = err.to_string();
        assert!(dlq::CLASSES.iter().all(|c| msg.contains(c)), "{msg}");
        assert!(matches!(
            classes(&["nonsense.*"]),
            Err(SelectError::NoClassMatches { .. })
        ));
        assert!(
            matches!(classes(&["Poison"]), Err(SelectError::UnknownClass { .. })),
            "case matters"
        );
        assert!(
            matches!(
                classes(&["permanent."]),
                Err(SelectError::UnknownClass { .. })
            ),
            "a prefix needs its *"
        );
    }

    #[test]
    fn partitions_and_offsets() {
        let s = Selection::all()
            .in_partitions(&[1])
            .in_offsets(Some(2), Some(3))
            .unwrap();
        assert!(!s.matches(0, 2, "poison", None));
        assert!(!s.matches(1, 1, "poison", None));
        assert!(
            s.matches(1, 2, "poison", None) && s.matches(1, 3, "poison", None),
            "both ends inclusive"
        );
        assert!(!s.matches(1, 4, "poison", None));
        assert_eq!(s.partitions_of("d", 2).unwrap(), [1]);
        assert!(matches!(
            s.partitions_of("d", 1),
            Err(SelectError::NoSuchPartition { partition: 1, .. })
        ));
        assert_eq!(Selection::all().partitions_of("d", 3).unwrap(), [0, 1, 2]);
        assert!(matches!(
            Selection::all().in_offsets(Some(5), Some(4)),
            Err(SelectError::EmptyRange { .. })
        ));
        let from = Selection::all().in_offsets(Some(5), None).unwrap();
        assert!(!from.matches(0, 4, "poison", None) && from.matches(7, 5, "poison", None));
        let desk = Selection::all().for_subscribers(&["desk".to_owned()]);
        assert!(desk.matches(0, 0, "delivery.permanent", Some("desk")));
        assert!(!desk.matches(0, 0, "delivery.permanent", Some("other")));
        assert!(
            !desk.matches(0, 0, "poison", None),
            "a tick's dead letter has no subscriber"
        );
        assert!(Selection::all().matches(0, 0, "poison", None));
    }
}
