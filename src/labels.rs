//! Label values that records and metrics share: the dead-letter classes (the `dlq.error.class`
//! header and the metrics' `class` label) and the class of injected failures. A leaf, so that
//! [`crate::metrics`] can register every series at zero without importing the failure path
//! ([`crate::dlq`], which counts into the metrics).

/// Every dead-letter class: the `dlq.error.class` header values and the metrics' `class` label.
pub const CLASSES: &[&str] = &[
    "permanent.oversize",
    "permanent.empty",
    "permanent.not_utf8",
    "permanent.not_json",
    "permanent.wrong_type",
    "permanent.missing_field",
    "permanent.bad_decimal",
    "permanent.non_positive_price",
    "permanent.bad_symbol",
    "permanent.bad_timestamp",
    "poison",
    "transient.exhausted",
    // alert-deliver (crate::deliver): a (notification, subscriber) that could not be delivered.
    "delivery.permanent",
    "delivery.transient.exhausted",
    "delivery.gone",
    "delivery.bad_record",
    "delivery.unknown_subscriber",
];

/// Class of the failures that fault injection makes.
pub const INJECTED: &str = "injected";
