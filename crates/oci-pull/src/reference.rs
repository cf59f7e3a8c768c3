//! Image references as container runtimes read them: `[registry/]repository[:tag][@digest]`.
//!
//! The first component is a registry when it holds a `.` or a `:` or is `localhost`;
//! otherwise the registry is `docker.io`, and a one-component repository gets `library/`
//! (`cirros` → `docker.io/library/cirros:latest`). Without a tag or digest the tag is
//! `latest`. Digests must be `sha256:` and 64 lower-case hex digits.

use std::fmt;
use std::net::IpAddr;

/// The registry of references that name none.
pub const DEFAULT_REGISTRY: &str = "docker.io";
/// The tag of references that name neither tag nor digest.
pub const DEFAULT_TAG: &str = "latest";

/// Why a reference is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// The reference is empty.
    #[error("the image reference is empty")]
    Empty,
    /// The registry part is not a host name or address with an optional port.
    #[error("image reference {reference:?}: invalid registry {registry:?}")]
    Registry {
        /// The whole reference.
        reference: String,
        /// The registry part.
        registry: String,
    },
    /// A repository component is empty or holds characters outside `a-z0-9._-`.
    #[error(
        "image reference {0:?}: the repository must be lower-case letters, digits and separators (., _, -) between slashes"
    )]
    Repository(String),
    /// The tag is empty, too long or holds characters outside `A-Za-z0-9_.-`.
    #[error("image reference {0:?}: invalid tag")]
    Tag(String),
    /// The digest is not `sha256:` with 64 lower-case hex digits.
    #[error(
        "image reference {0:?}: the digest must be sha256: followed by 64 lower-case hex digits"
    )]
    Digest(String),
}

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImageReference {
    /// Registry host with optional port (`docker.io`, `127.0.0.1:5000`, `[::1]:5000`).
    pub registry: String,
    /// Repository path (`library/cirros`).
    pub repository: String,
    /// Tag; `latest` when neither tag nor digest was given.
    pub tag: Option<String>,
    /// `sha256:<hex>` digest.
    pub digest: Option<String>,
}

impl ImageReference {
    /// Parses `reference`.
    ///
    /// # Errors
    /// [`ReferenceError`] naming what is wrong.
    pub fn parse(reference: &str) -> Result<ImageReference, ReferenceError> {
        let whole = reference.trim();
        if whole.is_empty() {
            return Err(ReferenceError::Empty);
        }
        let (name, digest) = match whole.split_once('@') {
            Some((name, digest)) => {
                if !is_sha256_digest(digest) {
                    return Err(ReferenceError::Digest(whole.to_owned()));
                }
                (name, Some(digest.to_owned()))
            }
            None => (whole, None),
        };
        let last_slash = name.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match name[last_slash..].rfind(':') {
            Some(i) => {
                let tag = &name[last_slash + i + 1..];
                if !is_tag(tag) {
                    return Err(ReferenceError::Tag(whole.to_owned()));
                }
                (&name[..last_slash + i], Some(tag.to_owned()))
            }
            None => (name, None),
        };
        let (registry, repository) = match name.split_once('/') {
            Some((first, rest))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                if !is_registry(first) {
                    return Err(ReferenceError::Registry {
                        reference: whole.to_owned(),
                        registry: first.to_owned(),
                    });
                }
                (first.to_owned(), rest.to_owned())
            }
            Some(_) => (DEFAULT_REGISTRY.to_owned(), name.to_owned()),
            None => (DEFAULT_REGISTRY.to_owned(), format!("library/{name}")),
        };
        if !repository.split('/').all(is_path_component) {
            return Err(ReferenceError::Repository(whole.to_owned()));
        }
        let tag = match (&tag, &digest) {
            (None, None) => Some(DEFAULT_TAG.to_owned()),
            _ => tag,
        };
        Ok(ImageReference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The registry host without its port (`[::1]:5000` → `::1`).
    pub fn host(&self) -> &str {
        host_of(&self.registry)
    }

    /// Whether the registry is on this machine's loopback (`localhost`, `127.0.0.0/8`,
    /// `::1`): only those may be reached over plain HTTP.
    pub fn is_loopback(&self) -> bool {
        let host = self.host();
        host.eq_ignore_ascii_case("localhost")
            || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }

    /// The same image by `digest`.
    pub fn with_digest(&self, digest: &str) -> ImageReference {
        ImageReference {
            digest: Some(digest.to_owned()),
            ..self.clone()
        }
    }

    pub(crate) fn to_client(&self) -> oci_client::Reference {
        match (&self.tag, &self.digest) {
            (Some(tag), Some(digest)) => oci_client::Reference::with_tag_and_digest(
                self.registry.clone(),
                self.repository.clone(),
                tag.clone(),
                digest.clone(),
            ),
            (_, Some(digest)) => oci_client::Reference::with_digest(
                self.registry.clone(),
                self.repository.clone(),
                digest.clone(),
            ),
            (tag, None) => oci_client::Reference::with_tag(
                self.registry.clone(),
                self.repository.clone(),
                tag.clone().unwrap_or_else(|| DEFAULT_TAG.to_owned()),
            ),
        }
    }
}

impl fmt::Display for ImageReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// The host of `registry` (`host`, `host:port`, `[v6]:port`).
pub(crate) fn host_of(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(host, _)| host);
    }
    registry.split_once(':').map_or(registry, |(host, _)| host)
}

/// `sha256:` and 64 lower-case hex digits.
pub fn is_sha256_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn is_tag(tag: &str) -> bool {
    let mut bytes = tag.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
    first_ok
        && tag.len() <= 128
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn is_path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes
            .iter()
            .all(|b| alnum(b) || matches!(b, b'.' | b'_' | b'-'))
}

fn is_registry(registry: &str) -> bool {
    let (host_ok, port) = if let Some(rest) = registry.strip_prefix('[') {
        let Some((host, tail)) = rest.split_once(']') else {
            return false;
        };
        let port = match tail {
            "" => None,
            tail => match tail.strip_prefix(':') {
                Some(port) => Some(port),
                None => return false,
            },
        };
        (host.parse::<std::net::Ipv6Addr>().is_ok(), port)
    } else {
        let (host, port) = match registry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (registry, None),
        };
        (is_dns_name(host), port)
    };
    host_ok && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0))
}

fn is_dns_name(host: &str) -> bool {
    !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> ImageReference {
        ImageReference::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn short_names_default_to_docker_hub_library_and_latest() {
        let r = parse("cirros");
        assert_eq!(r.registry, "docker.io");
        assert_eq!(r.repository, "library/cirros");
        assert_eq!(r.tag.as_deref(), Some("latest"));
        assert_eq!(r.to_string(), "docker.io/library/cirros:latest");
        let r = parse("kubevirt/cirros-container-disk-demo:v1.4");
        assert_eq!(r.registry, "docker.io");
        assert_eq!(r.repository, "kubevirt/cirros-container-disk-demo");
        assert_eq!(r.tag.as_deref(), Some("v1.4"));
    }

    #[test]
    fn a_first_component_with_a_dot_a_port_or_localhost_is_the_registry() {
        let r = parse("127.0.0.1:5000/guest:latest");
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "guest");
        assert!(r.is_loopback());
        let r = parse("quay.io/kubevirt/fedora");
        assert_eq!(r.registry, "quay.io");
        assert!(!r.is_loopback());
        let r = parse("localhost/a/b:1");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("localhost", "a/b")
        );
        assert!(r.is_loopback());
        let r = parse("[::1]:5000/x");
        assert_eq!(r.host(), "::1");
        assert!(r.is_loopback());
        assert!(parse("127.9.9.9:80/x").is_loopback());
        assert!(!parse("128.0.0.1:80/x").is_loopback());
        assert!(!parse("localhost.example.com/x").is_loopback());
    }

    #[test]
    fn digests_are_kept_and_replace_the_default_tag() {
        let hex = "a".repeat(64);
        let r = parse(&format!("127.0.0.1:5000/guest@sha256:{hex}"));
        assert_eq!(r.tag, None);
        assert_eq!(r.digest, Some(format!("sha256:{hex}")));
        let r = parse(&format!("127.0.0.1:5000/guest:v1@sha256:{hex}"));
        assert_eq!(r.tag.as_deref(), Some("v1"));
        assert_eq!(
            r.to_string(),
            format!("127.0.0.1:5000/guest:v1@sha256:{hex}")
        );
    }

    #[test]
    fn malformed_references_are_refused_with_a_reason() {
        let cases = [
            ("", ReferenceError::Empty),
            ("Cirros", ReferenceError::Repository("Cirros".into())),
            ("a//b", ReferenceError::Repository("a//b".into())),
            ("x:", ReferenceError::Tag("x:".into())),
            ("x:-bad", ReferenceError::Tag("x:-bad".into())),
            (
                "x@sha256:abc",
                ReferenceError::Digest("x@sha256:abc".into()),
            ),
            (
                "x@md5:d41d8cd98f00b204e9800998ecf8427e",
                ReferenceError::Digest("x@md5:d41d8cd98f00b204e9800998ecf8427e".into()),
            ),
            (
                "host:99999/x",
                ReferenceError::Registry {
                    reference: "host:99999/x".into(),
                    registry: "host:99999".into(),
                },
            ),
            (
                "../x",
                ReferenceError::Registry {
                    reference: "../x".into(),
                    registry: "..".into(),
                },
            ),
            ("a/../x", ReferenceError::Repository("a/../x".into())),
        ];
        for (input, expected) in cases {
            assert_eq!(ImageReference::parse(input), Err(expected), "{input:?}");
        }
    }
}
