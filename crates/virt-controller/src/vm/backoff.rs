//! Start-failure backoff (crash loop) of a VM, as upstream's `calculateStartBackoffTime` and
//! `syncStartFailureStatus`.
//!
//! A VMI that ends (Failed or Succeeded) without ever reaching `Running` counts as a failed
//! start. Each such VMI is counted once (by UID) in `status.startFailure`, whose
//! `retryAfterTimestamp` defers the next start of an `Always` or `RerunOnFailure` VM by
//! `10·n²` seconds plus a random jitter of up to half of that, capped at 300 seconds. The
//! random source is a parameter so tests can use a seeded generator.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kubevirt_api::v1::{
    RunStrategy, VirtualMachineInstance, VirtualMachineInstancePhase, VirtualMachineStartFailure,
};
use rand::Rng;

/// Upper bound of the delay, in seconds (upstream `defaultMaxCrashLoopBackoffDelaySeconds`).
pub const MAX_CRASH_LOOP_BACKOFF_DELAY_SECONDS: i64 = 300;

/// The delay in seconds before the next start after `fail_count` consecutive failures:
/// `interval · n²` plus a random value in `[0, delay/2]`, capped at `max`, where
/// `interval = max(10, max/30)` and a count ≤ 0 counts as 1.
pub fn start_backoff_seconds(fail_count: i64, max: i64, rng: &mut impl Rng) -> i64 {
    let count = fail_count.max(1);
    let interval = (max / 30).max(10);
    let mut delay = interval.saturating_mul(count.saturating_mul(count));
    let jitter = rng.random_range(0..=delay / 2);
    delay = delay.saturating_add(jitter);
    delay.min(max)
}

/// Seconds left until `start_failure.retryAfterTimestamp` (whole Unix seconds), or 0.
pub fn backoff_time_left(
    start_failure: Option<&VirtualMachineStartFailure>,
    now: Timestamp,
) -> i64 {
    let Some(retry_after) = start_failure.and_then(|f| f.retry_after_timestamp.as_ref()) else {
        return 0;
    };
    (retry_after.0.as_second() - now.as_second()).max(0)
}

/// Whether the VMI ever reached `Running` (a `Running` phase transition timestamp).
pub fn vmi_reached_running(vmi: &VirtualMachineInstance) -> bool {
    vmi.status.as_ref().is_some_and(|s| {
        s.phase_transition_timestamps
            .iter()
            .any(|t| t.phase == Some(VirtualMachineInstancePhase::Running))
    })
}

/// The run strategies the crash-loop backoff applies to.
pub fn backoff_applies(strategy: &RunStrategy) -> bool {
    matches!(
        strategy,
        RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Once
    )
}

/// The new `status.startFailure` given the current one, the VMI and the run strategy.
///
/// `strategy` is `None` when the VM's run strategy cannot be resolved (`running` and
/// `runStrategy` both set): as upstream's `shouldClearStartFailure`, the record is then kept
/// (and a new early failure still counted) rather than cleared.
pub fn next_start_failure(
    current: Option<&VirtualMachineStartFailure>,
    vmi: Option<&VirtualMachineInstance>,
    strategy: Option<&RunStrategy>,
    now: Timestamp,
    rng: &mut impl Rng,
) -> Option<VirtualMachineStartFailure> {
    if vmi.is_some_and(vmi_reached_running) || strategy.is_some_and(|s| !backoff_applies(s)) {
        return None;
    }
    let Some(vmi) = vmi else {
        return current.cloned();
    };
    let phase = vmi.status.as_ref().and_then(|s| s.phase.as_ref());
    let uid = vmi.metadata.uid.clone();
    let counted = current.is_some_and(|f| f.last_failed_vmi_uid == uid);
    if !phase.is_some_and(VirtualMachineInstancePhase::is_final) || counted {
        return current.cloned();
    }
    let count = current
        .and_then(|f| f.consecutive_fail_count)
        .unwrap_or(0)
        .saturating_add(1);
    let delay = start_backoff_seconds(i64::from(count), MAX_CRASH_LOOP_BACKOFF_DELAY_SECONDS, rng);
    let retry_after = now
        .checked_add(SignedDuration::from_secs(delay))
        .unwrap_or(now);
    Some(VirtualMachineStartFailure {
        consecutive_fail_count: Some(count),
        last_failed_vmi_uid: uid,
        retry_after_timestamp: Some(Time(retry_after)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubevirt_api::v1::{
        VirtualMachineInstancePhaseTransitionTimestamp, VirtualMachineInstanceStatus,
    };
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn vmi(uid: &str, phase: VirtualMachineInstancePhase, ran: bool) -> VirtualMachineInstance {
        let mut vmi = VirtualMachineInstance::default();
        vmi.metadata.uid = Some(uid.to_owned());
        let mut status = VirtualMachineInstanceStatus {
            phase: Some(phase),
            ..VirtualMachineInstanceStatus::default()
        };
        if ran {
            status.phase_transition_timestamps.push(
                VirtualMachineInstancePhaseTransitionTimestamp {
                    phase: Some(VirtualMachineInstancePhase::Running),
                    phase_transition_timestamp: None,
                },
            );
        }
        vmi.status = Some(status);
        vmi
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_700_000_000).unwrap()
    }

    #[test]
    fn backoff_delay_stays_in_upstream_ranges_for_every_fail_count() {
        let cases: &[(i64, i64, i64)] = &[
            (0, 10, 15),
            (1, 10, 15),
            (2, 40, 60),
            (3, 90, 135),
            (4, 160, 240),
            (5, 250, 300),
            (6, 300, 300),
            (20, 300, 300),
        ];
        let mut rng = StdRng::seed_from_u64(7);
        for &(count, low, high) in cases {
            for _ in 0..200 {
                let d =
                    start_backoff_seconds(count, MAX_CRASH_LOOP_BACKOFF_DELAY_SECONDS, &mut rng);
                assert!(
                    (low..=high).contains(&d),
                    "count {count}: {d} not in {low}..={high}"
                );
            }
        }
    }

    #[test]
    fn jitter_reaches_both_ends_of_its_range() {
        let mut rng = StdRng::seed_from_u64(1);
        let seen: std::collections::BTreeSet<i64> = (0..2000)
            .map(|_| start_backoff_seconds(1, MAX_CRASH_LOOP_BACKOFF_DELAY_SECONDS, &mut rng))
            .collect();
        assert_eq!(seen.first(), Some(&10));
        assert_eq!(seen.last(), Some(&15));
    }

    #[test]
    fn time_left_is_zero_without_failure_or_in_the_past_and_remaining_otherwise() {
        let at = |secs: i64| VirtualMachineStartFailure {
            retry_after_timestamp: Some(Time(
                now().checked_add(SignedDuration::from_secs(secs)).unwrap(),
            )),
            ..VirtualMachineStartFailure::default()
        };
        assert_eq!(backoff_time_left(None, now()), 0);
        assert_eq!(backoff_time_left(Some(&at(300)), now()), 300);
        assert_eq!(backoff_time_left(Some(&at(-300)), now()), 0);
    }

    #[test]
    fn a_failed_vmi_that_never_ran_starts_the_count_at_one() {
        let mut rng = StdRng::seed_from_u64(3);
        let failed = vmi("123", VirtualMachineInstancePhase::Failed, false);
        let f = next_start_failure(
            None,
            Some(&failed),
            Some(&RunStrategy::Always),
            now(),
            &mut rng,
        )
        .unwrap();
        assert_eq!(f.consecutive_fail_count, Some(1));
        assert_eq!(f.last_failed_vmi_uid.as_deref(), Some("123"));
        let left = backoff_time_left(Some(&f), now());
        assert!((10..=15).contains(&left), "{left}");
    }

    #[test]
    fn a_new_failed_vmi_raises_the_count_and_the_same_vmi_is_counted_once() {
        let mut rng = StdRng::seed_from_u64(3);
        let current = VirtualMachineStartFailure {
            consecutive_fail_count: Some(1),
            last_failed_vmi_uid: Some("123".into()),
            retry_after_timestamp: None,
        };
        let same = vmi("123", VirtualMachineInstancePhase::Failed, false);
        let next = next_start_failure(
            Some(&current),
            Some(&same),
            Some(&RunStrategy::Always),
            now(),
            &mut rng,
        );
        assert_eq!(next.as_ref(), Some(&current));
        let other = vmi("456", VirtualMachineInstancePhase::Succeeded, false);
        let next = next_start_failure(
            Some(&current),
            Some(&other),
            Some(&RunStrategy::RerunOnFailure),
            now(),
            &mut rng,
        )
        .unwrap();
        assert_eq!(next.consecutive_fail_count, Some(2));
        assert_eq!(next.last_failed_vmi_uid.as_deref(), Some("456"));
        assert!((40..=60).contains(&backoff_time_left(Some(&next), now())));
    }

    #[test]
    fn start_failure_is_cleared_once_a_vmi_ran_or_for_strategies_without_backoff() {
        let mut rng = StdRng::seed_from_u64(3);
        let current = VirtualMachineStartFailure {
            consecutive_fail_count: Some(1),
            last_failed_vmi_uid: Some("123".into()),
            retry_after_timestamp: None,
        };
        let running = vmi("456", VirtualMachineInstancePhase::Running, true);
        let cases = [
            (Some(&running), RunStrategy::Always, false),
            (None, RunStrategy::Halted, false),
            (None, RunStrategy::Manual, false),
            (None, RunStrategy::Always, true),
            (None, RunStrategy::RerunOnFailure, true),
            (None, RunStrategy::Once, true),
        ];
        for (vmi, strategy, kept) in cases {
            let next = next_start_failure(Some(&current), vmi, Some(&strategy), now(), &mut rng);
            assert_eq!(next.is_some(), kept, "{strategy:?}");
        }
    }

    #[test]
    fn an_unresolvable_run_strategy_keeps_the_start_failure_and_still_counts_early_failures() {
        let mut rng = StdRng::seed_from_u64(3);
        let current = VirtualMachineStartFailure {
            consecutive_fail_count: Some(1),
            last_failed_vmi_uid: Some("123".into()),
            retry_after_timestamp: None,
        };
        let kept = next_start_failure(Some(&current), None, None, now(), &mut rng);
        assert_eq!(kept.as_ref(), Some(&current));
        let failed = vmi("456", VirtualMachineInstancePhase::Failed, false);
        let next =
            next_start_failure(Some(&current), Some(&failed), None, now(), &mut rng).unwrap();
        assert_eq!(next.consecutive_fail_count, Some(2));
        let running = vmi("789", VirtualMachineInstancePhase::Running, true);
        assert_eq!(
            next_start_failure(Some(&current), Some(&running), None, now(), &mut rng),
            None,
            "a VMI that ran still clears it"
        );
    }
}
