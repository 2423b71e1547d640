-- Records that can never be stored (not a notification, or refused by a constraint), written in
-- the same transaction as the offset that moves past them. Keyed by where the record was read, so
-- a redo stores each dead letter once.
CREATE TABLE sink_dead_letters (
    origin_topic     text        NOT NULL,
    origin_partition integer     NOT NULL,
    origin_offset    bigint      NOT NULL,
    consumer_group   text        NOT NULL,
    -- permanent.not_json, permanent.not_notification, permanent.constraint, ...
    error_class      text        NOT NULL,
    -- Short and sanitized; never the payload.
    error_message    text        NOT NULL CHECK (octet_length(error_message) <= 256),
    -- The record as it was: key, value and headers ([[key, value], ...]) untouched.
    record_key       bytea,
    record_value     bytea,
    record_headers   jsonb       NOT NULL DEFAULT '[]',
    record_timestamp timestamptz,
    service          text        NOT NULL,
    service_version  text        NOT NULL,
    failed_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (origin_topic, origin_partition, origin_offset)
);
