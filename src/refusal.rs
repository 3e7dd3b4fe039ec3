//! What the cluster refuses about a policy it accepted (its DaemonSet apply
//! answered with a 4xx, a drain selector that does not parse): contained, not
//! retried in a hot loop. The policy is Degraded with the API server's words,
//! one Warning Event per distinct error, the apply is retried with an
//! exponential backoff (at once when the spec changes), and meanwhile the
//! policy claims and starts nothing while its nodes mid-cycle keep their
//! deadlines. Pure: the supervisor keeps one [`Refusal`] per policy.

use std::time::{Duration, Instant};

/// First wait after a refusal; doubled per refused attempt up to [`MAX_WAIT`].
pub const FIRST_WAIT: Duration = Duration::from_secs(5);
/// Longest wait between two attempts of the same spec.
pub const MAX_WAIT: Duration = Duration::from_secs(300);
/// Longest message kept from the API server (the field it names comes first).
pub const MAX_MESSAGE: usize = 512;

/// What holds a policy back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalKind {
    /// The cluster refuses it: an apply answered with a 4xx, a selector that
    /// does not parse, an installer outside the allow-lists.
    Refused,
    /// A foreign DaemonSet of the same name is being deleted to be re-created
    /// as ours: held like a refusal, reported as a takeover.
    Takeover,
}

/// A policy's standing refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `metadata.generation` of the spec that was refused.
    pub generation: Option<i64>,
    pub kind: RefusalKind,
    pub message: String,
    /// Refused attempts of this spec so far.
    pub attempts: u32,
    pub retry_at: Instant,
}

/// What a pass does about the apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Apply {
    /// Apply the DaemonSet now.
    Now,
    /// Still backing off: keep the refusal, do not call the API server.
    Wait,
}

impl Refusal {
    /// Whether to try the apply in a pass at `now` for `generation`.
    pub fn next(current: Option<&Refusal>, generation: Option<i64>, now: Instant) -> Apply {
        match current {
            Some(r) if r.generation == generation && now < r.retry_at => Apply::Wait,
            _ => Apply::Now,
        }
    }

    /// The refusal after an attempt at `now` was refused with `message`.
    pub fn refused(
        current: Option<&Refusal>,
        generation: Option<i64>,
        kind: RefusalKind,
        message: &str,
        now: Instant,
    ) -> Refusal {
        let attempts = match current {
            Some(r) if r.generation == generation => r.attempts + 1,
            _ => 1,
        };
        let wait = FIRST_WAIT
            .saturating_mul(1 << (attempts - 1).min(10))
            .min(MAX_WAIT);
        Refusal {
            generation,
            kind,
            message: shorten(message),
            attempts,
            retry_at: now + wait,
        }
    }

    /// Whether this refusal deserves an Event and a log line: a new error
    /// (another message, or the first of this spec), not a repeat.
    pub fn is_news(&self, before: Option<&Refusal>) -> bool {
        before.is_none_or(|b| b.message != self.message || b.generation != self.generation)
    }
}

/// The API server's message, bounded: the start (which names the field) is
/// kept, the middle of a long one cut.
pub fn shorten(message: &str) -> String {
    let one_line: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.len() <= MAX_MESSAGE {
        return one_line;
    }
    let mut cut = MAX_MESSAGE - 3;
    while !one_line.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &one_line[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backs_off_exponentially_per_spec_and_retries_a_new_spec_at_once() {
        let t0 = Instant::now();
        let r1 = Refusal::refused(None, Some(1), RefusalKind::Refused, "bad key", t0);
        assert_eq!(r1.attempts, 1);
        assert_eq!(r1.retry_at - t0, FIRST_WAIT);
        assert_eq!(Refusal::next(Some(&r1), Some(1), t0), Apply::Wait);
        assert_eq!(
            Refusal::next(Some(&r1), Some(2), t0),
            Apply::Now,
            "a new spec is tried at once"
        );
        assert_eq!(Refusal::next(Some(&r1), Some(1), r1.retry_at), Apply::Now);
        let mut r = r1.clone();
        let mut waits = vec![];
        for _ in 0..10 {
            let next = Refusal::refused(
                Some(&r),
                Some(1),
                RefusalKind::Refused,
                "bad key",
                r.retry_at,
            );
            waits.push((next.retry_at - r.retry_at).as_secs());
            r = next;
        }
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300, 300, 300, 300]);
    }

    #[test]
    fn news_only_for_a_new_error() {
        let t0 = Instant::now();
        let r1 = Refusal::refused(None, Some(1), RefusalKind::Refused, "bad key", t0);
        assert!(r1.is_news(None));
        let r2 = Refusal::refused(Some(&r1), Some(1), RefusalKind::Refused, "bad key", t0);
        assert!(!r2.is_news(Some(&r1)), "the same error again is not news");
        let r3 = Refusal::refused(Some(&r2), Some(1), RefusalKind::Refused, "another", t0);
        assert!(r3.is_news(Some(&r2)));
        let r4 = Refusal::refused(Some(&r3), Some(2), RefusalKind::Refused, "another", t0);
        assert!(r4.is_news(Some(&r3)), "a new spec refused again is news");
    }

    #[test]
    fn messages_are_bounded_and_keep_the_field() {
        let long = format!(
            "DaemonSet.apps \"ttdrv-x\" is invalid: spec.template.spec.affinity: {}",
            "x".repeat(5000)
        );
        let s = shorten(&long);
        assert!(s.len() <= MAX_MESSAGE);
        assert!(s.contains("spec.template.spec.affinity"));
        assert_eq!(shorten("a\nb"), "a b");
    }
}
