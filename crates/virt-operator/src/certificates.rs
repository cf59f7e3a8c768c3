//! virt-operator's certificate management: the KubeVirt CA in the Secret `kubevirt-ca` of KubeVirt's namespace (upstream's name and
//! layout: a `kubernetes.io/tls` Secret with `tls.crt` and `tls.key`, subject `kubevirt.io`),
//! created when missing, and the components' serving and client certificates issued from it
//! (virt-api's own, when it runs without mounted certificates, and the installer's
//! [`crate::installer`] Secrets).
//!
//! Lifecycle (upstream's `pkg/virt-operator/resource/apply/certificates.go`): the CA lives
//! `spec.certificateRotateStrategy.selfSigned.ca.duration` (7 days) and is replaced
//! `ca.renewBefore` (a fifth of its life) before it ends; leaves live `server.duration`
//! (24 hours) and are renewed `server.renewBefore` (a fifth) before they end, at once when no
//! CA of the bundle signed them, and no later than half the CA's `renewBefore` before their
//! CA ends ([`Lifetimes`], [`leaf_renewal`]). The bundle keeps each previous CA until it expires
//! ([`merge_bundle`]): a certificate it signed is never valid longer than it, so every client
//! with either bundle keeps verifying every certificate still served.
//!
//! # CA rotation
//! A CA is replaced in two steps, so no peer is ever handed a certificate of a CA it does not
//! trust yet. [`propagation`] before the CA's renewal time a successor is generated, stored
//! beside it in the Secret (`next-tls.crt`/`next-tls.key`) and published in every bundle,
//! signing nothing. Once the CA is due and the successor has been out that long — longer than
//! a Secret volume takes to follow its Secret — the successor becomes the CA and signs the
//! leaves as they renew; the old CA stays in the bundle until it expires. Upstream replaces
//! the CA and re-signs every leaf in one pass, which leaves a window in which a peer with the
//! old bundle refuses the new leaves (the rotation test saw 2 of 560 requests fail that way).
//! Only a CA that is missing, unreadable or about to end is replaced at once.
//!
//! # Guarantees
//! Several writers starting at once agree on one CA: the Secret is created with
//! `create` (the loser of a race reads the winner's) and renewed with a merge patch carrying
//! the `resourceVersion` it read (a conflict reads the Secret again).
//!
//! # Caveats
//! A renewed leaf reaches a pod when its node agent next syncs the Secret volume, so
//! `renewBefore` must be longer than that sync period (10 s in our node agent, about a minute
//! in kubelet).

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// The Secret holding the KubeVirt CA (upstream's `KubeVirtCASecretName`).
pub const CA_SECRET: &str = "kubevirt-ca";
/// How long the KubeVirt CA is valid (upstream's default).
pub const CA_LIFETIME: time::Duration = time::Duration::days(7);
/// How long a serving certificate is valid (upstream's default).
pub const LEAF_LIFETIME: time::Duration = time::Duration::hours(24);
/// How long a CA lives, and renews, and how long leaves live, and renew — upstream's
/// `GetCADuration`/`GetCARenewBefore`/`GetCertDuration`/`GetCertRenewBefore` of the CR's
/// `spec.certificateRotateStrategy.selfSigned`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetimes {
    /// `ca.duration` (deprecated `caRotateInterval` first), default 7 days.
    pub ca: time::Duration,
    /// `ca.renewBefore` (deprecated `caOverlapInterval` first), default a fifth of `ca`.
    pub ca_renew_before: time::Duration,
    /// `server.duration` (deprecated `certRotateInterval` first), default 24 hours.
    pub server: time::Duration,
    /// `server.renewBefore`, default a fifth of `server`.
    pub server_renew_before: time::Duration,
}

impl Default for Lifetimes {
    fn default() -> Self {
        Self::from_cr(None)
    }
}

impl Lifetimes {
    /// The lifetimes the CR asks for; a missing or unparsable duration is the default.
    #[must_use]
    pub fn from_cr(cr: Option<&kubevirt_api::v1::KubeVirt>) -> Self {
        let self_signed = cr
            .and_then(|cr| cr.spec.certificate_rotate_strategy.as_ref())
            .and_then(|s| s.self_signed.as_ref());
        let pick = |deprecated: Option<&String>, current: Option<&String>| {
            deprecated
                .or(current)
                .and_then(|d| parse_go_duration(d))
                .filter(|d| d.is_positive())
        };
        let ca_conf = self_signed.and_then(|s| s.ca.as_ref());
        let server_conf = self_signed.and_then(|s| s.server.as_ref());
        let ca = pick(
            self_signed.and_then(|s| s.ca_rotate_interval.as_ref()),
            ca_conf.and_then(|c| c.duration.as_ref()),
        )
        .unwrap_or(CA_LIFETIME);
        let ca_renew_before = pick(
            self_signed.and_then(|s| s.ca_overlap_interval.as_ref()),
            ca_conf.and_then(|c| c.renew_before.as_ref()),
        )
        .unwrap_or(ca / 5);
        let server = pick(
            self_signed.and_then(|s| s.cert_rotate_interval.as_ref()),
            server_conf.and_then(|c| c.duration.as_ref()),
        )
        .unwrap_or(LEAF_LIFETIME);
        let server_renew_before =
            pick(None, server_conf.and_then(|c| c.renew_before.as_ref())).unwrap_or(server / 5);
        Self {
            ca,
            ca_renew_before,
            server,
            server_renew_before,
        }
    }

    /// The lifetimes of the first KubeVirt CR of `namespace` (defaults without one).
    ///
    /// # Errors
    /// When the CRs cannot be listed.
    pub async fn of_namespace(client: &kube::Client, namespace: &str) -> anyhow::Result<Self> {
        let api: Api<kubevirt_api::v1::KubeVirt> = Api::namespaced(client.clone(), namespace);
        let mut crs = api
            .list(&kube::api::ListParams::default())
            .await
            .context("reading the KubeVirt CR")?
            .items;
        crs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(Self::from_cr(crs.first()))
    }
}

/// A Go duration (`168h`, `1h30m`, `-2m`): what Kubernetes' `metav1.Duration` accepts
/// ([`kubevirt_api::duration`]).
#[must_use]
pub fn parse_go_duration(text: &str) -> Option<time::Duration> {
    time::Duration::checked_seconds_f64(kubevirt_api::duration::parse_go_duration_seconds(text)?)
}

/// The validity of a PEM certificate, and the certificate (DER) for signature checks.
fn parse_pem(pem: &[u8]) -> Option<x509_parser::pem::Pem> {
    x509_parser::pem::parse_x509_pem(pem).ok().map(|(_, p)| p)
}

/// `notBefore` and `notAfter` of a PEM certificate.
#[must_use]
pub fn validity_of(cert_pem: &[u8]) -> Option<(time::OffsetDateTime, time::OffsetDateTime)> {
    let pem = parse_pem(cert_pem)?;
    let cert = pem.parse_x509().ok()?;
    let v = cert.validity();
    Some((v.not_before.to_datetime(), v.not_after.to_datetime()))
}

/// Whether the CA certificate `ca_pem` signed the certificate `cert_pem`.
#[must_use]
pub fn signed_by(cert_pem: &[u8], ca_pem: &[u8]) -> bool {
    let (Some(leaf), Some(ca)) = (parse_pem(cert_pem), parse_pem(ca_pem)) else {
        return false;
    };
    let (Ok(leaf), Ok(ca)) = (leaf.parse_x509(), ca.parse_x509()) else {
        return false;
    };
    leaf.issuer() == ca.subject() && leaf.verify_signature(Some(ca.public_key())).is_ok()
}

/// `now`, when a certificate ending at `not_after` outlives a whole `lifetime` from `now`
/// (the CR was patched to a shorter duration: renewing at the old times would keep the old
/// lifetime for days); else `not_after`.
fn shortened(
    not_after: time::OffsetDateTime,
    lifetime: time::Duration,
    now: time::OffsetDateTime,
) -> time::OffsetDateTime {
    if not_after - now > lifetime + time::Duration::SECOND {
        now
    } else {
        not_after
    }
}

/// How long a new CA is published in the bundle before it signs anything: a Secret volume
/// follows its Secret within one resync of the node agent (10 s embedded; kubelet's sync
/// period, about a minute, on a cluster). Capped at half the CA's `renewBefore`
/// ([`propagation`]).
pub const BUNDLE_PROPAGATION: time::Duration = time::Duration::minutes(2);

/// How long the successor of a CA is published before it replaces it: [`BUNDLE_PROPAGATION`],
/// at most half the CA's `renewBefore`.
#[must_use]
pub fn propagation(lifetimes: &Lifetimes) -> time::Duration {
    BUNDLE_PROPAGATION.min(lifetimes.ca_renew_before / 2)
}

/// The lifetime of a successor CA: the CA's duration plus the [`propagation`] it waits
/// before it signs anything, so that once promoted it is current for a whole
/// `duration - renewBefore` like the CA it replaces. (Counting its life from its creation
/// instead shortens every CA after the first by the propagation time, and with short
/// lifetimes leaves a promoted CA due for its own successor at once.)
#[must_use]
pub fn successor_lifetime(lifetimes: &Lifetimes) -> time::Duration {
    lifetimes.ca + propagation(lifetimes)
}

/// When a CA started to be trusted: it was issued, and published in the bundle, in the pass
/// that signed it, [`CLOCK_SKEW`] after its `notBefore`.
fn trusted_since(ca_pem: &[u8]) -> Option<time::OffsetDateTime> {
    validity_of(ca_pem).map(|(not_before, _)| not_before + CLOCK_SKEW)
}

/// When the leaf `cert_pem` must be issued again (`None`: at once), as seen at `now`, given
/// the CA `bundle` (PEM: the current CA, its successor, previous CAs until they expire, as
/// [`merge_bundle`] keeps it).
///
/// A leaf is issued again at once when it does not parse or no CA of the bundle signed it.
/// Otherwise it renews `renewBefore` before it ends, at once when it outlives a whole
/// `server.duration` from now, and no later than half the CA's `renewBefore` before its
/// signing CA ends (upstream's `NextRotationDeadline`): a leaf the previous CA signed is
/// re-signed by the current one while both are trusted.
#[must_use]
pub fn leaf_renewal(
    cert_pem: &[u8],
    bundle: &[u8],
    lifetimes: &Lifetimes,
    now: time::OffsetDateTime,
) -> Option<time::OffsetDateTime> {
    let cas = pem_blocks(std::str::from_utf8(bundle).ok()?);
    let signer = cas.iter().find(|ca| signed_by(cert_pem, ca.as_bytes()))?;
    let (_, not_after) = validity_of(cert_pem)?;
    let (_, signer_not_after) = validity_of(signer.as_bytes())?;
    let due = (not_after - lifetimes.server_renew_before).min(shortened(
        not_after,
        lifetimes.server,
        now,
    ));
    Some(if signer_not_after < not_after {
        due.min(signer_not_after - lifetimes.ca_renew_before / 2)
    } else {
        due
    })
}

/// How long until `at` (zero when it has come).
#[must_use]
pub fn until(at: time::OffsetDateTime) -> std::time::Duration {
    std::time::Duration::try_from(at - time::OffsetDateTime::now_utc())
        .unwrap_or(std::time::Duration::ZERO)
}

/// When the CA `ca_pem` must be replaced (`None`: at once, it does not parse), as seen at
/// `now`: `renewBefore` before it ends, or `now` when it outlives a whole
/// [`successor_lifetime`] from `now` (the CR was patched to a shorter duration).
#[must_use]
pub fn ca_renewal(
    ca_pem: &[u8],
    lifetimes: &Lifetimes,
    now: time::OffsetDateTime,
) -> Option<time::OffsetDateTime> {
    validity_of(ca_pem).map(|(_, not_after)| {
        let longest = successor_lifetime(lifetimes);
        (not_after - lifetimes.ca_renew_before).min(shortened(not_after, longest, now))
    })
}

/// The CA bundle: `current` first, then its published `successor`, then each CA of `previous`
/// (a PEM bundle) that is none of these nor expired at `now`, once each.
#[must_use]
pub fn merge_bundle(
    current: &str,
    successor: Option<&str>,
    previous: &str,
    now: time::OffsetDateTime,
) -> String {
    let mut bundle = current.trim_end().to_owned();
    bundle.push('\n');
    let mut seen = vec![normalized(current)];
    if let Some(successor) = successor {
        bundle.push_str(successor.trim_end());
        bundle.push('\n');
        seen.push(normalized(successor));
    }
    for block in pem_blocks(previous) {
        let key = normalized(&block);
        if seen.contains(&key) {
            continue;
        }
        if validity_of(block.as_bytes()).is_some_and(|(_, not_after)| not_after > now) {
            bundle.push_str(block.trim_end());
            bundle.push('\n');
            seen.push(key);
        }
    }
    bundle
}

fn normalized(pem: &str) -> String {
    pem.split_whitespace().collect()
}

/// The `CERTIFICATE` blocks of a PEM bundle, each with its armour.
#[must_use]
pub fn pem_blocks(bundle: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    let mut blocks = Vec::new();
    let mut rest = bundle;
    while let Some(start) = rest.find("-----BEGIN CERTIFICATE-----") {
        let Some(end) = rest[start..].find(END) else {
            break;
        };
        let stop = start + end + END.len();
        blocks.push(rest[start..stop].to_owned());
        rest = &rest[stop..];
    }
    blocks
}

/// Certificates are valid from this long before they are issued, for clocks that lag.
const CLOCK_SKEW: time::Duration = time::Duration::minutes(5);
const CA_SUBJECT: &str = "kubevirt.io";

/// The KubeVirt CA: its certificate (PEM) and key, and its published successor.
pub struct KubeVirtCa {
    /// The CA certificate, PEM (the first of the bundle the registration objects trust).
    pub cert_pem: String,
    key: KeyPair,
    lifetimes: Lifetimes,
    /// The CA that will replace this one, already in the bundle (PEM); its key stays in the
    /// Secret until it is promoted.
    pub successor_pem: Option<String>,
}

/// The Secret keys of the successor CA, beside upstream's `tls.crt`/`tls.key` of the current
/// one (upstream has no successor: it replaces the CA in one step).
const SUCCESSOR_CERT: &str = "next-tls.crt";
const SUCCESSOR_KEY: &str = "next-tls.key";

/// A certificate and key as stored.
struct Pair {
    cert_pem: String,
    key: KeyPair,
}

impl Pair {
    fn from_data(data: &BTreeMap<String, ByteString>, cert: &str, key: &str) -> Option<Pair> {
        let cert_pem = String::from_utf8(data.get(cert)?.0.clone()).ok()?;
        validity_of(cert_pem.as_bytes())?;
        let key = KeyPair::from_pem(std::str::from_utf8(&data.get(key)?.0).ok()?).ok()?;
        Some(Pair { cert_pem, key })
    }

    /// A new CA valid for `lifetime`.
    fn generate(lifetime: time::Duration) -> anyhow::Result<Pair> {
        let key = KeyPair::generate().context("generating the CA key")?;
        let cert = ca_params(lifetime)?
            .self_signed(&key)
            .context("signing the CA")?;
        Ok(Pair {
            cert_pem: cert.pem(),
            key,
        })
    }

    fn ends(&self) -> time::OffsetDateTime {
        validity_of(self.cert_pem.as_bytes()).map_or(time::OffsetDateTime::UNIX_EPOCH, |v| v.1)
    }
}

/// What a pass does with the stored CA ([`plan_rotation`]).
enum Rotation {
    /// Nothing: the current CA (and its successor, if one is published) stay.
    Keep,
    /// Publish a successor beside the current CA; it signs nothing yet.
    Prepare,
    /// The successor, published long enough to be in every pod's bundle, becomes current.
    Promote,
    /// A new CA at once: there is no usable one (none, unreadable, expiring before a
    /// successor could reach the pods).
    Replace,
}

/// The CA step of a pass at `now` (see the module's "CA rotation").
fn plan_rotation(
    current: Option<&Pair>,
    successor: Option<&Pair>,
    lifetimes: &Lifetimes,
    now: time::OffsetDateTime,
) -> Rotation {
    let Some(current) = current else {
        return Rotation::Replace;
    };
    let propagation = propagation(lifetimes);
    if current.ends() <= now + propagation {
        return Rotation::Replace;
    }
    let renewal = ca_renewal(current.cert_pem.as_bytes(), lifetimes, now).unwrap_or(now);
    let successor = successor.filter(|s| {
        s.ends() > now + propagation
            && ca_renewal(s.cert_pem.as_bytes(), lifetimes, now).is_some_and(|r| r > now)
    });
    match successor {
        None if renewal - propagation <= now => Rotation::Prepare,
        None => Rotation::Keep,
        Some(s) if renewal <= now && ca_published_for(s, propagation, now) => Rotation::Promote,
        Some(_) => Rotation::Keep,
    }
}

/// Whether the CA `pair` has been in the bundle for `propagation` at `now`.
fn ca_published_for(pair: &Pair, propagation: time::Duration, now: time::OffsetDateTime) -> bool {
    trusted_since(pair.cert_pem.as_bytes()).is_some_and(|t| t + propagation <= now)
}

fn validity(p: &mut CertificateParams, lifetime: time::Duration) {
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - CLOCK_SKEW;
    p.not_after = now + lifetime;
}

fn ca_params(lifetime: time::Duration) -> anyhow::Result<CertificateParams> {
    let mut p = CertificateParams::new(Vec::<String>::new()).context("CA parameters")?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_SUBJECT);
    p.distinguished_name = dn;
    validity(&mut p, lifetime);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

/// The CA Secret as a merge patch: `current` as `tls.crt`/`tls.key`, `successor` as the
/// successor keys (removed when `None`), carrying the `resourceVersion` read.
fn secret_patch(
    namespace: &str,
    current: &Pair,
    successor: Option<&Pair>,
    resource_version: Option<&str>,
) -> serde_json::Value {
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    let mut data = serde_json::json!({
        "tls.crt": b64(&current.cert_pem),
        "tls.key": b64(&current.key.serialize_pem()),
        SUCCESSOR_CERT: null,
        SUCCESSOR_KEY: null,
    });
    if let Some(next) = successor {
        data[SUCCESSOR_CERT] = b64(&next.cert_pem).into();
        data[SUCCESSOR_KEY] = b64(&next.key.serialize_pem()).into();
    }
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": CA_SECRET, "namespace": namespace, "resourceVersion": resource_version},
        "type": "kubernetes.io/tls",
        "data": data,
    })
}

impl KubeVirtCa {
    /// The CA of `namespace`'s Secret [`CA_SECRET`] with the default [`Lifetimes`]; see
    /// [`KubeVirtCa::load_or_rotate`].
    ///
    /// # Errors
    /// When the API server refuses, or another writer keeps winning.
    pub async fn load_or_create(client: kube::Client, namespace: &str) -> anyhow::Result<Self> {
        Self::load_or_rotate(client, namespace, &Lifetimes::default()).await
    }

    /// The CA of `namespace`'s Secret [`CA_SECRET`], created, given a published successor, or
    /// replaced by its successor as due ([`plan_rotation`]; see the module's "CA rotation" and
    /// guarantees). The leaves it issues live `lifetimes.server`.
    ///
    /// # Errors
    /// When the API server refuses, or another writer keeps winning.
    pub async fn load_or_rotate(
        client: kube::Client,
        namespace: &str,
        lifetimes: &Lifetimes,
    ) -> anyhow::Result<Self> {
        let api: Api<Secret> = Api::namespaced(client, namespace);
        for _ in 0..5 {
            let existing = api
                .get_opt(CA_SECRET)
                .await
                .with_context(|| format!("reading Secret {namespace}/{CA_SECRET}"))?;
            let data = existing
                .as_ref()
                .and_then(|s| s.data.clone())
                .unwrap_or_default();
            let current = Pair::from_data(&data, "tls.crt", "tls.key");
            let successor = Pair::from_data(&data, SUCCESSOR_CERT, SUCCESSOR_KEY);
            let now = time::OffsetDateTime::now_utc();
            let (current, successor, what) =
                match plan_rotation(current.as_ref(), successor.as_ref(), lifetimes, now) {
                    Rotation::Keep => {
                        let current = current.context("a kept CA exists")?;
                        return Ok(Self::of(current, successor, lifetimes));
                    }
                    Rotation::Prepare => (
                        current.context("a CA to succeed exists")?,
                        Some(Pair::generate(successor_lifetime(lifetimes))?),
                        "KubeVirt CA successor published",
                    ),
                    Rotation::Promote => (
                        successor.context("a successor to promote exists")?,
                        None,
                        "KubeVirt CA replaced by its successor",
                    ),
                    Rotation::Replace => {
                        (Pair::generate(lifetimes.ca)?, None, "KubeVirt CA created")
                    }
                };
            let patch = secret_patch(
                namespace,
                &current,
                successor.as_ref(),
                existing
                    .as_ref()
                    .and_then(|s| s.metadata.resource_version.as_deref()),
            );
            let result = if existing.is_some() {
                // A merge patch carrying the resourceVersion read: a conflict when another
                // writer came first, and within upstream's RBAC (patch, not update, on the
                // operator's Secrets).
                api.patch(
                    CA_SECRET,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await
            } else {
                let mut object = patch;
                if let Some(data) = object["data"].as_object_mut() {
                    data.retain(|_, v| !v.is_null());
                }
                let secret: Secret = serde_json::from_value(object).context("the CA Secret")?;
                api.create(&PostParams::default(), &secret).await
            };
            match result {
                Ok(_) => {
                    tracing::info!(namespace, secret = CA_SECRET, "{what}");
                    return Ok(Self::of(current, successor, lifetimes));
                }
                // Another writer came first: use theirs.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("writing Secret {namespace}/{CA_SECRET}"));
                }
            }
        }
        bail!("Secret {namespace}/{CA_SECRET} keeps changing under us")
    }

    fn of(current: Pair, successor: Option<Pair>, lifetimes: &Lifetimes) -> Self {
        KubeVirtCa {
            cert_pem: current.cert_pem,
            key: current.key,
            lifetimes: *lifetimes,
            successor_pem: successor.map(|s| s.cert_pem),
        }
    }

    /// When [`KubeVirtCa::load_or_rotate`] next has work: publishing a successor
    /// [`propagation`] before this CA's renewal time, then promoting it once it is both due
    /// and published for that long.
    #[must_use]
    pub fn renewal(&self) -> time::OffsetDateTime {
        let now = time::OffsetDateTime::now_utc();
        let renewal = ca_renewal(self.cert_pem.as_bytes(), &self.lifetimes, now).unwrap_or(now);
        let propagation = propagation(&self.lifetimes);
        match self.successor_pem.as_deref() {
            None => renewal - propagation,
            Some(next) => {
                let published = trusted_since(next.as_bytes()).unwrap_or(now) + propagation;
                renewal.max(published)
            }
        }
    }

    /// A serving certificate for `names` (DNS names or IP addresses), certificate and key as
    /// PEM; its subject is the first name.
    ///
    /// # Errors
    /// When a name is unusable or signing fails.
    pub fn issue_serving(&self, names: Vec<String>) -> anyhow::Result<(String, String)> {
        let cn = names.first().cloned().unwrap_or_default();
        self.issue(&cn, names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate with subject `common_name`, certificate and key as PEM.
    ///
    /// # Errors
    /// When signing fails.
    pub fn issue_client(&self, common_name: &str) -> anyhow::Result<(String, String)> {
        self.issue(common_name, vec![], ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A serving certificate with subject `common_name` (upstream's component identities,
    /// such as `kubevirt.io:system:node:virt-handler`) for `names`.
    ///
    /// # Errors
    /// When a name is unusable or signing fails.
    pub fn issue_serving_as(
        &self,
        common_name: &str,
        names: Vec<String>,
    ) -> anyhow::Result<(String, String)> {
        self.issue(common_name, names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    fn issue(
        &self,
        common_name: &str,
        names: Vec<String>,
        usage: ExtendedKeyUsagePurpose,
    ) -> anyhow::Result<(String, String)> {
        let key = KeyPair::generate().context("generating a key")?;
        let mut p = CertificateParams::new(names).context("certificate parameters")?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        p.distinguished_name = dn;
        validity(&mut p, self.lifetimes.server);
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![usage];
        p.use_authority_key_identifier_extension = true;
        let ca_key = KeyPair::from_pem(&self.key.serialize_pem()).context("the CA key")?;
        let issuer = Issuer::new(ca_params(self.lifetimes.ca)?, ca_key);
        let cert = p
            .signed_by(&key, &issuer)
            .context("signing a certificate")?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// upstream's serving names of a Service: `name`, `name.ns`, `name.ns.svc`,
/// `name.ns.svc.cluster.local` and `name.ns.pod.cluster.local`.
pub fn service_names(name: &str, namespace: &str) -> Vec<String> {
    vec![
        name.to_owned(),
        format!("{name}.{namespace}"),
        format!("{name}.{namespace}.svc"),
        format!("{name}.{namespace}.svc.cluster.local"),
        format!("{name}.{namespace}.pod.cluster.local"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_ca(lifetimes: &Lifetimes) -> anyhow::Result<KubeVirtCa> {
        Ok(KubeVirtCa::of(
            Pair::generate(lifetimes.ca)?,
            None,
            lifetimes,
        ))
    }

    fn needs_renewal(cert_pem: &[u8], lifetimes: &Lifetimes) -> bool {
        {
            let now = time::OffsetDateTime::now_utc();
            ca_renewal(cert_pem, lifetimes, now).is_none_or(|at| at <= now)
        }
    }

    fn pair_of(ca: &KubeVirtCa) -> Pair {
        Pair {
            cert_pem: ca.cert_pem.clone(),
            key: KeyPair::from_pem(&ca.key.serialize_pem()).unwrap(),
        }
    }

    #[test]
    fn a_new_ca_is_fresh_and_signs_serving_certificates_that_verify_against_it() {
        let ca = new_ca(&Lifetimes::default()).unwrap();
        assert!(!needs_renewal(
            ca.cert_pem.as_bytes(),
            &Lifetimes::default()
        ));
        let (cert, _key) = ca.issue_serving(vec!["127.0.0.1".into()]).unwrap();
        let (_, ca_pem) = x509_parser::pem::parse_x509_pem(ca.cert_pem.as_bytes()).unwrap();
        let ca_cert = ca_pem.parse_x509().unwrap();
        let (_, leaf_pem) = x509_parser::pem::parse_x509_pem(cert.as_bytes()).unwrap();
        let leaf = leaf_pem.parse_x509().unwrap();
        leaf.verify_signature(Some(ca_cert.public_key())).unwrap();
        assert_eq!(leaf.issuer(), ca_cert.subject());
    }

    #[test]
    fn a_secret_without_a_parsable_ca_is_not_used() {
        let ca = new_ca(&Lifetimes::default()).unwrap();
        let patch = secret_patch("kubevirt", &pair_of(&ca), None, None);
        let decode = |v: &serde_json::Value| {
            ByteString(
                base64::engine::general_purpose::STANDARD
                    .decode(v.as_str().unwrap())
                    .unwrap(),
            )
        };
        let mut data: BTreeMap<String, ByteString> = BTreeMap::new();
        for key in ["tls.crt", "tls.key"] {
            data.insert(key.into(), decode(&patch["data"][key]));
        }
        assert!(
            patch["data"][SUCCESSOR_CERT].is_null(),
            "a merge patch removes it"
        );
        assert!(Pair::from_data(&data, "tls.crt", "tls.key").is_some());
        assert!(Pair::from_data(&data, SUCCESSOR_CERT, SUCCESSOR_KEY).is_none());
        data.insert("tls.crt".into(), ByteString(b"garbage".to_vec()));
        assert!(Pair::from_data(&data, "tls.crt", "tls.key").is_none());
    }

    fn lifetimes(ca: i64, ca_renew: i64, server: i64, server_renew: i64) -> Lifetimes {
        Lifetimes {
            ca: time::Duration::seconds(ca),
            ca_renew_before: time::Duration::seconds(ca_renew),
            server: time::Duration::seconds(server),
            server_renew_before: time::Duration::seconds(server_renew),
        }
    }

    /// A self-signed CA whose validity ended `ago` ago.
    fn expired_ca(ago: time::Duration) -> String {
        let key = KeyPair::generate().unwrap();
        let mut p = ca_params(CA_LIFETIME).unwrap();
        p.not_after = time::OffsetDateTime::now_utc() - ago;
        p.not_before = p.not_after - time::Duration::hours(1);
        p.self_signed(&key).unwrap().pem()
    }

    fn not_after(pem: &str) -> time::OffsetDateTime {
        validity_of(pem.as_bytes()).unwrap().1
    }

    #[test]
    fn go_durations_become_time_durations() {
        let d = |s| parse_go_duration(s).map(time::Duration::whole_milliseconds);
        assert_eq!(d("1h30m"), Some(5_400_000));
        assert_eq!(d("-2m"), Some(-120_000));
        assert_eq!(d("3d"), None);
    }

    #[test]
    fn lifetimes_default_to_upstream_and_follow_the_cr() {
        let defaults = Lifetimes::from_cr(None);
        assert_eq!(defaults.ca, time::Duration::hours(168));
        assert_eq!(defaults.ca_renew_before, time::Duration::minutes(2016));
        assert_eq!(defaults.server, time::Duration::hours(24));
        assert_eq!(defaults.server_renew_before, time::Duration::minutes(288));

        let cr: kubevirt_api::v1::KubeVirt = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {"certificateRotateStrategy": {"selfSigned": {
                "ca": {"duration": "60s", "renewBefore": "30s"},
                "server": {"duration": "20s"},
            }}},
        }))
        .unwrap();
        assert_eq!(Lifetimes::from_cr(Some(&cr)), lifetimes(60, 30, 20, 4));

        let deprecated: kubevirt_api::v1::KubeVirt = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {"certificateRotateStrategy": {"selfSigned": {
                "caRotateInterval": "2h", "certRotateInterval": "1h", "caOverlapInterval": "10m",
                "ca": {"duration": "60s"}, "server": {"duration": "nonsense"},
            }}},
        }))
        .unwrap();
        assert_eq!(
            Lifetimes::from_cr(Some(&deprecated)),
            lifetimes(7200, 600, 3600, 720)
        );
    }

    #[test]
    fn a_leaf_renews_before_its_end_and_at_once_when_a_foreign_ca_signed_it() {
        let l = lifetimes(7 * 86_400, 86_400, 3_600, 600);
        let ca = new_ca(&l).unwrap();
        let (leaf, _) = ca.issue_client("someone").unwrap();
        let due = leaf_renewal(
            leaf.as_bytes(),
            ca.cert_pem.as_bytes(),
            &l,
            time::OffsetDateTime::now_utc(),
        )
        .unwrap();
        assert_eq!(due, not_after(&leaf) - time::Duration::seconds(600));

        let other = new_ca(&l).unwrap();
        assert!(!signed_by(leaf.as_bytes(), other.cert_pem.as_bytes()));
        assert_eq!(
            leaf_renewal(
                leaf.as_bytes(),
                other.cert_pem.as_bytes(),
                &l,
                time::OffsetDateTime::now_utc()
            ),
            None
        );
        assert_eq!(
            leaf_renewal(
                b"garbage",
                ca.cert_pem.as_bytes(),
                &l,
                time::OffsetDateTime::now_utc()
            ),
            None
        );
    }

    #[test]
    fn certificates_renew_at_once_when_the_cr_shortens_their_lifetime() {
        let long = lifetimes(7 * 86_400, 86_400, 86_400, 3_600);
        let ca = new_ca(&long).unwrap();
        let (leaf, _) = ca.issue_serving(vec!["virt-api".into()]).unwrap();
        let short = lifetimes(60, 30, 30, 15);
        let now = time::OffsetDateTime::now_utc();
        // Due at the very `now` it is asked at (a later clock read inside would make the
        // caller's `due > now` keep the leaf for ever).
        let due = leaf_renewal(leaf.as_bytes(), ca.cert_pem.as_bytes(), &short, now).unwrap();
        assert_eq!(due, now);
        let ca_due = ca_renewal(
            ca.cert_pem.as_bytes(),
            &short,
            time::OffsetDateTime::now_utc(),
        )
        .unwrap();
        assert!(ca_due <= now + time::Duration::SECOND, "{ca_due} vs {now}");
        assert!(needs_renewal(ca.cert_pem.as_bytes(), &short));
        // Under the lifetimes they were issued with, nothing is due.
        assert!(!needs_renewal(ca.cert_pem.as_bytes(), &long));
        let due = leaf_renewal(
            leaf.as_bytes(),
            ca.cert_pem.as_bytes(),
            &long,
            time::OffsetDateTime::now_utc(),
        )
        .unwrap();
        assert!(due > now + time::Duration::hours(20));
    }

    #[test]
    fn a_leaf_outliving_its_ca_renews_half_the_ca_overlap_before_the_ca_ends() {
        let l = lifetimes(600, 120, 3_600, 600);
        let ca = new_ca(&l).unwrap();
        let (leaf, _) = ca.issue_serving(vec!["virt-api".into()]).unwrap();
        let due = leaf_renewal(
            leaf.as_bytes(),
            ca.cert_pem.as_bytes(),
            &l,
            time::OffsetDateTime::now_utc(),
        )
        .unwrap();
        assert_eq!(due, not_after(&ca.cert_pem) - time::Duration::seconds(60));
        assert_eq!(
            ca_renewal(ca.cert_pem.as_bytes(), &l, time::OffsetDateTime::now_utc()).unwrap(),
            not_after(&ca.cert_pem) - time::Duration::seconds(120)
        );
    }

    /// A CA as if issued `ago` ago with `lifetimes`.
    fn ca_issued(ago: i64, lifetimes: &Lifetimes) -> Pair {
        let key = KeyPair::generate().unwrap();
        let mut p = ca_params(lifetimes.ca).unwrap();
        let issued = time::OffsetDateTime::now_utc() - time::Duration::seconds(ago);
        p.not_before = issued - CLOCK_SKEW;
        p.not_after = issued + lifetimes.ca;
        Pair {
            cert_pem: p.self_signed(&key).unwrap().pem(),
            key,
        }
    }

    fn plan(current: Option<&Pair>, successor: Option<&Pair>, l: &Lifetimes) -> &'static str {
        match plan_rotation(current, successor, l, time::OffsetDateTime::now_utc()) {
            Rotation::Keep => "keep",
            Rotation::Prepare => "prepare",
            Rotation::Promote => "promote",
            Rotation::Replace => "replace",
        }
    }

    #[test]
    fn a_ca_is_succeeded_in_two_steps_published_first_then_promoted() {
        // CA 600 s, renewed 120 s before its end (at 480 s); propagation min(2 min, 60 s).
        let l = lifetimes(600, 120, 60, 12);
        assert_eq!(propagation(&l), time::Duration::seconds(60));
        assert_eq!(propagation(&Lifetimes::default()), BUNDLE_PROPAGATION);
        assert_eq!(plan(None, None, &l), "replace");
        let fresh = ca_issued(0, &l);
        assert_eq!(plan(Some(&fresh), None, &l), "keep");
        // One propagation before its renewal time, a successor is published beside it...
        let due_soon = ca_issued(430, &l);
        assert_eq!(plan(Some(&due_soon), None, &l), "prepare");
        let just_published = ca_issued(0, &l);
        assert_eq!(plan(Some(&due_soon), Some(&just_published), &l), "keep");
        // ...and promoted once the CA is due and the successor has been out that long.
        let due = ca_issued(490, &l);
        assert_eq!(plan(Some(&due), Some(&just_published), &l), "keep");
        let published = ca_issued(61, &l);
        assert_eq!(plan(Some(&due), Some(&published), &l), "promote");
        assert_eq!(plan(Some(&due_soon), Some(&published), &l), "keep");
        // A CA about to end cannot wait for a successor to propagate.
        let ending = ca_issued(560, &l);
        assert_eq!(plan(Some(&ending), Some(&just_published), &l), "replace");
        // A successor that is itself due (the CR shortened it) is replaced by a new one.
        let short = lifetimes(60, 30, 30, 15);
        let long_lived = ca_issued(0, &Lifetimes::default());
        assert_eq!(plan(Some(&long_lived), None, &short), "prepare");
        assert_eq!(
            plan(
                Some(&long_lived),
                Some(&ca_issued(0, &Lifetimes::default())),
                &short
            ),
            "prepare"
        );
    }

    #[test]
    fn a_promoted_successor_is_current_for_a_whole_duration_less_renew_before() {
        // CA 60 s renewed 30 s before its end; propagation 15 s (the rotation test's values).
        let l = lifetimes(60, 30, 30, 15);
        let p = propagation(&l);
        assert_eq!(successor_lifetime(&l), time::Duration::seconds(75));
        let key = KeyPair::generate().unwrap();
        let successor = Pair {
            cert_pem: ca_params(successor_lifetime(&l))
                .unwrap()
                .self_signed(&key)
                .unwrap()
                .pem(),
            key,
        };
        let now = time::OffsetDateTime::now_utc();
        // Not mistaken for a CA the CR shortened, while it waits...
        let renewal = ca_renewal(successor.cert_pem.as_bytes(), &l, now).unwrap();
        assert!(renewal > now, "{renewal} > {now}");
        // ...and once promoted, one propagation later, it is due only `60 - 30` s after that.
        let promoted_at = now + p;
        let current_for = renewal - promoted_at;
        assert!(
            (current_for - time::Duration::seconds(30)).abs() <= time::Duration::SECOND,
            "{current_for}"
        );
        // So its own successor is not due at the moment it is promoted.
        assert!(renewal - p > promoted_at);
    }

    #[test]
    fn the_ca_pass_is_scheduled_for_publishing_then_for_promoting() {
        let l = lifetimes(600, 120, 60, 12);
        let current = ca_issued(0, &l);
        let renewal = ca_renewal(
            current.cert_pem.as_bytes(),
            &l,
            time::OffsetDateTime::now_utc(),
        )
        .unwrap();
        let alone = KubeVirtCa::of(pair_of_pair(&current), None, &l);
        assert_eq!(alone.renewal(), renewal - time::Duration::seconds(60));
        let successor = ca_issued(0, &l);
        let published = trusted_since(successor.cert_pem.as_bytes()).unwrap();
        let both = KubeVirtCa::of(pair_of_pair(&current), Some(successor), &l);
        assert_eq!(
            both.renewal(),
            renewal.max(published + time::Duration::seconds(60))
        );
    }

    fn pair_of_pair(p: &Pair) -> Pair {
        Pair {
            cert_pem: p.cert_pem.clone(),
            key: KeyPair::from_pem(&p.key.serialize_pem()).unwrap(),
        }
    }

    #[test]
    fn a_leaf_of_the_previous_ca_stays_valid_until_due_and_a_stray_leaf_renews_at_once() {
        let l = Lifetimes::default();
        let (old, current) = (new_ca(&l).unwrap(), new_ca(&l).unwrap());
        let bundle = format!("{}{}", current.cert_pem, old.cert_pem);
        let (leaf, _) = old.issue_client("someone").unwrap();
        let now = time::OffsetDateTime::now_utc();
        let due = leaf_renewal(leaf.as_bytes(), bundle.as_bytes(), &l, now).unwrap();
        assert_eq!(due, not_after(&leaf) - l.server_renew_before);
        let stray = new_ca(&l).unwrap().issue_client("someone").unwrap().0;
        assert_eq!(
            leaf_renewal(stray.as_bytes(), bundle.as_bytes(), &l, now),
            None
        );
    }

    #[test]
    fn the_bundle_keeps_previous_cas_until_they_expire_current_first_once_each() {
        let l = Lifetimes::default();
        let (old, current) = (new_ca(&l).unwrap(), new_ca(&l).unwrap());
        let expired = expired_ca(time::Duration::minutes(1));
        let now = time::OffsetDateTime::now_utc();
        let previous = format!("{}{}{}", old.cert_pem, expired, current.cert_pem);
        let bundle = merge_bundle(&current.cert_pem, None, &previous, now);
        let blocks = pem_blocks(&bundle);
        assert_eq!(blocks.len(), 2, "{bundle}");
        assert_eq!(normalized(&blocks[0]), normalized(&current.cert_pem));
        assert_eq!(normalized(&blocks[1]), normalized(&old.cert_pem));
        // Once the old CA has expired, it leaves the bundle.
        let later = not_after(&old.cert_pem) + time::Duration::seconds(1);
        assert_eq!(
            pem_blocks(&merge_bundle(&current.cert_pem, None, &bundle, later)).len(),
            1
        );
        // A bundle that is the current CA alone stays as it is.
        assert_eq!(
            merge_bundle(&current.cert_pem, None, "", now),
            merge_bundle(&current.cert_pem, None, &current.cert_pem, now)
        );
    }
}
