//! A minimal stand-in for virt-operator's certificate management, until the operator exists:
//! the KubeVirt CA in the Secret `kubevirt-ca` of KubeVirt's namespace (upstream's name and
//! layout: a `kubernetes.io/tls` Secret with `tls.crt` and `tls.key`, subject `kubevirt.io`),
//! created when missing, and the components' serving and client certificates issued from it
//! (virt-api's own, when it runs without mounted certificates, and the installer's
//! [`crate::installer`] Secrets).
//!
//! # Guarantees
//! Several virt-api processes starting at once agree on one CA: the Secret is created with
//! `create` (the loser of a race reads the winner's) and renewed with `replace` on the
//! `resourceVersion` it read (a conflict reads the Secret again).
//!
//! # Caveats
//! A CA with less than a fifth of its lifetime ([`CA_LIFETIME`], upstream's 7 days) left is
//! replaced, and the registration objects then trust the new CA only (upstream's operator keeps
//! the old one in the bundle until every leaf it signed has expired); a replica still serving
//! a leaf of the old CA is refused until its next rotation. Leaves live [`LEAF_LIFETIME`]
//! (upstream's 24 hours).

use anyhow::{Context, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
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
/// Certificates are valid from this long before they are issued, for clocks that lag.
const CLOCK_SKEW: time::Duration = time::Duration::minutes(5);
const CA_SUBJECT: &str = "kubevirt.io";

/// The KubeVirt CA: its certificate (PEM) and key.
pub struct KubeVirtCa {
    /// The CA certificate, PEM: the `caBundle` of the registration objects.
    pub cert_pem: String,
    key: KeyPair,
}

fn validity(p: &mut CertificateParams, lifetime: time::Duration) {
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - CLOCK_SKEW;
    p.not_after = now + lifetime;
}

fn ca_params() -> anyhow::Result<CertificateParams> {
    let mut p = CertificateParams::new(Vec::<String>::new()).context("CA parameters")?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_SUBJECT);
    p.distinguished_name = dn;
    validity(&mut p, CA_LIFETIME);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

/// Whether a CA certificate must be replaced: it does not parse, or less than a fifth of its
/// lifetime is left.
fn needs_renewal(cert_pem: &[u8]) -> bool {
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(cert_pem) else {
        return true;
    };
    let Ok(cert) = pem.parse_x509() else {
        return true;
    };
    let (start, end) = (
        cert.validity().not_before.timestamp(),
        cert.validity().not_after.timestamp(),
    );
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    end - now < (end - start) / 5
}

/// The CA stored in `secret`, if it is usable.
fn from_secret(secret: &Secret) -> Option<KubeVirtCa> {
    let data = secret.data.as_ref()?;
    let (cert, key) = (&data.get("tls.crt")?.0, &data.get("tls.key")?.0);
    if needs_renewal(cert) {
        return None;
    }
    let key = KeyPair::from_pem(std::str::from_utf8(key).ok()?).ok()?;
    Some(KubeVirtCa {
        cert_pem: String::from_utf8(cert.clone()).ok()?,
        key,
    })
}

fn new_ca() -> anyhow::Result<KubeVirtCa> {
    let key = KeyPair::generate().context("generating the CA key")?;
    let cert = ca_params()?.self_signed(&key).context("signing the CA")?;
    Ok(KubeVirtCa {
        cert_pem: cert.pem(),
        key,
    })
}

fn secret_of(namespace: &str, ca: &KubeVirtCa, resource_version: Option<String>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(CA_SECRET.into()),
            namespace: Some(namespace.into()),
            resource_version,
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(
            [
                (
                    "tls.crt".to_owned(),
                    ByteString(ca.cert_pem.clone().into_bytes()),
                ),
                (
                    "tls.key".to_owned(),
                    ByteString(ca.key.serialize_pem().into_bytes()),
                ),
            ]
            .into(),
        ),
        ..Default::default()
    }
}

impl KubeVirtCa {
    /// The CA of `namespace`'s Secret [`CA_SECRET`], created (or replaced, when it is
    /// unusable or near its end) as needed; see the module's guarantees.
    ///
    /// # Errors
    /// When the API server refuses, or another writer keeps winning.
    pub async fn load_or_create(client: kube::Client, namespace: &str) -> anyhow::Result<Self> {
        let api: Api<Secret> = Api::namespaced(client, namespace);
        for _ in 0..5 {
            let existing = api
                .get_opt(CA_SECRET)
                .await
                .with_context(|| format!("reading Secret {namespace}/{CA_SECRET}"))?;
            if let Some(ca) = existing.as_ref().and_then(from_secret) {
                return Ok(ca);
            }
            let ca = new_ca()?;
            let result = match existing {
                None => {
                    api.create(&PostParams::default(), &secret_of(namespace, &ca, None))
                        .await
                }
                Some(old) => {
                    tracing::warn!(
                        "the KubeVirt CA is unusable or near its end: issuing a new one"
                    );
                    let secret = secret_of(namespace, &ca, old.metadata.resource_version);
                    api.replace(CA_SECRET, &PostParams::default(), &secret)
                        .await
                }
            };
            match result {
                Ok(_) => {
                    tracing::info!(namespace, secret = CA_SECRET, "KubeVirt CA created");
                    return Ok(ca);
                }
                // Another virt-api wrote it first: use theirs.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("writing Secret {namespace}/{CA_SECRET}"));
                }
            }
        }
        bail!("Secret {namespace}/{CA_SECRET} keeps changing under us")
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
        validity(&mut p, LEAF_LIFETIME);
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![usage];
        p.use_authority_key_identifier_extension = true;
        let ca_key = KeyPair::from_pem(&self.key.serialize_pem()).context("the CA key")?;
        let issuer = Issuer::new(ca_params()?, ca_key);
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

    #[test]
    fn a_new_ca_is_fresh_and_signs_serving_certificates_that_verify_against_it() {
        let ca = new_ca().unwrap();
        assert!(!needs_renewal(ca.cert_pem.as_bytes()));
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
        let ca = new_ca().unwrap();
        let mut secret = secret_of("kubevirt", &ca, None);
        assert!(from_secret(&secret).is_some());
        secret
            .data
            .as_mut()
            .unwrap()
            .insert("tls.crt".into(), ByteString(b"garbage".to_vec()));
        assert!(from_secret(&secret).is_none());
    }
}
