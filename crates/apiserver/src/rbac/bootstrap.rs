//! The bootstrap policy: kube's default ClusterRoles and ClusterRoleBindings (same names,
//! labels and `rbac.authorization.kubernetes.io/autoupdate: "true"`), reduced to the
//! resources this server serves, plus one binding for the components of the tokens file,
//! and kube's Role and RoleBinding in `kube-system` for reading the
//! `extension-apiserver-authentication` ConfigMap.
//!
//! At start every object that is missing is created; one that exists with autoupdate
//! `"true"` gets this policy's rules (roles) or gains this policy's subjects (bindings),
//! as kube's reconciliation does; autoupdate `"false"` keeps the user's version.

use serde_json::{Value, json};

use crate::handlers::common::{WriteOptions, decode_record};
use crate::handlers::{create, update};
use crate::state::ApiState;
use crate::status::ApiError;

const RBAC: &str = "rbac.authorization.k8s.io/v1";
const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";

/// The group of every authenticated request.
pub const AUTHENTICATED: &str = "system:authenticated";
/// The group of anonymous requests.
pub const UNAUTHENTICATED: &str = "system:unauthenticated";

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];
const ALL: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn urls(paths: &[&str], verbs: &[&str]) -> Value {
    json!({"nonResourceURLs": paths, "verbs": verbs})
}

fn meta(name: &str, labels: Value) -> Value {
    let mut l = json!({"kubernetes.io/bootstrapping": "rbac-defaults"});
    if let (Some(l), Value::Object(extra)) = (l.as_object_mut(), labels) {
        l.extend(extra);
    }
    json!({"name": name, "labels": l, "annotations": {AUTOUPDATE: "true"}})
}

fn cluster_role(name: &str, labels: Value, rules: Vec<Value>) -> Value {
    json!({"apiVersion": RBAC, "kind": "ClusterRole", "metadata": meta(name, labels), "rules": Value::Array(rules)})
}

fn aggregated(name: &str, labels: Value, to: &str) -> Value {
    json!({
        "apiVersion": RBAC, "kind": "ClusterRole", "metadata": meta(name, labels),
        "aggregationRule": {"clusterRoleSelectors": [
            {"matchLabels": {format!("rbac.authorization.k8s.io/aggregate-to-{to}"): "true"}}
        ]},
        "rules": [],
    })
}

fn binding(name: &str, role: &str, subjects: Vec<Value>) -> Value {
    json!({
        "apiVersion": RBAC, "kind": "ClusterRoleBinding", "metadata": meta(name, json!({})),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": Value::Array(subjects),
    })
}

fn group(name: &str) -> Value {
    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": name})
}

fn to_label(to: &str) -> Value {
    json!({format!("rbac.authorization.k8s.io/aggregate-to-{to}"): "true"})
}

fn view_rules() -> Vec<Value> {
    vec![
        rule(
            &[""],
            &[
                "configmaps",
                "endpoints",
                "persistentvolumeclaims",
                "persistentvolumeclaims/status",
                "pods",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "serviceaccounts",
                "services",
                "services/status",
            ],
            READ,
        ),
        rule(
            &[""],
            &[
                "bindings",
                "events",
                "limitranges",
                "namespaces/status",
                "pods/log",
                "pods/status",
                "replicationcontrollers/status",
                "resourcequotas",
                "resourcequotas/status",
            ],
            READ,
        ),
        rule(&[""], &["namespaces"], READ),
        rule(&["discovery.k8s.io"], &["endpointslices"], READ),
        rule(
            &["apps"],
            &[
                "controllerrevisions",
                "daemonsets",
                "daemonsets/status",
                "deployments",
                "deployments/scale",
                "deployments/status",
                "replicasets",
                "replicasets/scale",
                "replicasets/status",
                "statefulsets",
                "statefulsets/scale",
                "statefulsets/status",
            ],
            READ,
        ),
        rule(
            &["autoscaling"],
            &[
                "horizontalpodautoscalers",
                "horizontalpodautoscalers/status",
            ],
            READ,
        ),
        rule(
            &["batch"],
            &["cronjobs", "cronjobs/status", "jobs", "jobs/status"],
            READ,
        ),
        rule(
            &["policy"],
            &["poddisruptionbudgets", "poddisruptionbudgets/status"],
            READ,
        ),
        rule(
            &["networking.k8s.io"],
            &["ingresses", "ingresses/status", "networkpolicies"],
            READ,
        ),
    ]
}

fn edit_rules() -> Vec<Value> {
    vec![
        rule(
            &[""],
            &[
                "pods/attach",
                "pods/exec",
                "pods/portforward",
                "pods/proxy",
                "secrets",
                "services/proxy",
            ],
            READ,
        ),
        rule(&[""], &["serviceaccounts"], &["impersonate"]),
        rule(
            &[""],
            &[
                "pods",
                "pods/attach",
                "pods/exec",
                "pods/portforward",
                "pods/proxy",
            ],
            WRITE,
        ),
        rule(&[""], &["pods/eviction"], &["create"]),
        rule(
            &[""],
            &[
                "configmaps",
                "events",
                "persistentvolumeclaims",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "secrets",
                "serviceaccounts",
                "services",
                "services/proxy",
            ],
            WRITE,
        ),
        rule(&[""], &["serviceaccounts/token"], &["create"]),
        rule(
            &["apps"],
            &[
                "daemonsets",
                "deployments",
                "deployments/rollback",
                "deployments/scale",
                "replicasets",
                "replicasets/scale",
                "statefulsets",
                "statefulsets/scale",
            ],
            WRITE,
        ),
        rule(&["autoscaling"], &["horizontalpodautoscalers"], WRITE),
        rule(&["batch"], &["cronjobs", "jobs"], WRITE),
        rule(&["policy"], &["poddisruptionbudgets"], WRITE),
        rule(
            &["networking.k8s.io"],
            &["ingresses", "networkpolicies"],
            WRITE,
        ),
        rule(&["coordination.k8s.io"], &["leases"], ALL),
    ]
}

fn admin_rules() -> Vec<Value> {
    vec![
        rule(
            &["authorization.k8s.io"],
            &["localsubjectaccessreviews"],
            &["create"],
        ),
        rule(
            &["rbac.authorization.k8s.io"],
            &["rolebindings", "roles"],
            ALL,
        ),
    ]
}

/// The bootstrap ClusterRoles and ClusterRoleBindings.
pub fn policy() -> Vec<Value> {
    let public_info = &["/healthz", "/livez", "/readyz", "/version", "/version/"];
    let mut out = vec![
        cluster_role(
            "cluster-admin",
            json!({}),
            vec![rule(&["*"], &["*"], &["*"]), urls(&["*"], &["*"])],
        ),
        aggregated("admin", json!({}), "admin"),
        aggregated("edit", to_label("admin"), "edit"),
        aggregated("view", to_label("edit"), "view"),
        cluster_role(
            "system:aggregate-to-admin",
            to_label("admin"),
            admin_rules(),
        ),
        cluster_role("system:aggregate-to-edit", to_label("edit"), edit_rules()),
        cluster_role("system:aggregate-to-view", to_label("view"), view_rules()),
        cluster_role(
            "system:basic-user",
            json!({}),
            vec![
                rule(
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                    &["create"],
                ),
                rule(
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    &["create"],
                ),
            ],
        ),
        cluster_role(
            "system:discovery",
            json!({}),
            vec![urls(
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
                &["get"],
            )],
        ),
        cluster_role(
            "system:public-info-viewer",
            json!({}),
            vec![urls(public_info, &["get"])],
        ),
        cluster_role(
            "system:monitoring",
            json!({}),
            vec![urls(
                &[
                    "/healthz",
                    "/healthz/*",
                    "/livez",
                    "/livez/*",
                    "/metrics",
                    "/readyz",
                    "/readyz/*",
                ],
                &["get"],
            )],
        ),
        cluster_role(
            "system:service-account-issuer-discovery",
            json!({}),
            vec![urls(
                &[
                    "/.well-known/openid-configuration",
                    "/.well-known/openid-configuration/",
                    "/openid/v1/jwks",
                    "/openid/v1/jwks/",
                ],
                &["get"],
            )],
        ),
        binding(
            "cluster-admin",
            "cluster-admin",
            vec![group(crate::rbac::MASTERS_GROUP)],
        ),
        binding(
            "system:basic-user",
            "system:basic-user",
            vec![group(AUTHENTICATED)],
        ),
        binding(
            "system:discovery",
            "system:discovery",
            vec![group(AUTHENTICATED)],
        ),
        binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            vec![group(AUTHENTICATED), group(UNAUTHENTICATED)],
        ),
        binding(
            "system:monitoring",
            "system:monitoring",
            vec![group("system:monitoring")],
        ),
        binding(
            "system:service-account-issuer-discovery",
            "system:service-account-issuer-discovery",
            vec![group("system:serviceaccounts")],
        ),
    ];
    out.extend(embedded_component_roles());
    out.extend(embedded_component_bindings());
    out
}

/// The namespace of the control plane's own objects.
const SYSTEM_NAMESPACE: &str = "kube-system";

/// The bootstrap Roles and RoleBindings of `kube-system`: the reader of the ConfigMap
/// `extension-apiserver-authentication` (which tells aggregated API servers whom to trust
/// for client certificates and front-proxy requests), bound to the scheduler and the
/// controller-manager as kube binds it. Extension API servers bind their own service
/// accounts to it with a RoleBinding in `kube-system`.
pub fn namespaced_policy() -> Vec<Value> {
    let mut reader = meta("extension-apiserver-authentication-reader", json!({}));
    reader["namespace"] = json!(SYSTEM_NAMESPACE);
    let mut reader_binding = meta(
        "system::extension-apiserver-authentication-reader",
        json!({}),
    );
    reader_binding["namespace"] = json!(SYSTEM_NAMESPACE);
    vec![
        json!({
            "apiVersion": RBAC, "kind": "Role", "metadata": reader,
            "rules": [{
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [crate::builtin_controllers::AUTHENTICATION_CONFIGMAP],
                "verbs": READ,
            }],
        }),
        json!({
            "apiVersion": RBAC, "kind": "RoleBinding", "metadata": reader_binding,
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "extension-apiserver-authentication-reader",
            },
            "subjects": [user("system:kube-controller-manager"), user("system:kube-scheduler")],
        }),
    ]
}

fn user(name: &str) -> Value {
    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name})
}

/// The embedded wing's own components under kube's role names, each bound to the identity
/// its client certificate carries, with only what the component calls. (kube authorizes
/// nodes with its Node authorizer and runs each controller as its own service account; here
/// `system:node` is bound to the group `system:nodes` and `system:kube-controller-manager`
/// carries the rules of the workload controllers we run.)
fn embedded_component_roles() -> Vec<Value> {
    let read = ["get", "list", "watch"];
    let write = ["create", "update", "patch", "delete"];
    let all = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    vec![
        cluster_role(
            "system:node",
            json!({}),
            vec![
                rule(
                    &[""],
                    &["nodes"],
                    &["get", "list", "watch", "create", "update", "patch"],
                ),
                rule(&[""], &["nodes/status"], &["patch", "update"]),
                rule(&[""], &["pods"], &["get", "list", "watch", "delete"]),
                rule(&[""], &["pods/status"], &["patch", "update"]),
                rule(&[""], &["serviceaccounts/token"], &["create"]),
                rule(
                    &[""],
                    &[
                        "configmaps",
                        "secrets",
                        "persistentvolumeclaims",
                        "persistentvolumes",
                    ],
                    &read,
                ),
                rule(
                    &["", "events.k8s.io"],
                    &["events"],
                    &["create", "update", "patch"],
                ),
                rule(&["coordination.k8s.io"], &["leases"], &all),
            ],
        ),
        cluster_role(
            "system:kube-scheduler",
            json!({}),
            vec![
                rule(&[""], &["pods", "nodes"], &read),
                rule(&[""], &["pods/binding", "bindings"], &["create"]),
                rule(&[""], &["pods/status"], &["patch", "update"]),
                // VolumeBinding: reads claims, volumes and classes, and names the node of a
                // WaitForFirstConsumer claim.
                rule(&[""], &["persistentvolumes"], &read),
                rule(
                    &[""],
                    &["persistentvolumeclaims"],
                    &["get", "list", "watch", "patch", "update"],
                ),
                rule(&["storage.k8s.io"], &["storageclasses"], &read),
                rule(
                    &["", "events.k8s.io"],
                    &["events"],
                    &["create", "update", "patch"],
                ),
                rule(&["coordination.k8s.io"], &["leases"], &all),
            ],
        ),
        controller_manager_role(),
        cluster_role(
            "system:node-proxier",
            json!({}),
            vec![
                rule(&[""], &["services", "endpoints", "nodes"], &read),
                rule(&["discovery.k8s.io"], &["endpointslices"], &read),
                rule(&["", "events.k8s.io"], &["events"], &write),
            ],
        ),
    ]
}

/// `system:kube-controller-manager`: the rules of the controllers the embedded
/// controller-manager runs (Deployment, ReplicaSet, DaemonSet; EndpointSlice as kube's
/// `system:controller:endpointslice-controller`; the disruption controller's PDB access; the
/// PV binder's and the local provisioner's volumes and claims).
fn controller_manager_role() -> Value {
    let read = ["get", "list", "watch"];
    let all = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    cluster_role(
        "system:kube-controller-manager",
        json!({}),
        vec![
            rule(
                &["apps"],
                &[
                    "deployments",
                    "replicasets",
                    "daemonsets",
                    "controllerrevisions",
                ],
                &all,
            ),
            rule(
                &["apps"],
                &[
                    "deployments/status",
                    "replicasets/status",
                    "daemonsets/status",
                ],
                &["update", "patch"],
            ),
            rule(&[""], &["pods"], &all),
            rule(&[""], &["nodes"], &read),
            // kube's system:controller:endpointslice-controller.
            rule(&[""], &["services"], &read),
            rule(&[""], &["services/finalizers"], &["update"]),
            rule(
                &["discovery.k8s.io"],
                &["endpointslices"],
                &["create", "delete", "get", "list", "update", "watch"],
            ),
            // kube's system:controller:persistent-volume-binder (and the local provisioner).
            rule(
                &[""],
                &["persistentvolumes", "persistentvolumeclaims"],
                &all,
            ),
            rule(
                &[""],
                &["persistentvolumes/status", "persistentvolumeclaims/status"],
                &["update", "patch"],
            ),
            rule(&["storage.k8s.io"], &["storageclasses"], &read),
            // kube's system:controller:disruption-controller (its PDB part).
            rule(&["policy"], &["poddisruptionbudgets"], &read),
            rule(&["policy"], &["poddisruptionbudgets/status"], &["update"]),
            rule(
                &["", "events.k8s.io"],
                &["events"],
                &["create", "update", "patch"],
            ),
            rule(&["coordination.k8s.io"], &["leases"], &all),
        ],
    )
}

/// The bindings of [`embedded_component_roles`] to the identities of the components'
/// client certificates.
fn embedded_component_bindings() -> Vec<Value> {
    vec![
        binding("system:node", "system:node", vec![group("system:nodes")]),
        binding(
            "system:kube-scheduler",
            "system:kube-scheduler",
            vec![user("system:kube-scheduler")],
        ),
        binding(
            "system:kube-controller-manager",
            "system:kube-controller-manager",
            vec![user("system:kube-controller-manager")],
        ),
        binding(
            "system:node-proxier",
            "system:node-proxier",
            vec![user("system:kube-proxy")],
        ),
    ]
}

/// Creates what is missing of [`policy`] and [`namespaced_policy`] and reconciles what
/// autoupdate allows.
pub async fn ensure(state: &ApiState) -> Result<(), ApiError> {
    let opts = WriteOptions {
        user: "system:apiserver".into(),
        ..WriteOptions::default()
    };
    for obj in policy().into_iter().chain(namespaced_policy()) {
        ensure_one(state, obj, &opts).await?;
    }
    Ok(())
}

async fn ensure_one(state: &ApiState, obj: Value, opts: &WriteOptions) -> Result<(), ApiError> {
    let kind = obj["kind"].as_str().unwrap_or("").to_owned();
    let plural = match kind.as_str() {
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        "Role" => "roles",
        _ => "rolebindings",
    };
    let Some(info) = state
        .registry
        .find("rbac.authorization.k8s.io", "v1", plural)
    else {
        return Ok(());
    };
    let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
    let namespace = obj["metadata"]["namespace"].as_str().map(str::to_owned);
    let namespace = namespace.as_deref();
    let Some(record) = state.store.get(&info.key(namespace, &name)) else {
        return match create::create(state, &info, namespace, obj, opts).await {
            Err(e) if e.code != 409 => Err(e),
            _ => Ok(()),
        };
    };
    let mut existing = decode_record(&record)?;
    if existing["metadata"]["annotations"][AUTOUPDATE] != "true" {
        return Ok(());
    }
    let changed = if kind.ends_with("Binding") {
        gain_subjects(&mut existing, &obj)
    } else {
        take_rules(&mut existing, &obj)
    };
    if changed {
        update::update(state, &info, namespace, &name, None, existing, opts).await?;
    }
    Ok(())
}

/// A role gets the policy's rules (an aggregated role its aggregation rule: its rules are
/// the aggregation's business); whether it changed.
fn take_rules(existing: &mut Value, policy: &Value) -> bool {
    let field = if policy["aggregationRule"].is_object() {
        "aggregationRule"
    } else {
        "rules"
    };
    if existing[field] == policy[field] {
        return false;
    }
    existing[field] = policy[field].clone();
    true
}

/// A binding gains the policy's subjects it lacks and keeps its others; whether it changed.
fn gain_subjects(existing: &mut Value, policy: &Value) -> bool {
    let mut subjects = existing["subjects"].as_array().cloned().unwrap_or_default();
    let before = subjects.len();
    for s in policy["subjects"].as_array().into_iter().flatten() {
        if !subjects.contains(s) {
            subjects.push(s.clone());
        }
    }
    existing["subjects"] = json!(subjects);
    subjects.len() != before
}
