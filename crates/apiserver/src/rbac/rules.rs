//! RBAC objects decoded from their JSON, and kube's rule semantics: which request a
//! `PolicyRule` allows, which user a binding's subject names, and which ClusterRoles an
//! `aggregationRule` selects. Pure functions, unit-tested alone.

use std::collections::BTreeMap;

use serde_json::Value;

use super::attributes::Attributes;
use crate::auth::User;

/// `rbac.authorization.k8s.io/v1` `PolicyRule`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyRule {
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
    pub non_resource_urls: Vec<String>,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

impl PolicyRule {
    /// A rule from its JSON (unknown or malformed fields are empty lists).
    pub fn from_json(v: &Value) -> PolicyRule {
        PolicyRule {
            verbs: strings(&v["verbs"]),
            api_groups: strings(&v["apiGroups"]),
            resources: strings(&v["resources"]),
            resource_names: strings(&v["resourceNames"]),
            non_resource_urls: strings(&v["nonResourceURLs"]),
        }
    }

    /// The rules of a Role or ClusterRole object.
    pub fn list_from(obj: &Value) -> Vec<PolicyRule> {
        obj["rules"]
            .as_array()
            .map(|a| a.iter().map(PolicyRule::from_json).collect())
            .unwrap_or_default()
    }

    /// The rule as JSON (empty lists left out, as kube renders it).
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::json!({"verbs": self.verbs});
        for (key, list) in [
            ("apiGroups", &self.api_groups),
            ("resources", &self.resources),
            ("resourceNames", &self.resource_names),
            ("nonResourceURLs", &self.non_resource_urls),
        ] {
            if !list.is_empty() {
                v[key] = serde_json::json!(list);
            }
        }
        v
    }

    /// Whether this rule allows the request (kube's `RuleAllows`).
    pub fn allows(&self, a: &Attributes) -> bool {
        if !self.verb_matches(&a.verb) {
            return false;
        }
        if !a.resource_request {
            return self.non_resource_url_matches(&a.path);
        }
        let combined = if a.subresource.is_empty() {
            a.resource.clone()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        self.api_group_matches(&a.api_group)
            && self.resource_matches(&combined, &a.subresource)
            && self.resource_name_matches(&a.name)
    }

    fn verb_matches(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == "*" || v == verb)
    }

    fn api_group_matches(&self, group: &str) -> bool {
        self.api_groups.iter().any(|g| g == "*" || g == group)
    }

    /// `*`, the exact `resource[/subresource]`, or `*/subresource`.
    fn resource_matches(&self, combined: &str, subresource: &str) -> bool {
        self.resources.iter().any(|r| {
            r == "*"
                || r == combined
                || (!subresource.is_empty() && r.strip_prefix("*/") == Some(subresource))
        })
    }

    /// No names means every name.
    fn resource_name_matches(&self, name: &str) -> bool {
        self.resource_names.is_empty() || self.resource_names.iter().any(|n| n == name)
    }

    /// `*`, the exact path, or a prefix ending in `*`.
    fn non_resource_url_matches(&self, path: &str) -> bool {
        self.non_resource_urls.iter().any(|u| {
            u == "*"
                || u == path
                || u.strip_suffix('*')
                    .is_some_and(|prefix| path.starts_with(prefix))
        })
    }
}

/// A binding's `subjects[]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    /// `User`, `Group` or `ServiceAccount`.
    pub kind: String,
    pub name: String,
    pub namespace: String,
}

impl Subject {
    fn from_json(v: &Value) -> Subject {
        let s = |k: &str| v[k].as_str().unwrap_or("").to_owned();
        Subject {
            kind: s("kind"),
            name: s("name"),
            namespace: s("namespace"),
        }
    }

    /// Whether the subject names `user`; `binding_ns` is the namespace a ServiceAccount
    /// subject without one defaults to (a RoleBinding's).
    pub fn applies_to(&self, user: &User, binding_ns: &str) -> bool {
        match self.kind.as_str() {
            "User" => self.name == user.name,
            "Group" => user.groups.contains(&self.name),
            "ServiceAccount" => {
                let ns = if self.namespace.is_empty() {
                    binding_ns
                } else {
                    &self.namespace
                };
                !ns.is_empty() && user.name == format!("system:serviceaccount:{ns}:{}", self.name)
            }
            _ => false,
        }
    }

    /// `User "alice"`, as kube's allow reasons name a subject.
    pub fn describe(&self) -> String {
        if self.kind == "ServiceAccount" {
            format!("{} \"{}/{}\"", self.kind, self.namespace, self.name)
        } else {
            format!("{} \"{}\"", self.kind, self.name)
        }
    }
}

/// A RoleBinding or ClusterRoleBinding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    pub name: String,
    /// Empty for a ClusterRoleBinding.
    pub namespace: String,
    /// `Role` or `ClusterRole`.
    pub role_kind: String,
    pub role_name: String,
    pub subjects: Vec<Subject>,
}

impl Binding {
    /// A binding from its JSON.
    pub fn from_json(obj: &Value) -> Binding {
        let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
        Binding {
            name: s(&obj["metadata"]["name"]),
            namespace: s(&obj["metadata"]["namespace"]),
            role_kind: s(&obj["roleRef"]["kind"]),
            role_name: s(&obj["roleRef"]["name"]),
            subjects: obj["subjects"]
                .as_array()
                .map(|a| a.iter().map(Subject::from_json).collect())
                .unwrap_or_default(),
        }
    }

    /// The first subject naming `user`.
    pub fn subject_for(&self, user: &User) -> Option<&Subject> {
        self.subjects
            .iter()
            .find(|s| s.applies_to(user, &self.namespace))
    }
}

/// One `LabelSelector` of an `aggregationRule.clusterRoleSelectors`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    match_labels: BTreeMap<String, String>,
    /// (key, operator, values).
    expressions: Vec<(String, String, Vec<String>)>,
}

impl Selector {
    /// A selector from its JSON.
    pub fn from_json(v: &Value) -> Selector {
        let match_labels = v["matchLabels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let expressions = v["matchExpressions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| {
                        (
                            e["key"].as_str().unwrap_or("").to_owned(),
                            e["operator"].as_str().unwrap_or("").to_owned(),
                            strings(&e["values"]),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Selector {
            match_labels,
            expressions,
        }
    }

    /// Whether `labels` match. An empty selector matches nothing here (kube's would
    /// select every ClusterRole, letting one role absorb all others).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        if self.match_labels.is_empty() && self.expressions.is_empty() {
            return false;
        }
        let labels_ok = self
            .match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v));
        labels_ok
            && self.expressions.iter().all(|(k, op, values)| {
                let got = labels.get(k);
                match op.as_str() {
                    "In" => got.is_some_and(|g| values.contains(g)),
                    "NotIn" => got.is_none_or(|g| !values.contains(g)),
                    "Exists" => got.is_some(),
                    "DoesNotExist" => got.is_none(),
                    _ => false,
                }
            })
    }
}

/// A ClusterRole's rules, labels and aggregation selectors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterRole {
    pub rules: Vec<PolicyRule>,
    pub labels: BTreeMap<String, String>,
    /// `Some` when the role has an `aggregationRule`.
    pub aggregation: Option<Vec<Selector>>,
}

impl ClusterRole {
    /// A ClusterRole from its JSON.
    pub fn from_json(obj: &Value) -> ClusterRole {
        ClusterRole {
            rules: PolicyRule::list_from(obj),
            labels: obj["metadata"]["labels"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                        .collect()
                })
                .unwrap_or_default(),
            aggregation: obj["aggregationRule"].is_object().then(|| {
                obj["aggregationRule"]["clusterRoleSelectors"]
                    .as_array()
                    .map(|a| a.iter().map(Selector::from_json).collect())
                    .unwrap_or_default()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::rbac::attributes::from_request;

    #[allow(clippy::needless_pass_by_value)] // called with json!(…) temporaries
    fn rule(v: Value) -> PolicyRule {
        PolicyRule::from_json(&v)
    }

    #[test]
    fn verbs_groups_resources_and_names_must_all_match() {
        let r = rule(json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}));
        assert!(r.allows(&from_request("GET", "/api/v1/namespaces/d/pods", "")));
        assert!(r.allows(&from_request("GET", "/api/v1/namespaces/d/pods/p", "")));
        assert!(!r.allows(&from_request("GET", "/api/v1/namespaces/d/pods", "watch=1")));
        assert!(!r.allows(&from_request(
            "GET",
            "/apis/apps/v1/namespaces/d/deployments",
            ""
        )));
        assert!(!r.allows(&from_request("GET", "/api/v1/namespaces/d/pods/p/log", "")));
        let named = rule(
            json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["configmaps"], "resourceNames": ["a"]}),
        );
        assert!(named.allows(&from_request(
            "PUT",
            "/api/v1/namespaces/d/configmaps/a",
            ""
        )));
        assert!(!named.allows(&from_request(
            "PUT",
            "/api/v1/namespaces/d/configmaps/b",
            ""
        )));
        assert!(!named.allows(&from_request("GET", "/api/v1/namespaces/d/configmaps", "")));
    }

    #[test]
    fn subresources_match_exactly_or_through_a_star_prefix() {
        let log = rule(json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]}));
        assert!(log.allows(&from_request("GET", "/api/v1/namespaces/d/pods/p/log", "")));
        assert!(!log.allows(&from_request("GET", "/api/v1/namespaces/d/pods/p", "")));
        let any_status =
            rule(json!({"verbs": ["patch"], "apiGroups": ["*"], "resources": ["*/status"]}));
        assert!(any_status.allows(&from_request(
            "PATCH",
            "/apis/apps/v1/namespaces/d/deployments/x/status",
            ""
        )));
        assert!(!any_status.allows(&from_request(
            "PATCH",
            "/apis/apps/v1/namespaces/d/deployments/x",
            ""
        )));
    }

    #[test]
    fn non_resource_urls_match_exactly_or_by_a_star_suffix() {
        let r = rule(json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/apis/*"]}));
        assert!(r.allows(&from_request("GET", "/healthz", "")));
        assert!(r.allows(&from_request("GET", "/apis/apps/v1", "")));
        assert!(!r.allows(&from_request("GET", "/version", "")));
        assert!(!r.allows(&from_request("POST", "/healthz", "")));
        assert!(!r.allows(&from_request("GET", "/api/v1/namespaces/d/pods", "")));
    }

    #[test]
    fn subjects_name_users_groups_and_service_accounts() {
        let user = User {
            name: "system:serviceaccount:team:bot".into(),
            groups: vec!["system:serviceaccounts".into()],
            ..User::default()
        };
        let b = Binding::from_json(&json!({
            "metadata": {"name": "b", "namespace": "team"},
            "roleRef": {"kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "bot"}],
        }));
        assert!(b.subject_for(&user).is_some());
        let other_ns = Binding {
            namespace: "else".into(),
            ..b.clone()
        };
        assert!(other_ns.subject_for(&user).is_none());
        let group = Subject {
            kind: "Group".into(),
            name: "system:serviceaccounts".into(),
            namespace: String::new(),
        };
        assert!(group.applies_to(&user, ""));
        let alice = Subject {
            kind: "User".into(),
            name: "alice".into(),
            namespace: String::new(),
        };
        assert!(!alice.applies_to(&user, ""));
    }

    #[test]
    fn aggregation_selectors_match_labels_and_expressions() {
        let labels: BTreeMap<String, String> = [("a".to_owned(), "true".to_owned())].into();
        assert!(Selector::from_json(&json!({"matchLabels": {"a": "true"}})).matches(&labels));
        assert!(!Selector::from_json(&json!({"matchLabels": {"a": "false"}})).matches(&labels));
        assert!(
            Selector::from_json(
                &json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["true"]}]})
            )
            .matches(&labels)
        );
        assert!(
            Selector::from_json(
                &json!({"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]})
            )
            .matches(&labels)
        );
        assert!(!Selector::from_json(&json!({})).matches(&labels));
    }
}
