-- Where each sink group has stored everything up to, per notifications partition: the next offset
-- to read. Written in the same transaction as the rows of the batch, so the rows and the position
-- commit together or not at all; on assignment the sink starts here (this table is the truth, the
-- Kafka group's committed offsets are only for lag monitoring). Updates keep the larger value
-- (GREATEST), so a late write of an instance that lost the partition never moves it back.
CREATE TABLE sink_offsets (
    consumer_group  text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition integer     NOT NULL CHECK (kafka_partition >= 0),
    next_offset     bigint      NOT NULL CHECK (next_offset >= 0),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, kafka_partition)
);
