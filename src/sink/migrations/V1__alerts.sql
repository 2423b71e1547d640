-- One row per notification: the notification id is the primary key, so storing the same
-- notification again (a redo after a crash or a rebalance) is a no-op (INSERT ... ON CONFLICT DO
-- NOTHING). Prices and thresholds are numeric: exact decimals, never floats.
CREATE TABLE alerts (
    -- symbol:seq:threshold:direction, as in the notification.
    id                     text        PRIMARY KEY,
    symbol                 text        NOT NULL CHECK (symbol ~ '^[A-Z0-9._-]{1,32}$'),
    threshold              numeric     NOT NULL,
    direction              text        NOT NULL CHECK (direction IN ('up', 'down')),
    price                  numeric     NOT NULL CHECK (price > 0),
    previous_price         numeric     NOT NULL CHECK (previous_price > 0),
    seq                    bigint      NOT NULL CHECK (seq >= 0),
    -- The tick's own timestamp (or its record timestamp when it had none).
    tick_ts                timestamptz NOT NULL,
    -- Where the tick behind the notification was read (the notification's `source`).
    source_topic           text        NOT NULL,
    source_partition       integer     NOT NULL CHECK (source_partition >= 0),
    source_offset          bigint      NOT NULL CHECK (source_offset >= 0),
    -- Where the sink read the notification.
    notification_topic     text        NOT NULL,
    notification_partition integer     NOT NULL,
    notification_offset    bigint      NOT NULL,
    inserted_at            timestamptz NOT NULL DEFAULT now()
);

-- "Which alerts fired for BBCA today?"
CREATE INDEX alerts_symbol_tick_ts ON alerts (symbol, tick_ts);
