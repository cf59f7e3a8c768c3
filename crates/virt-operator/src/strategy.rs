//! Install strategies (upstream's `pkg/virt-operator/resource/generate/install`): the objects
//! of one KubeVirt version and configuration, stored in a ConfigMap of the install namespace
//! so that every operator replica, and a later operator of another version, installs the same
//! objects.
//!
//! ```text
//!  InstallConfig ──kubevirt_install::install_strategy──► objects ──YAML──► ConfigMap
//!      kubevirt-install-strategy-<random>  labels kubevirt.io/install-strategy,
//!      app.kubernetes.io/managed-by=virt-operator; annotations
//!      kubevirt.io/install-strategy-{version,registry,identifier}, the YAML gzip+base64
//!                       │ read back, decoded once per `{version}-{resourceVersion}`
//!                       ▼
//!                 Strategy { id, objects } ──► installer::install
//! ```
//!
//! Upstream runs the target version's operator image as a Job that dumps the strategy into the
//! ConfigMap, so an operator can install a version other than its own. Here the operator
//! generates it in-process: the rendering is a pure function of the configuration and of this
//! binary, so the ConfigMap holds what the dumper of this version would write. (A release
//! imported from another binary needs that binary's rendering: then the dumper comes back as a
//! pod of the target image running `kubevirt-rs manifests`.)
//!
//! # Guarantees
//! One ConfigMap per `(version, registry, identifier)`: an existing one is reused; two replicas
//! racing may both create one (upstream has the same race), and either is used.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The label of install strategy ConfigMaps (upstream's `InstallStrategyLabel`).
pub const STRATEGY_LABEL: &str = "kubevirt.io/install-strategy";
/// The version annotation (upstream's `InstallStrategyVersionAnnotation`).
pub const VERSION_ANNOTATION: &str = "kubevirt.io/install-strategy-version";
/// The registry annotation (upstream's `InstallStrategyRegistryAnnotation`).
pub const REGISTRY_ANNOTATION: &str = "kubevirt.io/install-strategy-registry";
/// The deployment-identifier annotation (upstream's `InstallStrategyIdentifierAnnotation`).
pub const IDENTIFIER_ANNOTATION: &str = "kubevirt.io/install-strategy-identifier";
/// The label of everything the operator installs (upstream's `ManagedByLabel`).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "virt-operator";
/// The ConfigMaps' name prefix (upstream's).
pub const NAME_PREFIX: &str = "kubevirt-install-strategy-";
/// The data key of the manifests (upstream's).
const MANIFESTS_KEY: &str = "manifests";
/// The encoding annotation (upstream's `InstallStrategyConfigMapEncoding`).
pub const ENCODING_ANNOTATION: &str = "kubevirt.io/install-strategy-cm-encoding";
/// Upstream's encoding: the YAML gzipped, then base64 (a strategy with the CRDs is larger than
/// an object may be).
pub const GZIP_BASE64: &str = "gzip+base64";

fn encode(manifests: &str) -> String {
    use base64::Engine;
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(manifests.as_bytes());
    let bytes = gz.finish().unwrap_or_default();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn decode(text: &str, encoding: Option<&str>) -> Result<String, String> {
    use base64::Engine;
    use std::io::Read;
    match encoding {
        None | Some("") => Ok(text.to_owned()),
        Some(GZIP_BASE64) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|e| e.to_string())?;
            let mut out = String::new();
            flate2::read::GzDecoder::new(&bytes[..])
                .read_to_string(&mut out)
                .map_err(|e| e.to_string())?;
            Ok(out)
        }
        Some(other) => Err(format!("unknown encoding {other:?}")),
    }
}

/// Failures producing or reading an install strategy.
#[derive(Debug, thiserror::Error)]
pub enum StrategyError {
    /// Rendering the objects failed (a bug).
    #[error("rendering the install strategy")]
    Render(#[source] kubevirt_install::InstallError),
    /// Listing, reading or creating the ConfigMap failed.
    #[error("{what} the install strategy ConfigMap")]
    Store {
        /// The operation.
        what: &'static str,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The ConfigMap's manifests are not in a known encoding.
    #[error("decoding the manifests of ConfigMap {name}: {reason}")]
    Encoding {
        /// The ConfigMap.
        name: String,
        /// Why.
        reason: String,
    },
    /// The ConfigMap's manifests do not decode.
    #[error("decoding the manifests of ConfigMap {name}")]
    Decode {
        /// The ConfigMap.
        name: String,
        /// The cause.
        #[source]
        source: Box<serde_saphyr::Error>,
    },
}

/// One version's install strategy.
#[derive(Clone, Debug, PartialEq)]
pub struct Strategy {
    /// `kubevirt.io/install-strategy-version`: the image tag.
    pub version: String,
    /// `kubevirt.io/install-strategy-registry`.
    pub registry: String,
    /// `kubevirt.io/install-strategy-identifier`: the deployment ID (`observedDeploymentID`).
    pub id: String,
    /// The ConfigMap it was read from.
    pub config_map: String,
    /// The objects, in upstream's install order.
    pub objects: Arc<Vec<Value>>,
}

/// Decoded strategies by `{version}-{resourceVersion}` of their ConfigMap, and the last
/// rendering with the configuration it was rendered for (rendering, encoding and hashing every
/// manifest took about 3 s of a debug build on each pass).
#[derive(Default)]
pub struct StrategyCache {
    decoded: Mutex<HashMap<String, Arc<Vec<Value>>>>,
    rendered: Mutex<Option<(kubevirt_install::InstallConfig, ConfigMap)>>,
}

/// The deployment ID of a rendering: the first 16 hex digits of the SHA-256 of its manifests.
#[must_use]
pub fn deployment_id(manifests: &str) -> String {
    let digest = Sha256::digest(manifests.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The ConfigMap of `config`'s strategy (not yet created: its name is generated).
///
/// # Errors
/// [`StrategyError::Render`] (a bug).
pub fn config_map(config: &kubevirt_install::InstallConfig) -> Result<ConfigMap, StrategyError> {
    let objects = kubevirt_install::install_strategy(config).map_err(StrategyError::Render)?;
    let manifests = kubevirt_install::render_yaml(&objects).map_err(StrategyError::Render)?;
    let id = deployment_id(&manifests);
    let pairs = |p: &[(&str, &str)]| {
        Some(
            p.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    };
    Ok(ConfigMap {
        metadata: ObjectMeta {
            generate_name: Some(NAME_PREFIX.into()),
            namespace: Some(config.namespace.clone()),
            labels: pairs(&[(MANAGED_BY_LABEL, MANAGED_BY), (STRATEGY_LABEL, "")]),
            annotations: pairs(&[
                (VERSION_ANNOTATION, &config.image_tag),
                (REGISTRY_ANNOTATION, &config.image_registry),
                (IDENTIFIER_ANNOTATION, &id),
                (ENCODING_ANNOTATION, GZIP_BASE64),
            ]),
            ..ObjectMeta::default()
        },
        data: Some([(MANIFESTS_KEY.to_owned(), encode(&manifests))].into()),
        ..ConfigMap::default()
    })
}

fn annotation<'a>(cm: &'a ConfigMap, key: &str) -> Option<&'a str> {
    cm.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

impl StrategyCache {
    /// The strategy of `config`: its ConfigMap found (or created) in the namespace, its
    /// objects decoded from there (once per `{version}-{resourceVersion}`).
    ///
    /// # Errors
    /// When the ConfigMap cannot be listed, created or decoded.
    pub async fn ensure(
        &self,
        admin: &kube::Client,
        config: &kubevirt_install::InstallConfig,
    ) -> Result<Strategy, StrategyError> {
        let cached = self.rendered.lock().ok().and_then(|r| {
            r.as_ref()
                .filter(|(c, _)| c == config)
                .map(|(_, cm)| cm.clone())
        });
        let wanted = match cached {
            Some(cm) => cm,
            None => {
                let cm = config_map(config)?;
                if let Ok(mut rendered) = self.rendered.lock() {
                    *rendered = Some((config.clone(), cm.clone()));
                }
                cm
            }
        };
        let id = annotation(&wanted, IDENTIFIER_ANNOTATION)
            .unwrap_or_default()
            .to_owned();
        let api: Api<ConfigMap> = Api::namespaced(admin.clone(), &config.namespace);
        let existing = api
            .list(&ListParams::default().labels(STRATEGY_LABEL))
            .await
            .map_err(|source| StrategyError::Store {
                what: "listing",
                source,
            })?
            .items
            .into_iter()
            .find(|cm| {
                annotation(cm, VERSION_ANNOTATION) == Some(config.image_tag.as_str())
                    && annotation(cm, REGISTRY_ANNOTATION) == Some(config.image_registry.as_str())
                    && annotation(cm, IDENTIFIER_ANNOTATION) == Some(id.as_str())
            });
        let cm = match existing {
            Some(cm) => cm,
            None => {
                let created =
                    api.create(&PostParams::default(), &wanted)
                        .await
                        .map_err(|source| StrategyError::Store {
                            what: "creating",
                            source,
                        })?;
                tracing::info!(
                    name = created.metadata.name.as_deref().unwrap_or_default(),
                    version = %config.image_tag,
                    id,
                    "install strategy created"
                );
                created
            }
        };
        let name = cm.metadata.name.clone().unwrap_or_default();
        let key = format!(
            "{}-{}",
            config.image_tag,
            cm.metadata.resource_version.as_deref().unwrap_or_default()
        );
        let cached = self.decoded.lock().ok().and_then(|c| c.get(&key).cloned());
        let objects = match cached {
            Some(objects) => objects,
            None => {
                let raw = cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get(MANIFESTS_KEY))
                    .map_or("", String::as_str);
                let text = decode(raw, annotation(&cm, ENCODING_ANNOTATION)).map_err(|reason| {
                    StrategyError::Encoding {
                        name: name.clone(),
                        reason,
                    }
                })?;
                let objects: Vec<Value> =
                    serde_saphyr::from_multiple(&text).map_err(|source| StrategyError::Decode {
                        name: name.clone(),
                        source: Box::new(source),
                    })?;
                let objects = Arc::new(objects);
                if let Ok(mut cache) = self.decoded.lock() {
                    cache.insert(key, Arc::clone(&objects));
                }
                objects
            }
        };
        Ok(Strategy {
            version: config.image_tag.clone(),
            registry: config.image_registry.clone(),
            id,
            config_map: name,
            objects,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_map_carries_upstreams_label_annotations_and_decodes_to_the_rendering() {
        let config = kubevirt_install::InstallConfig::default();
        let cm = config_map(&config).unwrap();
        assert_eq!(cm.metadata.generate_name.as_deref(), Some(NAME_PREFIX));
        assert!(
            cm.metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key(STRATEGY_LABEL)
        );
        assert_eq!(
            annotation(&cm, VERSION_ANNOTATION),
            Some(config.image_tag.as_str())
        );
        assert_eq!(annotation(&cm, REGISTRY_ANNOTATION), Some("kubevirt-rs"));
        let raw = &cm.data.as_ref().unwrap()[MANIFESTS_KEY];
        assert!(raw.len() < 1024 * 1024, "{} bytes", raw.len());
        let text = decode(raw, annotation(&cm, ENCODING_ANNOTATION)).unwrap();
        let decoded: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        assert_eq!(
            decoded,
            kubevirt_install::install_strategy(&config).unwrap()
        );
        // Another configuration is another deployment.
        let other = kubevirt_install::InstallConfig {
            image_tag: "v2".into(),
            ..config
        };
        assert_ne!(
            annotation(&config_map(&other).unwrap(), IDENTIFIER_ANNOTATION),
            annotation(&cm, IDENTIFIER_ANNOTATION)
        );
    }
}
