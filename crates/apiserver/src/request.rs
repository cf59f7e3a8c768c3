//! Pure request parsing: URL path and query string → typed values.
//!
//! [`parse_path`] turns `/apis/kubevirt.io/v1/namespaces/default/virtualmachines/vm1/status`
//! into an [`ApiPath`]; [`Query::parse`] turns the query string into typed options. Neither
//! looks at the registry or the store, so both are unit-tested and fuzzable alone. The
//! handlers then pick the verb from the method and the path ([`verb_for`]).

use std::collections::HashMap;

use crate::status::ApiError;

/// A path under `/api` or `/apis`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiPath {
    /// `/api`: the core group's versions.
    LegacyRoot,
    /// `/apis`: all other groups.
    GroupsRoot,
    /// `/apis/{group}`.
    Group { group: String },
    /// `/api/v1` or `/apis/{group}/{version}`.
    GroupVersion { group: String, version: String },
    /// A resource collection, object or subresource.
    Resource(ResourcePath),
}

/// The resource part of a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourcePath {
    /// API group (`""` for core).
    pub group: String,
    pub version: String,
    /// Namespace from `namespaces/{ns}/…`.
    pub namespace: Option<String>,
    /// Resource plural (`pods`).
    pub plural: String,
    /// Object name, if the path names one.
    pub name: Option<String>,
    /// Subresource (`status`, `binding`, `scale`).
    pub subresource: Option<String>,
    /// The path used the legacy `/watch/` prefix.
    pub legacy_watch: bool,
}

/// Parses a request path.
pub fn parse_path(path: &str) -> Result<ApiPath, ApiError> {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api"] => return Ok(ApiPath::LegacyRoot),
        ["apis"] => return Ok(ApiPath::GroupsRoot),
        ["apis", g] => return Ok(ApiPath::Group { group: (*g).into() }),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::no_route()),
    };
    if rest.is_empty() {
        return Ok(ApiPath::GroupVersion {
            group: group.into(),
            version: version.into(),
        });
    }
    let (legacy_watch, rest) = match rest {
        ["watch", tail @ ..] if !tail.is_empty() => (true, tail),
        _ => (false, rest),
    };
    if rest.iter().any(|s| s.is_empty()) {
        return Err(ApiError::no_route());
    }
    // `namespaces/{ns}/{plural}…` is namespaced unless it is a namespace's own subresource
    // (`namespaces/{name}/status|finalize`).
    let namespaced = rest.len() >= 3
        && rest[0] == "namespaces"
        && !(rest.len() == 3 && matches!(rest[2], "status" | "finalize"));
    let (namespace, tail) = if namespaced {
        (Some(rest[1].to_owned()), &rest[2..])
    } else {
        (None, rest)
    };
    let (plural, name, subresource) = match tail {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(*n), None),
        [p, n, s] => (*p, Some(*n), Some(*s)),
        _ => return Err(ApiError::no_route()),
    };
    Ok(ApiPath::Resource(ResourcePath {
        group: group.into(),
        version: version.into(),
        namespace,
        plural: plural.into(),
        name: name.map(str::to_owned),
        subresource: subresource.map(str::to_owned),
        legacy_watch,
    }))
}

/// `fieldValidation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Drop unknown fields silently.
    Ignore,
    /// Drop them with a warning header each (kube-apiserver's default).
    #[default]
    Warn,
    /// Refuse the request.
    Strict,
}

/// `includeObject` for Table output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IncludeObject {
    None,
    #[default]
    Metadata,
    Object,
}

/// Typed query parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query {
    pub watch: bool,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub timeout_seconds: Option<u64>,
    pub allow_watch_bookmarks: bool,
    pub send_initial_events: Option<bool>,
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    pub field_manager: Option<String>,
    pub grace_period_seconds: Option<i64>,
    pub propagation_policy: Option<String>,
    pub include_object: IncludeObject,
    pub force: bool,
}

fn parse_bool(key: &str, v: &str) -> Result<bool, ApiError> {
    match v {
        "true" | "1" | "" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(ApiError::bad_request(format!(
            "invalid boolean value {v:?} for {key}"
        ))),
    }
}

fn parse_num<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, ApiError> {
    v.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid value {v:?} for {key}")))
}

/// Decodes `%XX` and `+` in a query component.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Splits a raw query string into decoded pairs (later duplicates win).
pub fn query_pairs(raw: &str) -> HashMap<String, String> {
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

impl Query {
    /// Parses a raw query string (without `?`).
    pub fn parse(raw: &str) -> Result<Query, ApiError> {
        let mut q = Query::default();
        for (k, v) in query_pairs(raw) {
            let non_empty = || (!v.is_empty()).then(|| v.clone());
            match k.as_str() {
                "watch" => q.watch = parse_bool(&k, &v)?,
                "resourceVersion" => q.resource_version = non_empty(),
                "resourceVersionMatch" => q.resource_version_match = non_empty(),
                "labelSelector" => q.label_selector = non_empty(),
                "fieldSelector" => q.field_selector = non_empty(),
                "limit" => {
                    let n: i64 = parse_num(&k, &v)?;
                    q.limit = (n > 0).then_some(n as usize);
                }
                "continue" => q.continue_token = non_empty(),
                "timeoutSeconds" => q.timeout_seconds = Some(parse_num(&k, &v)?),
                "allowWatchBookmarks" => q.allow_watch_bookmarks = parse_bool(&k, &v)?,
                "sendInitialEvents" => q.send_initial_events = Some(parse_bool(&k, &v)?),
                "dryRun" => match v.as_str() {
                    "All" => q.dry_run = true,
                    "" => {}
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "unsupported dryRun value {other:?}, supported: All"
                        )));
                    }
                },
                "fieldValidation" => {
                    q.field_validation = match v.as_str() {
                        "Strict" => FieldValidation::Strict,
                        "Warn" | "" => FieldValidation::Warn,
                        "Ignore" => FieldValidation::Ignore,
                        other => {
                            return Err(ApiError::bad_request(format!(
                                "fieldValidation must be one of Ignore, Warn or Strict, not {other:?}"
                            )));
                        }
                    }
                }
                "fieldManager" => q.field_manager = non_empty(),
                "gracePeriodSeconds" => q.grace_period_seconds = Some(parse_num(&k, &v)?),
                "propagationPolicy" => q.propagation_policy = non_empty(),
                "includeObject" => {
                    q.include_object = match v.as_str() {
                        "None" => IncludeObject::None,
                        "Object" => IncludeObject::Object,
                        _ => IncludeObject::Metadata,
                    }
                }
                "force" => q.force = parse_bool(&k, &v)?,
                _ => {}
            }
        }
        Ok(q)
    }
}

/// The API verb of a resource request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    /// The verb as the metrics and audit name it (upper case, like kube's apiserver metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::List => "LIST",
            Verb::Watch => "WATCH",
            Verb::Create => "POST",
            Verb::Update => "PUT",
            Verb::Patch => "PATCH",
            Verb::Delete => "DELETE",
            Verb::DeleteCollection => "DELETECOLLECTION",
        }
    }
}

/// Picks the verb from the HTTP method and whether the path names an object.
pub fn verb_for(method: &str, path: &ResourcePath, query: &Query) -> Result<Verb, ApiError> {
    let named = path.name.is_some();
    let watch = query.watch || path.legacy_watch;
    Ok(match (method, named) {
        ("GET", _) if watch => Verb::Watch,
        ("GET", true) => Verb::Get,
        ("GET", false) => Verb::List,
        ("POST", false) => Verb::Create,
        // `pods/{name}/binding` and similar create-style subresources.
        ("POST", true) if path.subresource.is_some() => Verb::Create,
        ("PUT", true) => Verb::Update,
        ("PATCH", true) => Verb::Patch,
        ("DELETE", true) => Verb::Delete,
        ("DELETE", false) => Verb::DeleteCollection,
        _ => {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method})"
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(path: &str) -> ResourcePath {
        match parse_path(path) {
            Ok(ApiPath::Resource(r)) => r,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn namespaced_subresource_path_is_split_into_its_parts() {
        let r = res("/apis/kubevirt.io/v1/namespaces/default/virtualmachines/vm1/status");
        assert_eq!(r.group, "kubevirt.io");
        assert_eq!(r.version, "v1");
        assert_eq!(r.namespace.as_deref(), Some("default"));
        assert_eq!(r.plural, "virtualmachines");
        assert_eq!(r.name.as_deref(), Some("vm1"));
        assert_eq!(r.subresource.as_deref(), Some("status"));
    }

    #[test]
    fn namespace_objects_and_their_status_are_cluster_scoped_paths() {
        let r = res("/api/v1/namespaces/default");
        assert_eq!(
            (r.plural.as_str(), r.name.as_deref()),
            ("namespaces", Some("default"))
        );
        assert_eq!(r.namespace, None);
        let r = res("/api/v1/namespaces/default/status");
        assert_eq!(r.subresource.as_deref(), Some("status"));
        assert_eq!(r.namespace, None);
        let r = res("/api/v1/namespaces/default/pods");
        assert_eq!(r.namespace.as_deref(), Some("default"));
        assert_eq!(r.plural, "pods");
    }

    #[test]
    fn roots_and_group_versions_are_recognised() {
        assert_eq!(parse_path("/api").ok(), Some(ApiPath::LegacyRoot));
        assert_eq!(parse_path("/apis").ok(), Some(ApiPath::GroupsRoot));
        assert_eq!(
            parse_path("/api/v1").ok(),
            Some(ApiPath::GroupVersion {
                group: String::new(),
                version: "v1".into()
            })
        );
        assert!(parse_path("/apis/a/b/c/d/e/f/g").is_err());
        assert!(parse_path("/nope").is_err());
    }

    #[test]
    fn legacy_watch_prefix_is_stripped() {
        let r = res("/api/v1/watch/namespaces/ns/pods");
        assert!(r.legacy_watch);
        assert_eq!(r.plural, "pods");
        assert_eq!(r.namespace.as_deref(), Some("ns"));
    }

    #[test]
    fn query_parameters_are_typed_and_decoded() {
        let q = Query::parse(
            "fieldSelector=metadata.name%3Dvm1&labelSelector=a+in+(x%2Cy)&limit=500&watch=true&dryRun=All&fieldValidation=Strict&timeoutSeconds=30",
        )
        .unwrap();
        assert_eq!(q.field_selector.as_deref(), Some("metadata.name=vm1"));
        assert_eq!(q.label_selector.as_deref(), Some("a in (x,y)"));
        assert_eq!(q.limit, Some(500));
        assert!(q.watch && q.dry_run);
        assert_eq!(q.field_validation, FieldValidation::Strict);
        assert_eq!(q.timeout_seconds, Some(30));
    }

    #[test]
    fn bad_query_values_are_bad_requests() {
        assert_eq!(Query::parse("limit=abc").unwrap_err().code, 400);
        assert_eq!(Query::parse("dryRun=Some").unwrap_err().code, 400);
        assert_eq!(Query::parse("fieldValidation=x").unwrap_err().code, 400);
    }

    #[test]
    fn verbs_follow_method_and_name() {
        let coll = res("/api/v1/namespaces/d/pods");
        let item = res("/api/v1/namespaces/d/pods/p");
        let q = Query::default();
        let w = Query {
            watch: true,
            ..Query::default()
        };
        assert_eq!(verb_for("GET", &coll, &q).unwrap(), Verb::List);
        assert_eq!(verb_for("GET", &coll, &w).unwrap(), Verb::Watch);
        assert_eq!(verb_for("GET", &item, &q).unwrap(), Verb::Get);
        assert_eq!(verb_for("POST", &coll, &q).unwrap(), Verb::Create);
        assert_eq!(
            verb_for("DELETE", &coll, &q).unwrap(),
            Verb::DeleteCollection
        );
        assert_eq!(verb_for("PUT", &coll, &q).unwrap_err().code, 405);
    }

    #[test]
    fn percent_decoding_survives_truncated_escapes() {
        assert_eq!(percent_decode("a%3Db"), "a=b");
        assert_eq!(percent_decode("a%3"), "a%3");
        assert_eq!(percent_decode("%"), "%");
    }
}
