//! One rule for every kind's status conditions, as Stackable's operator-rs
//! `status::condition` keeps it: a condition carries the generation it was
//! computed for, and its `lastTransitionTime` moves only when its status
//! flips, so an unchanged status is written as it was (and not at all).
//! Which conditions a kind has and when each is True is the kind's own
//! decision (its status module); how a condition is stamped is this one.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{Timestamp, Unit};

/// The condition `type_`, True when `ok`, for the object at `generation`:
/// its transition time kept from `previous` (the conditions last written)
/// while its status there is the same, else `now` (to the second, as the API
/// server stores it).
pub fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    previous: &[Condition],
    now: Timestamp,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let since = previous
        .iter()
        .find(|c| c.type_ == type_)
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(now.round(Unit::Second).unwrap_or(now)));
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: since,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("in range")
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_flips() {
        let first = condition(
            "Ready",
            false,
            "NodesPending",
            "0/2".into(),
            Some(1),
            &[],
            at(100),
        );
        assert_eq!(first.last_transition_time, Time(at(100)));
        assert_eq!(
            (first.status.as_str(), first.observed_generation),
            ("False", Some(1))
        );
        // Same status, new message and generation: the time stays.
        let same = condition(
            "Ready",
            false,
            "NodesPending",
            "1/2".into(),
            Some(2),
            std::slice::from_ref(&first),
            at(200),
        );
        assert_eq!(same.last_transition_time, Time(at(100)));
        assert_eq!(
            (same.message.as_str(), same.observed_generation),
            ("1/2", Some(2))
        );
        // A flip stamps now, to the second.
        let now = at(300)
            .checked_add(k8s_openapi::jiff::SignedDuration::from_millis(400))
            .expect("in range");
        let flipped = condition(
            "Ready",
            true,
            "AllUpToDate",
            String::new(),
            Some(2),
            &[same],
            now,
        );
        assert_eq!(
            (
                flipped.status.as_str(),
                flipped.last_transition_time.clone()
            ),
            ("True", Time(at(300)))
        );
        // Another type's history is not this one's.
        let other = condition(
            "Paused",
            false,
            "Running",
            String::new(),
            Some(2),
            &[flipped],
            at(400),
        );
        assert_eq!(other.last_transition_time, Time(at(400)));
    }
}
