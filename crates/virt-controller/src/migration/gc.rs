//! Upstream's `garbageCollectFinalizedMigrations`: of a VMI's finished migrations only the
//! [`FINALIZED_MIGRATIONS_KEPT`] newest stay. Each older one is deleted with the launcher pod
//! it left behind — a failed migration's target pod, a completed one's source pod — and
//! neither when its migration state says neither.

use std::sync::Arc;

use kubevirt_api::v1::VirtualMachineInstanceMigration;

use super::phase_of;

/// How many finished migrations a VMI keeps (upstream's
/// `defaultFinalizedMigrationGarbageCollectionBuffer`).
pub const FINALIZED_MIGRATIONS_KEPT: usize = 5;

/// A finished migration to delete: its name and the pod it left, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collected {
    pub migration: String,
    pub pod: Option<String>,
}

/// The migrations of VMI `namespace/vmi` to delete, oldest first: the finished ones not being
/// deleted, beyond the newest [`FINALIZED_MIGRATIONS_KEPT`].
pub fn to_collect(
    migrations: &[Arc<VirtualMachineInstanceMigration>],
    namespace: &str,
    vmi: &str,
) -> Vec<Collected> {
    let mut finished: Vec<&VirtualMachineInstanceMigration> = migrations
        .iter()
        .map(AsRef::as_ref)
        .filter(|m| {
            m.metadata.namespace.as_deref() == Some(namespace)
                && m.spec.vmi_name.as_deref() == Some(vmi)
                && m.metadata.deletion_timestamp.is_none()
                && phase_of(m).is_final()
        })
        .collect();
    finished.sort_by_key(|m| {
        (
            m.metadata.creation_timestamp.as_ref().map(|t| t.0),
            m.metadata.name.clone(),
        )
    });
    let excess = finished.len().saturating_sub(FINALIZED_MIGRATIONS_KEPT);
    finished
        .into_iter()
        .take(excess)
        .map(|m| {
            let state = m.status.as_ref().and_then(|s| s.migration_state.as_ref());
            let pod = state.and_then(|s| {
                if s.failed == Some(true) {
                    s.target_pod.clone()
                } else if s.completed == Some(true) {
                    s.source_pod.clone()
                } else {
                    None
                }
            });
            Collected {
                migration: m.metadata.name.clone().unwrap_or_default(),
                pod,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn migration(
        name: &str,
        second: u32,
        phase: &str,
        state: &serde_json::Value,
    ) -> Arc<VirtualMachineInstanceMigration> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default",
                    "creationTimestamp": format!("2026-12-01T00:00:{second:02}Z")},
                "spec": {"vmiName": "vm1"},
                "status": {"phase": phase, "migrationState": state},
            }))
            .expect("migration"),
        )
    }

    #[test]
    fn only_the_five_newest_finished_migrations_stay_and_the_older_take_their_old_pod() {
        let mut all = vec![
            migration(
                "m0",
                0,
                "Failed",
                &json!({"failed": true, "targetPod": "t0", "sourcePod": "s0"}),
            ),
            migration(
                "m1",
                1,
                "Succeeded",
                &json!({"completed": true, "targetPod": "t1", "sourcePod": "s1"}),
            ),
            migration("m2", 2, "Failed", &json!({})),
        ];
        for i in 3..8 {
            all.push(migration(
                &format!("m{i}"),
                i,
                "Succeeded",
                &json!({"completed": true}),
            ));
        }
        all.push(migration("running", 9, "Running", &json!({})));
        all.reverse();
        assert_eq!(
            to_collect(&all, "default", "vm1"),
            vec![
                Collected {
                    migration: "m0".into(),
                    pod: Some("t0".into())
                },
                Collected {
                    migration: "m1".into(),
                    pod: Some("s1".into())
                },
                Collected {
                    migration: "m2".into(),
                    pod: None
                },
            ]
        );
        assert!(to_collect(&all, "default", "other").is_empty());
        assert!(
            to_collect(&all[..6], "default", "vm1").is_empty(),
            "five or fewer finished: none"
        );
    }
}
