//! Partition lists: the `TopicPartitionList`s every other module builds, in one leaf that
//! imports nothing of the crate (so `offsets` and `read`, which both need them, need not import
//! each other).

use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

/// A list of `topic`'s `partitions`, without offsets.
pub fn partition_list(
    topic: &str,
    partitions: impl IntoIterator<Item = i32>,
) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition(topic, p);
    }
    tpl
}

/// A list of `topic`'s partitions, each at its offset.
pub fn position_list(
    topic: &str,
    positions: impl IntoIterator<Item = (i32, Offset)>,
) -> Result<TopicPartitionList, KafkaError> {
    let mut tpl = TopicPartitionList::new();
    for (p, at) in positions {
        tpl.add_partition_offset(topic, p, at)?;
    }
    Ok(tpl)
}

/// A list of partitions of any topics, each at its offset: `(topic, partition) -> offset`.
pub fn positions_list(
    positions: &std::collections::BTreeMap<(String, i32), i64>,
) -> Result<TopicPartitionList, KafkaError> {
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), offset) in positions {
        tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset))?;
    }
    Ok(tpl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_hold_what_they_were_given() {
        let tpl = partition_list("t", [2, 0]);
        let got: Vec<_> = tpl
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        assert_eq!(got, [("t".to_owned(), 2), ("t".to_owned(), 0)]);
        let tpl = position_list("t", [(1, Offset::Offset(7)), (3, Offset::Beginning)]).unwrap();
        assert_eq!(
            tpl.find_partition("t", 1).map(|e| e.offset()),
            Some(Offset::Offset(7))
        );
        assert_eq!(
            tpl.find_partition("t", 3).map(|e| e.offset()),
            Some(Offset::Beginning)
        );
    }
}
