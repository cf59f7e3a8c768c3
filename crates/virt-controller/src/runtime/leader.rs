//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection`.
//!
//! Several virt-controller replicas may run; only the one holding the Lease
//! (`kubevirt/virt-controller` by default) runs controllers. The elector:
//! - **acquires** when the Lease does not exist (create), is free (no holder), or its holder
//!   has not renewed it for `leaseDurationSeconds` — measured on *our* monotonic clock from
//!   the moment we saw the record change, never by comparing wall-clock timestamps, so clock
//!   skew between replicas cannot make two of them leader;
//! - **renews** every retry period while leading;
//! - **loses** leadership when it cannot renew within the renew deadline or finds another
//!   holder; then [`LeaderStatus`] flips to `false` and [`run`](LeaderElector::run) returns
//!   [`LeaderElectionError::Lost`], and the caller must stop its controllers (upstream exits
//!   the process).
//!
//! Writes use optimistic concurrency: an update carries the `resourceVersion` that was read,
//! so of two candidates racing for an expired Lease exactly one update succeeds and the other
//! gets 409 Conflict.
//!
//! The decision is the pure function [`should_acquire`]; the I/O around it uses
//! `kube::Api<Lease>`.
//!
//! Wiring, in a main: spawn `elector.run(shutdown)`, await [`LeaderStatus::acquired`], start
//! the informers and controllers with a `CancellationToken`, and cancel that token when
//! [`LeaderStatus::lost`] resolves.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Parameters of the election; the defaults are KubeVirt's.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaderElectionConfig {
    /// Name of the Lease.
    pub lease_name: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// Our identity, written as `holderIdentity`.
    pub identity: String,
    /// How long a holder keeps the Lease without renewing it.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up leadership.
    pub renew_deadline: Duration,
    /// Interval between attempts to acquire or renew.
    pub retry_period: Duration,
    /// Acquire attempts wait `retry_period · (1 + jitter · random)`, so that candidates do
    /// not move in lock step (client-go uses 1.2).
    pub jitter: f64,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        Self {
            lease_name: "virt-controller".to_owned(),
            namespace: "kubevirt".to_owned(),
            identity: default_identity(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            jitter: 1.2,
        }
    }
}

/// The host name plus a random suffix, so that two processes on one host differ.
pub fn default_identity() -> String {
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "virt-controller".to_owned());
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}_{}", &suffix[..8])
}

/// The fields of a Lease that decisions look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    /// `spec.holderIdentity`; `None` or empty when free.
    pub holder: Option<String>,
    /// `spec.leaseDurationSeconds`.
    pub lease_duration_seconds: Option<i32>,
    /// `spec.renewTime`, compared only for equality (has the holder renewed?).
    pub renew_time: Option<Timestamp>,
    /// `spec.acquireTime`.
    pub acquire_time: Option<Timestamp>,
    /// `spec.leaseTransitions`.
    pub transitions: i32,
}

impl LeaseRecord {
    /// The record of `lease`.
    pub fn of(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity,
            lease_duration_seconds: spec.lease_duration_seconds,
            renew_time: spec.renew_time.map(|t| t.0),
            acquire_time: spec.acquire_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }
}

/// What we last saw of the Lease, and when (on our clock) it last changed.
#[derive(Clone, Debug)]
pub struct Observation {
    record: Option<LeaseRecord>,
    changed_at: Instant,
}

impl Observation {
    /// Nothing observed yet (as if the Lease did not exist at `now`).
    pub fn new(now: Instant) -> Self {
        Self {
            record: None,
            changed_at: now,
        }
    }

    /// Records what a read returned at `now`; the clock restarts only if it changed.
    pub fn observe(&mut self, record: Option<LeaseRecord>, now: Instant) {
        if record != self.record {
            self.record = record;
            self.changed_at = now;
        }
    }

    /// The last record seen.
    pub fn record(&self) -> Option<&LeaseRecord> {
        self.record.as_ref()
    }
}

/// What a candidate should do with the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// There is no Lease: create it with us as holder.
    Create,
    /// The Lease is free or expired: take it over.
    TakeOver,
    /// We hold the Lease: renew it.
    Renew,
    /// Someone else holds a valid Lease.
    Wait {
        /// The current holder.
        holder: String,
        /// Time until it expires unless renewed.
        expires_in: Duration,
    },
}

/// Decides what `identity` should do, given what it observed of the Lease, at `now`.
///
/// `default_duration` applies when the Lease does not state `leaseDurationSeconds`.
pub fn should_acquire(
    observed: &Observation,
    now: Instant,
    identity: &str,
    default_duration: Duration,
) -> Decision {
    let Some(record) = &observed.record else {
        return Decision::Create;
    };
    let holder = match record.holder.as_deref() {
        None | Some("") => return Decision::TakeOver,
        Some(holder) if holder == identity => return Decision::Renew,
        Some(holder) => holder,
    };
    let duration = record
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0)
        .map_or(default_duration, Duration::from_secs);
    let expires_at = observed.changed_at + duration;
    if expires_at > now {
        Decision::Wait {
            holder: holder.to_owned(),
            expires_in: expires_at - now,
        }
    } else {
        Decision::TakeOver
    }
}

/// The spec to write after `decision` (`Create`, `TakeOver` or `Renew`), at wall time `now`.
pub fn next_spec(
    decision: &Decision,
    old: Option<&LeaseRecord>,
    identity: &str,
    lease_duration: Duration,
    now: Timestamp,
) -> LeaseSpec {
    let (acquire_time, transitions) = match (decision, old) {
        (Decision::Renew, Some(old)) => (old.acquire_time.unwrap_or(now), old.transitions),
        (Decision::TakeOver, Some(old)) => (now, old.transitions.saturating_add(1)),
        _ => (now, 0),
    };
    LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        lease_duration_seconds: Some(i32::try_from(lease_duration.as_secs()).unwrap_or(i32::MAX)),
        acquire_time: Some(MicroTime(acquire_time)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

/// Errors of the leader elector.
#[derive(Debug, thiserror::Error)]
pub enum LeaderElectionError {
    /// Reading the Lease failed.
    #[error("reading the lease failed")]
    GetLease(#[source] kube::Error),
    /// Creating the Lease failed (other than because someone else created it first).
    #[error("creating the lease failed")]
    CreateLease(#[source] kube::Error),
    /// Updating the Lease failed (other than by losing a race).
    #[error("updating the lease failed")]
    UpdateLease(#[source] kube::Error),
    /// An attempt did not finish in time.
    #[error("lease request timed out")]
    Timeout,
    /// Leadership was lost: another holder took the Lease, or it could not be renewed within
    /// the renew deadline.
    #[error("leadership lost: {0}")]
    Lost(String),
}

fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}

/// The elector is gone without having become leader.
#[derive(Debug, thiserror::Error)]
#[error("leader elector stopped")]
pub struct ElectorStopped;

/// Whether this process leads. Cheap to clone.
#[derive(Clone, Debug)]
pub struct LeaderStatus {
    rx: watch::Receiver<bool>,
}

impl LeaderStatus {
    /// Whether we hold the Lease right now.
    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// The underlying "is leader" channel.
    pub fn receiver(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }

    /// Waits until we lead; fails if the elector stopped first.
    pub async fn acquired(&self) -> Result<(), ElectorStopped> {
        let mut rx = self.rx.clone();
        rx.wait_for(|leader| *leader)
            .await
            .map(|_| ())
            .map_err(|_| ElectorStopped)
    }

    /// Resolves once leadership, after having been held, is lost (or the elector stopped).
    /// Stop the controllers when it does.
    pub async fn lost(&self) {
        let mut rx = self.rx.clone();
        if rx.wait_for(|leader| *leader).await.is_err() {
            return;
        }
        // An error means the elector is gone, which also ends leadership.
        let _ = rx.wait_for(|leader| !*leader).await;
    }
}

/// The candidate side of leader election.
///
/// # Guarantees
/// - [`LeaderStatus`] is `true` only between a successful create/update of the Lease with
///   our identity and the end of the renew deadline after the last successful renew.
/// - Of two electors racing for the same Lease version, at most one succeeds (the API
///   server's resourceVersion check).
///
/// # Assumptions
/// - `lease_duration > renew_deadline > retry_period`, as upstream requires, so a leader
///   gives up before another candidate may take over.
/// - Clock *rates* are similar on all replicas; absolute clock values need not agree.
///
/// # Caveats
/// - Leadership is not re-acquired after it is lost: `run` returns and the caller is
///   expected to stop (or exit, as upstream does).
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    observation: Observation,
    /// The Lease as we last wrote it, for renewing without reading first.
    last_written: Option<Lease>,
    status: watch::Sender<bool>,
}

impl LeaderElector {
    /// An elector for `config` using `client`, and the status it publishes.
    pub fn new(client: Client, config: LeaderElectionConfig) -> (Self, LeaderStatus) {
        let api = Api::namespaced(client, &config.namespace);
        let (status, rx) = watch::channel(false);
        let elector = Self {
            api,
            config,
            observation: Observation::new(Instant::now()),
            last_written: None,
            status,
        };
        (elector, LeaderStatus { rx })
    }

    /// The identity this elector writes into the Lease.
    pub fn identity(&self) -> &str {
        &self.config.identity
    }

    /// Campaigns until leader, then renews until leadership is lost or `cancel` fires.
    ///
    /// Returns `Ok(())` when cancelled (releasing the Lease if we held it, so another
    /// replica can take over at once) and [`LeaderElectionError::Lost`] when leadership was
    /// lost.
    pub async fn run(mut self, cancel: CancellationToken) -> Result<(), LeaderElectionError> {
        tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            () = self.acquire() => {}
        }
        self.status.send_replace(true);
        tracing::info!(identity = %self.config.identity, lease = %self.config.lease_name, "became leader");
        let ended = tokio::select! {
            () = cancel.cancelled() => None,
            err = self.renew() => Some(err),
        };
        // Step down before releasing, so nobody acts as leader once another may.
        self.status.send_replace(false);
        let outcome = match ended {
            None => {
                self.release().await;
                Ok(())
            }
            Some(err) => Err(err),
        };
        if let Err(err) = &outcome {
            tracing::warn!(identity = %self.config.identity, error = %err, "stopped leading");
        }
        outcome
    }

    /// Tries until we hold the Lease.
    async fn acquire(&mut self) {
        loop {
            match self.attempt(self.config.renew_deadline).await {
                Ok(true) => return,
                Ok(false) => {}
                Err(err) => tracing::warn!(error = %err, "failed to acquire the lease"),
            }
            let factor = 1.0 + self.config.jitter * random_fraction();
            tokio::time::sleep(self.config.retry_period.mul_f64(factor)).await;
        }
    }

    /// Renews every retry period; returns why leadership ended.
    async fn renew(&mut self) -> LeaderElectionError {
        let mut last_renew = Instant::now();
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            let deadline = last_renew + self.config.renew_deadline;
            let remaining = deadline.saturating_duration_since(Instant::now());
            match self.attempt(remaining).await {
                Ok(true) => last_renew = Instant::now(),
                Ok(false) => {
                    let holder = self
                        .observation
                        .record()
                        .and_then(|r| r.holder.clone())
                        .unwrap_or_default();
                    return LeaderElectionError::Lost(format!("the lease is held by {holder:?}"));
                }
                Err(err) => tracing::warn!(error = %err, "failed to renew the lease"),
            }
            if Instant::now() >= last_renew + self.config.renew_deadline {
                return LeaderElectionError::Lost("renew deadline passed".to_owned());
            }
        }
    }

    /// One acquire-or-renew attempt bounded by `limit`; `Ok(true)` when we hold the Lease.
    async fn attempt(&mut self, limit: Duration) -> Result<bool, LeaderElectionError> {
        match tokio::time::timeout(limit, self.try_acquire_or_renew()).await {
            Ok(result) => result,
            Err(_) => Err(LeaderElectionError::Timeout),
        }
    }

    /// Reads the Lease (unless renewing our own write), decides, and writes.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, LeaderElectionError> {
        let pp = PostParams::default();
        let name = self.config.lease_name.clone();
        // Fast path: renew the Lease as we last wrote it, without reading it first.
        if let Some(mut lease) = self.last_written.take() {
            let old = LeaseRecord::of(&lease);
            lease.spec = Some(next_spec(
                &Decision::Renew,
                Some(&old),
                &self.config.identity,
                self.config.lease_duration,
                Timestamp::now(),
            ));
            match self.api.replace(&name, &pp, &lease).await {
                Ok(written) => return Ok(self.wrote(written)),
                Err(err) if is_status(&err, 409) => {} // changed meanwhile: read and decide
                Err(err) => return Err(LeaderElectionError::UpdateLease(err)),
            }
        }

        let current = self
            .api
            .get_opt(&name)
            .await
            .map_err(LeaderElectionError::GetLease)?;
        let now = Instant::now();
        self.observation
            .observe(current.as_ref().map(LeaseRecord::of), now);
        let decision = should_acquire(
            &self.observation,
            now,
            &self.config.identity,
            self.config.lease_duration,
        );
        let spec = match &decision {
            Decision::Wait { .. } => return Ok(false),
            _ => next_spec(
                &decision,
                self.observation.record(),
                &self.config.identity,
                self.config.lease_duration,
                Timestamp::now(),
            ),
        };
        match current {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name),
                        namespace: Some(self.config.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                match self.api.create(&pp, &lease).await {
                    Ok(written) => Ok(self.wrote(written)),
                    Err(err) if is_status(&err, 409) => Ok(false),
                    Err(err) => Err(LeaderElectionError::CreateLease(err)),
                }
            }
            Some(mut lease) => {
                // Keeps metadata.resourceVersion from the read: the optimistic lock.
                lease.spec = Some(spec);
                match self.api.replace(&name, &pp, &lease).await {
                    Ok(written) => Ok(self.wrote(written)),
                    Err(err) if is_status(&err, 409) => Ok(false),
                    Err(err) => Err(LeaderElectionError::UpdateLease(err)),
                }
            }
        }
    }

    /// Remembers a successful write of ours.
    fn wrote(&mut self, lease: Lease) -> bool {
        self.observation
            .observe(Some(LeaseRecord::of(&lease)), Instant::now());
        self.last_written = Some(lease);
        true
    }

    /// Gives the Lease up (best effort): no holder, and a one-second duration.
    async fn release(&mut self) {
        let name = self.config.lease_name.clone();
        // Cancellation may have interrupted a renew, leaving no copy of our last write.
        let lease = match self.last_written.take() {
            Some(lease) => Some(lease),
            None => self.api.get_opt(&name).await.ok().flatten(),
        };
        let Some(mut lease) = lease.filter(|l| {
            LeaseRecord::of(l).holder.as_deref() == Some(self.config.identity.as_str())
        }) else {
            return;
        };
        let mut spec = lease.spec.take().unwrap_or_default();
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        lease.spec = Some(spec);
        let name = self.config.lease_name.clone();
        if let Err(err) = self
            .api
            .replace(&name, &PostParams::default(), &lease)
            .await
        {
            tracing::warn!(error = %err, "failed to release the lease");
        }
    }
}

/// A number in `[0, 1)` for jitter.
fn random_fraction() -> f64 {
    rand::random::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::{Method, Request, Response, StatusCode};
    use http_body_util::{BodyExt, Full};
    use std::sync::{Arc, Mutex};

    const SECOND: Duration = Duration::from_secs(1);
    const DEFAULT: Duration = Duration::from_secs(15);

    fn record(holder: &str, renewed_at: i64) -> LeaseRecord {
        LeaseRecord {
            holder: Some(holder.to_owned()),
            lease_duration_seconds: Some(15),
            renew_time: Timestamp::from_second(renewed_at).ok(),
            acquire_time: Timestamp::from_second(0).ok(),
            transitions: 2,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_lease_is_created() {
        let obs = Observation::new(Instant::now());
        assert_eq!(
            should_acquire(&obs, Instant::now(), "me", DEFAULT),
            Decision::Create
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_without_holder_is_taken_over_at_once() {
        let mut obs = Observation::new(Instant::now());
        let mut free = record("", 10);
        obs.observe(Some(free.clone()), Instant::now());
        assert_eq!(
            should_acquire(&obs, Instant::now(), "me", DEFAULT),
            Decision::TakeOver
        );
        free.holder = None;
        obs.observe(Some(free), Instant::now());
        assert_eq!(
            should_acquire(&obs, Instant::now(), "me", DEFAULT),
            Decision::TakeOver
        );
    }

    #[tokio::test(start_paused = true)]
    async fn our_own_lease_is_renewed() {
        let mut obs = Observation::new(Instant::now());
        obs.observe(Some(record("me", 10)), Instant::now());
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(
            should_acquire(&obs, Instant::now(), "me", DEFAULT),
            Decision::Renew
        );
    }

    #[tokio::test(start_paused = true)]
    async fn another_holder_expires_a_lease_duration_after_we_last_saw_it_change() {
        let start = Instant::now();
        let mut obs = Observation::new(start);
        obs.observe(Some(record("other", 100)), start);
        tokio::time::advance(Duration::from_secs(10)).await;
        // The holder renews: the record changes, our clock restarts.
        obs.observe(Some(record("other", 110)), Instant::now());
        tokio::time::advance(Duration::from_secs(14)).await;
        // Unchanged reads do not restart it.
        obs.observe(Some(record("other", 110)), Instant::now());
        assert_eq!(
            should_acquire(&obs, Instant::now(), "me", DEFAULT),
            Decision::Wait {
                holder: "other".to_owned(),
                expires_in: SECOND
            }
        );
        tokio::time::advance(SECOND).await;
        assert_eq!(
            should_acquire(&obs, Instant::now(), "me", DEFAULT),
            Decision::TakeOver
        );
    }

    #[tokio::test(start_paused = true)]
    async fn wall_clock_timestamps_in_the_lease_do_not_decide_expiry() {
        // A renew time in the distant past (a skewed clock) but freshly observed: valid.
        let mut obs = Observation::new(Instant::now());
        obs.observe(Some(record("other", 0)), Instant::now());
        assert!(matches!(
            should_acquire(&obs, Instant::now(), "me", DEFAULT),
            Decision::Wait { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn the_holders_stated_duration_wins_over_ours() {
        let mut obs = Observation::new(Instant::now());
        let mut long = record("other", 5);
        long.lease_duration_seconds = Some(60);
        obs.observe(Some(long), Instant::now());
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(matches!(
            should_acquire(&obs, Instant::now(), "me", DEFAULT),
            Decision::Wait { .. }
        ));
    }

    #[test]
    fn take_over_counts_a_transition_and_renew_keeps_the_acquire_time() -> anyhow::Result<()> {
        let old = record("other", 100);
        let now = Timestamp::from_second(200)?;
        let taken = next_spec(&Decision::TakeOver, Some(&old), "me", DEFAULT, now);
        assert_eq!(taken.holder_identity.as_deref(), Some("me"));
        assert_eq!(taken.lease_transitions, Some(3));
        assert_eq!(taken.acquire_time, Some(MicroTime(now)));
        assert_eq!(taken.lease_duration_seconds, Some(15));

        let mine = LeaseRecord::of(&Lease {
            metadata: ObjectMeta::default(),
            spec: Some(taken),
        });
        let later = Timestamp::from_second(210)?;
        let renewed = next_spec(&Decision::Renew, Some(&mine), "me", DEFAULT, later);
        assert_eq!(renewed.acquire_time, Some(MicroTime(now)));
        assert_eq!(renewed.renew_time, Some(MicroTime(later)));
        assert_eq!(renewed.lease_transitions, Some(3));

        let created = next_spec(&Decision::Create, None, "me", DEFAULT, now);
        assert_eq!(created.lease_transitions, Some(0));
        Ok(())
    }

    #[test]
    fn the_default_identity_is_the_host_name_with_a_random_suffix() {
        let a = default_identity();
        let b = default_identity();
        assert_ne!(a, b);
        let (host_a, suffix) = a.rsplit_once('_').unwrap_or_default();
        assert!(!host_a.is_empty());
        assert_eq!(suffix.len(), 8);
        assert_eq!(b.rsplit_once('_').map(|(h, _)| h), Some(host_a));
    }

    // ---- I/O against a small in-process Lease endpoint -------------------------------------

    /// One Lease with resourceVersion checks, and a switch to make every request fail.
    #[derive(Default)]
    struct FakeLeases {
        lease: Option<Lease>,
        rv: u64,
        down: bool,
        writes: usize,
    }

    fn status(code: StatusCode, reason: &str) -> Response<Full<Bytes>> {
        let body = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": reason, "reason": reason, "code": code.as_u16(),
        });
        let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
        *resp.status_mut() = code;
        resp
    }

    fn object(code: StatusCode, lease: &Lease) -> Response<Full<Bytes>> {
        let body = serde_json::to_vec(lease).unwrap_or_default();
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = code;
        resp
    }

    impl FakeLeases {
        fn handle(&mut self, method: &Method, body: &[u8]) -> Response<Full<Bytes>> {
            if self.down {
                return status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable");
            }
            if method == Method::GET {
                return match &self.lease {
                    Some(lease) => object(StatusCode::OK, lease),
                    None => status(StatusCode::NOT_FOUND, "NotFound"),
                };
            }
            let Ok(mut lease) = serde_json::from_slice::<Lease>(body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest");
            };
            let code = if method == Method::POST {
                if self.lease.is_some() {
                    return status(StatusCode::CONFLICT, "AlreadyExists");
                }
                StatusCode::CREATED
            } else {
                let current = self
                    .lease
                    .as_ref()
                    .and_then(|l| l.metadata.resource_version.clone());
                if lease.metadata.resource_version != current {
                    return status(StatusCode::CONFLICT, "Conflict");
                }
                StatusCode::OK
            };
            self.rv += 1;
            self.writes += 1;
            lease.metadata.resource_version = Some(self.rv.to_string());
            self.lease = Some(lease.clone());
            object(code, &lease)
        }

        fn holder(&self) -> Option<String> {
            self.lease
                .as_ref()
                .and_then(|l| l.spec.as_ref())
                .and_then(|s| s.holder_identity.clone())
        }

        fn transitions(&self) -> Option<i32> {
            self.lease
                .as_ref()
                .and_then(|l| l.spec.as_ref())
                .and_then(|s| s.lease_transitions)
        }
    }

    type Server = Arc<Mutex<FakeLeases>>;

    fn client(server: &Server) -> Client {
        let server = Arc::clone(server);
        let service = tower::service_fn(move |req: Request<kube::client::Body>| {
            let server = Arc::clone(&server);
            async move {
                let method = req.method().clone();
                let body = req.into_body().collect().await?.to_bytes();
                let resp = server
                    .lock()
                    .map_err(|_| "fake server poisoned")?
                    .handle(&method, &body);
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(resp)
            }
        });
        Client::new(service, "kubevirt")
    }

    fn config(identity: &str) -> LeaderElectionConfig {
        LeaderElectionConfig {
            identity: identity.to_owned(),
            jitter: 0.0,
            ..LeaderElectionConfig::default()
        }
    }

    fn with<T>(server: &Server, f: impl FnOnce(&mut FakeLeases) -> T) -> Option<T> {
        server.lock().ok().map(|mut s| f(&mut s))
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_candidate_creates_the_lease_and_renews_it_every_retry_period() {
        let server = Server::default();
        let (elector, status) = LeaderElector::new(client(&server), config("a"));
        let cancel = CancellationToken::new();
        let run = tokio::spawn(elector.run(cancel.clone()));
        assert!(status.acquired().await.is_ok());
        assert_eq!(
            with(&server, |s| s.holder()).flatten().as_deref(),
            Some("a")
        );
        assert_eq!(with(&server, |s| s.writes), Some(1));
        tokio::time::sleep(Duration::from_secs(21)).await;
        // Ten renews in 21 s, each a single write.
        assert_eq!(with(&server, |s| s.writes), Some(11));
        assert!(status.is_leader());
        assert_eq!(with(&server, |s| s.transitions()).flatten(), Some(0));
        cancel.cancel();
        assert!(matches!(run.await, Ok(Ok(()))));
        assert!(!status.is_leader());
        assert_eq!(with(&server, |s| s.holder()).flatten(), None, "released");
    }

    #[tokio::test(start_paused = true)]
    async fn of_two_candidates_exactly_one_leads_and_the_other_takes_over_after_release() {
        let server = Server::default();
        let (a, status_a) = LeaderElector::new(client(&server), config("a"));
        let (b, status_b) = LeaderElector::new(client(&server), config("b"));
        let cancel_a = CancellationToken::new();
        let cancel_b = CancellationToken::new();
        let run_a = tokio::spawn(a.run(cancel_a.clone()));
        assert!(status_a.acquired().await.is_ok());
        let run_b = tokio::spawn(b.run(cancel_b.clone()));
        let mut b_led = false;
        for _ in 0..60 {
            tokio::time::sleep(SECOND).await;
            b_led |= status_b.is_leader();
            assert!(status_a.is_leader());
        }
        assert!(!b_led, "b never leads while a renews");

        cancel_a.cancel();
        assert!(matches!(run_a.await, Ok(Ok(()))));
        let released = Instant::now();
        assert!(status_b.acquired().await.is_ok());
        // b sees the free lease on its next attempt.
        assert!(released.elapsed() <= Duration::from_secs(2));
        assert_eq!(
            with(&server, |s| s.holder()).flatten().as_deref(),
            Some("b")
        );
        assert_eq!(with(&server, |s| s.transitions()).flatten(), Some(1));
        cancel_b.cancel();
        assert!(matches!(run_b.await, Ok(Ok(()))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_vanished_leader_is_replaced_once_its_lease_has_expired() {
        let server = Server::default();
        let (a, status_a) = LeaderElector::new(client(&server), config("a"));
        let (b, status_b) = LeaderElector::new(client(&server), config("b"));
        let run_a = tokio::spawn(a.run(CancellationToken::new()));
        assert!(status_a.acquired().await.is_ok());
        let cancel_b = CancellationToken::new();
        let run_b = tokio::spawn(b.run(cancel_b.clone()));
        tokio::time::sleep(Duration::from_secs(5)).await;
        // a dies without releasing (kill -9).
        run_a.abort();
        let died = Instant::now();
        assert!(status_b.acquired().await.is_ok());
        let waited = died.elapsed();
        // a's last renew was at most 2 s before it died; b takes over 15 s after it last saw
        // the lease change, on its next 2 s attempt.
        assert!(
            waited >= Duration::from_secs(13),
            "took over after {waited:?}"
        );
        assert!(
            waited <= Duration::from_secs(17),
            "took over after {waited:?}"
        );
        assert_eq!(
            with(&server, |s| s.holder()).flatten().as_deref(),
            Some("b")
        );
        cancel_b.cancel();
        assert!(matches!(run_b.await, Ok(Ok(()))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_cannot_renew_steps_down_after_the_renew_deadline() {
        let server = Server::default();
        let (a, status) = LeaderElector::new(client(&server), config("a"));
        let run = tokio::spawn(a.run(CancellationToken::new()));
        assert!(status.acquired().await.is_ok());
        let mut lost = std::pin::pin!(status.lost());
        tokio::time::sleep(Duration::from_secs(1)).await;
        with(&server, |s| s.down = true);
        let outage = Instant::now();
        lost.as_mut().await;
        assert!(!status.is_leader());
        // Last renew happened at most 2 s before the outage; the deadline is 10 s after it.
        let after = outage.elapsed();
        assert!(
            after <= Duration::from_secs(10),
            "stepped down after {after:?}"
        );
        assert!(
            after >= Duration::from_secs(8),
            "stepped down after {after:?}"
        );
        assert!(matches!(run.await, Ok(Err(LeaderElectionError::Lost(_)))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_whose_lease_was_taken_steps_down_at_the_next_renew() {
        let server = Server::default();
        let (a, status) = LeaderElector::new(client(&server), config("a"));
        let run = tokio::spawn(a.run(CancellationToken::new()));
        assert!(status.acquired().await.is_ok());
        // Someone else overwrites the lease (a new resourceVersion).
        with(&server, |s| {
            let mut lease = s.lease.clone().unwrap_or_default();
            let mut spec = lease.spec.take().unwrap_or_default();
            spec.holder_identity = Some("intruder".to_owned());
            lease.spec = Some(spec);
            s.handle(
                &Method::PUT,
                &serde_json::to_vec(&lease).unwrap_or_default(),
            )
        });
        let taken = Instant::now();
        status.lost().await;
        assert!(taken.elapsed() <= Duration::from_secs(2));
        assert!(matches!(run.await, Ok(Err(LeaderElectionError::Lost(_)))));
        assert_eq!(
            with(&server, |s| s.holder()).flatten().as_deref(),
            Some("intruder")
        );
    }
}
