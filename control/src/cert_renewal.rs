//! When a node renews its own certificate, as a pure function of the certificate's validity
//! window and the time (unix milliseconds). The node's renewal loop only sleeps until the
//! instant this returns and asks for a new certificate when it says so.
//!
//! The rule: renew once two thirds of the validity have passed (a third is left, as
//! cert-manager does by default), and after a failed attempt try again after a twentieth of the
//! validity, at least a second and at most a minute. With the default 90 days that is 30 days of
//! retries before expiry, so a leader election, a partition or a CA holder's restart in between
//! never lets a certificate lapse; a test with a 20 s validity renews 13 s in and retries every
//! second.

/// What the renewal loop does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing until `at_ms`, when the window's last third begins.
    Wait { at_ms: u64 },
    /// Ask for a renewed certificate now.
    Renew,
    /// The certificate is no longer valid: peers refuse it, and a renewal signed over it is
    /// refused too. The node needs a new join token (or `yard ca issue`).
    Expired,
}

/// The step for a certificate valid from `not_before_ms` to `not_after_ms`, at `now_ms`.
pub fn step(not_before_ms: u64, not_after_ms: u64, now_ms: u64) -> Step {
    if now_ms >= not_after_ms {
        return Step::Expired;
    }
    let at_ms = renew_at(not_before_ms, not_after_ms);
    if now_ms >= at_ms {
        Step::Renew
    } else {
        Step::Wait { at_ms }
    }
}

/// [`step`] for a certificate the node's active CA did (`by_active_ca`) or did not sign: during
/// a CA rollover (`yard ca rotate switch`) the bundle's first CA becomes a new one, and every
/// certificate of the old CA is renewed at once, so that the old CA can be dropped.
pub fn step_under(not_before_ms: u64, not_after_ms: u64, now_ms: u64, by_active_ca: bool) -> Step {
    match step(not_before_ms, not_after_ms, now_ms) {
        Step::Wait { .. } if !by_active_ca => Step::Renew,
        step => step,
    }
}

/// The instant two thirds of the validity window have passed.
pub fn renew_at(not_before_ms: u64, not_after_ms: u64) -> u64 {
    let lifetime = not_after_ms.saturating_sub(not_before_ms);
    not_before_ms + lifetime - lifetime / 3
}

/// How long to wait after a failed renewal attempt: a twentieth of the validity, between one
/// second and one minute.
pub fn retry_after_ms(not_before_ms: u64, not_after_ms: u64) -> u64 {
    (not_after_ms.saturating_sub(not_before_ms) / 20).clamp(1_000, 60_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DAY: u64 = 24 * 3600 * 1000;

    #[test]
    fn a_certificate_of_a_ca_no_longer_active_is_renewed_at_once() {
        assert_eq!(step_under(0, 90 * DAY, DAY, false), Step::Renew);
        assert_eq!(
            step_under(0, 90 * DAY, DAY, true),
            Step::Wait { at_ms: 60 * DAY }
        );
        assert_eq!(step_under(0, 90 * DAY, 91 * DAY, false), Step::Expired);
    }

    #[test]
    fn ninety_days_renew_after_sixty() {
        assert_eq!(renew_at(0, 90 * DAY), 60 * DAY);
        assert_eq!(step(0, 90 * DAY, 59 * DAY), Step::Wait { at_ms: 60 * DAY });
        assert_eq!(step(0, 90 * DAY, 60 * DAY), Step::Renew);
        assert_eq!(step(0, 90 * DAY, 90 * DAY), Step::Expired);
        assert_eq!(retry_after_ms(0, 90 * DAY), 60_000);
    }

    #[test]
    fn a_short_validity_retries_every_second() {
        assert_eq!(retry_after_ms(0, 20_000), 1_000);
        assert_eq!(renew_at(0, 21_000), 14_000);
    }

    proptest! {
        /// Renewal starts inside the window with a third of it left, and every instant of
        /// the window maps to exactly one step in time order: wait, then renew, then expired.
        #[test]
        fn steps_are_ordered_and_leave_a_third(
            before in 0u64..1 << 50,
            life in 10_000u64..1 << 40,
            t in 0u64..1 << 41,
        ) {
            let after = before + life;
            let at = renew_at(before, after);
            prop_assert!(at > before && at < after);
            prop_assert!(after - at >= life / 3);
            let now = before + t;
            match step(before, after, now) {
                Step::Wait { at_ms } => prop_assert!(now < at_ms && at_ms == at),
                Step::Renew => prop_assert!(now >= at && now < after),
                Step::Expired => prop_assert!(now >= after),
            }
            // Retries fit many times into the third that is left.
            prop_assert!(retry_after_ms(before, after) * 3 <= (after - at).max(3_000));
        }
    }
}
