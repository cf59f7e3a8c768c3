//! RBAC escalation prevention, as kube's RBAC storage enforces it: a Role or ClusterRole
//! may only be created or updated by a user who already holds every permission it grants
//! (in the Role's namespace, or cluster-wide for a ClusterRole), unless that user may
//! `escalate` the role; a RoleBinding or ClusterRoleBinding only by a user who holds every
//! permission of the role it references (in the binding's namespace, or cluster-wide),
//! unless that user may `bind` that role. A ClusterRole with an `aggregationRule` needs
//! full authority (`*` on everything), as its rules come from elsewhere.
//!
//! Runs in the validating admission phase for requests from clients; the server's own
//! writes (bootstrap policy, controllers) are trusted.

use std::sync::Arc;

use serde_json::Value;

use super::attributes::Attributes;
use super::authorizer::Authorizer;
use super::rules::PolicyRule;
use crate::admission::{Admission, AdmissionRequest, Operation, Phase};
use crate::auth::User;
use crate::status::ApiError;

const GROUP: &str = "rbac.authorization.k8s.io";

/// The admission hook (see the module docs).
pub struct EscalationCheck {
    authorizer: Arc<Authorizer>,
}

impl EscalationCheck {
    pub fn new(authorizer: Arc<Authorizer>) -> EscalationCheck {
        EscalationCheck { authorizer }
    }
}

/// One (verb, group, resource, name) or (verb, URL) a rule grants.
#[derive(Debug)]
enum Atom<'a> {
    Resource(&'a str, &'a str, &'a str, Option<&'a str>),
    Url(&'a str, &'a str),
}

fn atoms(rule: &PolicyRule) -> Vec<Atom<'_>> {
    let mut out = Vec::new();
    for verb in &rule.verbs {
        for group in &rule.api_groups {
            for resource in &rule.resources {
                if rule.resource_names.is_empty() {
                    out.push(Atom::Resource(verb, group, resource, None));
                }
                for name in &rule.resource_names {
                    out.push(Atom::Resource(verb, group, resource, Some(name)));
                }
            }
        }
        for url in &rule.non_resource_urls {
            out.push(Atom::Url(verb, url));
        }
    }
    out
}

fn has(list: &[String], wanted: &str) -> bool {
    list.iter().any(|x| x == "*" || x == wanted)
}

/// Whether `owner` grants `atom` (kube's `ruleCovers`, literal: a `*` in the grant is
/// only covered by a `*`).
fn covers(owner: &PolicyRule, atom: &Atom<'_>) -> bool {
    match *atom {
        Atom::Resource(verb, group, resource, name) => {
            has(&owner.verbs, verb)
                && has(&owner.api_groups, group)
                && owner.resources.iter().any(|r| {
                    r == "*"
                        || r == resource
                        || (r.starts_with("*/")
                            && resource
                                .split_once('/')
                                .is_some_and(|(_, sub)| sub == &r[2..]))
                })
                && (owner.resource_names.is_empty()
                    || name.is_some_and(|n| owner.resource_names.iter().any(|o| o == n)))
        }
        Atom::Url(verb, url) => {
            has(&owner.verbs, verb)
                && owner.non_resource_urls.iter().any(|u| {
                    u == "*" || u == url || u.strip_suffix('*').is_some_and(|p| url.starts_with(p))
                })
        }
    }
}

/// The rules of `servant` that `owner` does not cover, as kube lists them.
pub fn uncovered(owner: &[PolicyRule], servant: &[PolicyRule]) -> Vec<String> {
    let mut missing = Vec::new();
    for rule in servant {
        for atom in atoms(rule) {
            if !owner.iter().any(|o| covers(o, &atom)) {
                missing.push(describe(&atom));
            }
        }
    }
    missing
}

fn describe(atom: &Atom<'_>) -> String {
    match atom {
        Atom::Resource(verb, group, resource, name) => {
            let names = name.map_or(String::new(), |n| format!(", ResourceNames:[\"{n}\"]"));
            format!(
                "{{APIGroups:[\"{group}\"], Resources:[\"{resource}\"]{names}, Verbs:[\"{verb}\"]}}"
            )
        }
        Atom::Url(verb, url) => format!("{{NonResourceURLs:[\"{url}\"], Verbs:[\"{verb}\"]}}"),
    }
}

fn full_authority() -> Vec<PolicyRule> {
    vec![
        PolicyRule {
            verbs: vec!["*".into()],
            api_groups: vec!["*".into()],
            resources: vec!["*".into()],
            ..PolicyRule::default()
        },
        PolicyRule {
            verbs: vec!["*".into()],
            non_resource_urls: vec!["*".into()],
            ..PolicyRule::default()
        },
    ]
}

impl EscalationCheck {
    fn may(&self, user: &User, verb: &str, resource: &str, namespace: &str, name: &str) -> bool {
        let attrs = Attributes {
            verb: verb.into(),
            resource_request: true,
            api_group: GROUP.into(),
            resource: resource.into(),
            namespace: namespace.into(),
            name: name.into(),
            ..Attributes::default()
        };
        self.authorizer.authorize(user, &attrs).allowed
    }

    fn check(
        &self,
        request: &AdmissionRequest<'_>,
        user: &User,
        object: &Value,
    ) -> Result<(), ApiError> {
        let plural = request.resource.plural.as_str();
        let ns = request.namespace.unwrap_or("");
        let name = request.name;
        let (servant, scope_ns) = match plural {
            "roles" | "clusterroles" => {
                if self.may(user, "escalate", plural, ns, name) {
                    return Ok(());
                }
                let servant = if plural == "clusterroles" && object["aggregationRule"].is_object() {
                    full_authority()
                } else {
                    PolicyRule::list_from(object)
                };
                (servant, ns)
            }
            "rolebindings" | "clusterrolebindings" => {
                let kind = object["roleRef"]["kind"].as_str().unwrap_or("");
                let role = object["roleRef"]["name"].as_str().unwrap_or("");
                let role_plural = if kind == "Role" {
                    "roles"
                } else {
                    "clusterroles"
                };
                if self.may(user, "bind", role_plural, ns, role) {
                    return Ok(());
                }
                (self.authorizer.role_rules(kind, ns, role), ns)
            }
            _ => return Ok(()),
        };
        let owner = self.authorizer.rules_for(user, scope_ns);
        let missing = uncovered(&owner, &servant);
        if missing.is_empty() {
            return Ok(());
        }
        let groups = user
            .groups
            .iter()
            .map(|g| format!("\"{g}\""))
            .collect::<Vec<_>>()
            .join(" ");
        let why = format!(
            "user \"{}\" (groups=[{groups}]) is attempting to grant RBAC permissions not currently held:\n{}",
            user.name,
            missing.join("\n")
        );
        Err(ApiError::forbidden_resource(GROUP, plural, name, &why))
    }
}

#[async_trait::async_trait]
impl Admission for EscalationCheck {
    async fn admit(
        &self,
        phase: Phase,
        request: &AdmissionRequest<'_>,
        object: &mut Value,
    ) -> Result<Vec<String>, ApiError> {
        let Some(groups) = request.groups else {
            return Ok(Vec::new());
        };
        if phase != Phase::Validating
            || request.operation == Operation::Delete
            || request.subresource.is_some()
            || request.resource.group != GROUP
        {
            return Ok(Vec::new());
        }
        let user = User {
            name: request.user.to_owned(),
            groups: groups.to_vec(),
            ..User::default()
        };
        self.check(request, &user, object)?;
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rules(v: &Value) -> Vec<PolicyRule> {
        v.as_array()
            .unwrap()
            .iter()
            .map(PolicyRule::from_json)
            .collect()
    }

    #[test]
    fn a_grant_is_covered_atom_by_atom_and_a_star_only_by_a_star() {
        let owner = rules(&json!([
            {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods", "*/status"]},
            {"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["a"]},
            {"verbs": ["get"], "nonResourceURLs": ["/apis/*"]},
        ]));
        let ok = rules(&json!([
            {"verbs": ["list"], "apiGroups": [""], "resources": ["pods", "services/status"]},
            {"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["a"]},
            {"verbs": ["get"], "nonResourceURLs": ["/apis/apps"]},
        ]));
        assert!(uncovered(&owner, &ok).is_empty());
        let too_much = rules(&json!([
            {"verbs": ["*"], "apiGroups": [""], "resources": ["pods"]},
            {"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"]},
        ]));
        assert_eq!(
            uncovered(&owner, &too_much),
            [
                "{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"*\"]}",
                "{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\"]}",
            ]
        );
    }
}
