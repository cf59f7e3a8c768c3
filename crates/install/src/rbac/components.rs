//! The components' own roles, translated from upstream's `rbac/{apiserver,controller,
//! handler,operator}.go`. The operator holds every rule it grants (upstream's
//! `getKubeVirtComponents{Cluster,}Rules`), so its roles are its own rules plus the
//! components'.

use k8s_openapi::api::rbac::v1::PolicyRule;

use super::{
    BindingSpec, RbacObject, RoleSpec, SUBRESOURCES_GROUP, Scope, cluster, named_rule, rule,
    service_account,
};
use crate::InstallConfig;
use crate::namespace::{
    API_SERVICE_ACCOUNT, CONTROLLER_SERVICE_ACCOUNT, HANDLER_SERVICE_ACCOUNT,
    OPERATOR_SERVICE_ACCOUNT,
};

const KV: &str = "kubevirt.io";
const INSTANCETYPE: &str = "instancetype.kubevirt.io";
const INSTANCETYPES: &[&str] = &[
    "virtualmachineinstancetypes",
    "virtualmachineclusterinstancetypes",
    "virtualmachinepreferences",
    "virtualmachineclusterpreferences",
];
const MIGRATIONS: &str = "migrations.kubevirt.io";
const GET_LIST_WATCH: &[&str] = &["get", "list", "watch"];
const ALL_WRITE: &[&str] = &[
    "get", "list", "watch", "delete", "update", "create", "patch",
];

/// A binding of the component's role (same name) to its service account.
fn bind(scope: Scope, name: &'static str, namespace: &str) -> RbacObject {
    let role_kind = match scope {
        Scope::Cluster => "ClusterRole",
        Scope::Namespaced => "Role",
    };
    RbacObject::Binding(BindingSpec {
        scope,
        name,
        role_kind,
        role: name,
        annotations: Vec::new(),
        subjects: vec![service_account(namespace, name)],
    })
}

fn api_cluster_rules() -> Vec<PolicyRule> {
    vec![
        rule(&[""], &["pods"], &["get", "list", "delete", "patch"]),
        rule(
            &[KV],
            &["virtualmachines", "virtualmachineinstances"],
            &["get", "list", "watch", "patch", "update"],
        ),
        rule(&[""], &["persistentvolumeclaims"], &["get", "list"]),
        rule(&[KV], &["virtualmachines/status"], &["patch"]),
        rule(
            &[KV],
            &["virtualmachineinstancemigrations"],
            &["create", "get", "list", "watch", "patch"],
        ),
        rule(
            &[KV],
            &["virtualmachineinstancepresets"],
            &["watch", "list"],
        ),
        rule(&[""], &["configmaps"], GET_LIST_WATCH),
        rule(&[""], &["limitranges"], &["watch", "list"]),
        rule(
            &["apiextensions.k8s.io"],
            &["customresourcedefinitions"],
            GET_LIST_WATCH,
        ),
        rule(&[KV], &["kubevirts"], GET_LIST_WATCH),
        rule(
            &["snapshot.kubevirt.io"],
            &[
                "virtualmachinesnapshots",
                "virtualmachinerestores",
                "virtualmachinesnapshotcontents",
            ],
            GET_LIST_WATCH,
        ),
        rule(
            &["backup.kubevirt.io"],
            &["virtualmachinebackups"],
            GET_LIST_WATCH,
        ),
        rule(
            &["backup.kubevirt.io"],
            &["virtualmachinebackuptrackers"],
            GET_LIST_WATCH,
        ),
        rule(
            &["cdi.kubevirt.io"],
            &["datasources", "datavolumes"],
            GET_LIST_WATCH,
        ),
        rule(&[""], &["namespaces"], GET_LIST_WATCH),
        rule(&[INSTANCETYPE], INSTANCETYPES, GET_LIST_WATCH),
        rule(&[MIGRATIONS], &["migrationpolicies"], GET_LIST_WATCH),
        rule(
            &["apps"],
            &["controllerrevisions"],
            &["create", "list", "get"],
        ),
        rule(&[""], &["nodes"], &["get"]),
    ]
}

fn api_role_rules() -> Vec<PolicyRule> {
    vec![rule(&[""], &["configmaps"], GET_LIST_WATCH)]
}

/// virt-api's roles and bindings (upstream's `GetAllApiServer` without the ServiceAccount).
pub(crate) fn api_objects(namespace: &str) -> Vec<RbacObject> {
    vec![
        RbacObject::Role(RoleSpec::new(
            Scope::Cluster,
            API_SERVICE_ACCOUNT,
            api_cluster_rules(),
        )),
        bind(Scope::Cluster, API_SERVICE_ACCOUNT, namespace),
        RbacObject::Binding(BindingSpec {
            scope: Scope::Cluster,
            name: "kubevirt-apiserver-auth-delegator",
            role_kind: "ClusterRole",
            role: "system:auth-delegator",
            annotations: Vec::new(),
            subjects: vec![service_account(namespace, API_SERVICE_ACCOUNT)],
        }),
        RbacObject::Role(RoleSpec::new(
            Scope::Namespaced,
            API_SERVICE_ACCOUNT,
            api_role_rules(),
        )),
        bind(Scope::Namespaced, API_SERVICE_ACCOUNT, namespace),
    ]
}

fn controller_cluster_rules() -> Vec<PolicyRule> {
    let mut rules = controller_kubernetes_rules();
    rules.extend(controller_kubevirt_rules());
    rules.extend(controller_storage_and_other_rules());
    rules
}

/// The first part of upstream's list: core Kubernetes objects.
fn controller_kubernetes_rules() -> Vec<PolicyRule> {
    let rw = ALL_WRITE;
    vec![
        rule(&[""], &["namespaces"], &["get", "list", "watch", "patch"]),
        rule(
            &["policy"],
            &["poddisruptionbudgets"],
            &["get", "list", "watch", "delete", "create", "patch"],
        ),
        rule(&[""], &["pods", "configmaps", "endpoints", "services"], rw),
        rule(&[""], &["events"], &["update", "create", "patch"]),
        rule(&[""], &["secrets"], &["create"]),
        rule(&[""], &["pods/finalizers"], &["update"]),
        rule(&[""], &["pods/eviction"], &["create"]),
        rule(&[""], &["pods/status"], &["patch"]),
        rule(
            &[""],
            &["nodes"],
            &["get", "list", "watch", "update", "patch"],
        ),
        rule(&["apps"], &["daemonsets"], &["list"]),
        rule(
            &["apps"],
            &["controllerrevisions"],
            &["watch", "list", "create", "delete", "get", "update"],
        ),
        rule(
            &[""],
            &["persistentvolumeclaims"],
            &[
                "get", "list", "watch", "create", "update", "delete", "patch",
            ],
        ),
    ]
}

/// The middle part of upstream's list: KubeVirt's groups.
fn controller_kubevirt_rules() -> Vec<PolicyRule> {
    let rw = ALL_WRITE;
    vec![
        rule(
            &["snapshot.kubevirt.io"],
            &[
                "virtualmachinesnapshots",
                "virtualmachinesnapshots/status",
                "virtualmachinesnapshots/finalizers",
                "virtualmachinesnapshotcontents",
                "virtualmachinesnapshotcontents/status",
                "virtualmachinesnapshotcontents/finalizers",
                "virtualmachinerestores",
                "virtualmachinerestores/status",
            ],
            rw,
        ),
        rule(
            &["export.kubevirt.io"],
            &[
                "virtualmachineexports",
                "virtualmachineexports/status",
                "virtualmachineexports/finalizers",
            ],
            rw,
        ),
        rule(
            &["backup.kubevirt.io"],
            &[
                "virtualmachinebackups",
                "virtualmachinebackups/status",
                "virtualmachinebackups/finalizers",
            ],
            rw,
        ),
        rule(
            &["backup.kubevirt.io"],
            &[
                "virtualmachinebackuptrackers",
                "virtualmachinebackuptrackers/status",
            ],
            rw,
        ),
        rule(
            &["template.kubevirt.io"],
            &["virtualmachinetemplates"],
            GET_LIST_WATCH,
        ),
        rule(
            &["pool.kubevirt.io"],
            &[
                "virtualmachinepools",
                "virtualmachinepools/finalizers",
                "virtualmachinepools/status",
                "virtualmachinepools/scale",
            ],
            &[
                "watch", "list", "create", "delete", "update", "patch", "get",
            ],
        ),
        // Upstream's wildcard: virt-controller owns every kubevirt.io resource.
        rule(&[KV], &["*"], &["*"]),
        rule(
            &[KV],
            &[
                "virtualmachines/finalizers",
                "virtualmachineinstances/finalizers",
            ],
            &["update"],
        ),
        rule(
            &[SUBRESOURCES_GROUP],
            &[
                "virtualmachines/stop",
                "virtualmachineinstances/addvolume",
                "virtualmachineinstances/removevolume",
                "virtualmachineinstances/backup",
                "virtualmachineinstances/redefine-checkpoint",
                "virtualmachineinstances/freeze",
                "virtualmachineinstances/unfreeze",
                "virtualmachineinstances/reset",
                "virtualmachineinstances/softreboot",
                "virtualmachineinstances/sev/setupsession",
                "virtualmachineinstances/sev/injectlaunchsecret",
            ],
            &["update"],
        ),
    ]
}

/// The last part of upstream's list: CRDs, reviews, storage, jobs, DRA, Multus.
fn controller_storage_and_other_rules() -> Vec<PolicyRule> {
    vec![
        rule(&["cdi.kubevirt.io"], &["*"], &["*"]),
        rule(
            &["apiextensions.k8s.io"],
            &["customresourcedefinitions"],
            GET_LIST_WATCH,
        ),
        rule(
            &["authorization.k8s.io"],
            &["subjectaccessreviews"],
            &["create"],
        ),
        rule(
            &["snapshot.storage.k8s.io"],
            &["volumesnapshotclasses"],
            GET_LIST_WATCH,
        ),
        rule(
            &["snapshot.storage.k8s.io"],
            &["volumesnapshots"],
            &["get", "list", "watch", "create", "update", "delete"],
        ),
        rule(&["storage.k8s.io"], &["storageclasses"], GET_LIST_WATCH),
        rule(&[INSTANCETYPE], INSTANCETYPES, GET_LIST_WATCH),
        rule(&[MIGRATIONS], &["migrationpolicies"], GET_LIST_WATCH),
        rule(
            &["clone.kubevirt.io"],
            &[
                "virtualmachineclones",
                "virtualmachineclones/status",
                "virtualmachineclones/finalizers",
            ],
            &["get", "list", "watch", "update", "patch", "delete"],
        ),
        rule(&[""], &["namespaces"], &["get"]),
        rule(&[""], &["resourcequotas"], &["list", "watch"]),
        rule(&["batch"], &["jobs"], &["create", "get", "delete"]),
        rule(
            &["resource.k8s.io"],
            &["resourceslices", "resourceclaims"],
            &["list", "watch", "get"],
        ),
        // Upstream adds this when Multus is installed (`includeNADRules`).
        rule(
            &["k8s.cni.cncf.io"],
            &["network-attachment-definitions"],
            &["get"],
        ),
    ]
}

fn controller_role_rules() -> Vec<PolicyRule> {
    vec![
        rule(
            &["route.openshift.io"],
            &["routes"],
            &["list", "get", "watch"],
        ),
        rule(&[""], &["secrets"], &["list", "get", "watch"]),
        rule(
            &["networking.k8s.io"],
            &["ingresses"],
            &["list", "get", "watch"],
        ),
        // The leader Lease `virt-controller`.
        rule(&["coordination.k8s.io"], &["leases"], ALL_WRITE),
    ]
}

/// virt-controller's roles and bindings.
pub(crate) fn controller_objects(config: &InstallConfig) -> Vec<RbacObject> {
    let ns = &config.namespace;
    vec![
        RbacObject::Role(RoleSpec::new(
            Scope::Cluster,
            CONTROLLER_SERVICE_ACCOUNT,
            controller_cluster_rules(),
        )),
        bind(Scope::Cluster, CONTROLLER_SERVICE_ACCOUNT, ns),
        RbacObject::Role(RoleSpec::new(
            Scope::Namespaced,
            CONTROLLER_SERVICE_ACCOUNT,
            controller_role_rules(),
        )),
        bind(Scope::Namespaced, CONTROLLER_SERVICE_ACCOUNT, ns),
    ]
}

fn handler_cluster_rules() -> Vec<PolicyRule> {
    vec![
        // Upstream's `update, list, watch`, plus `get` and `patch`: this handler writes the
        // VMI status as patches (docs/adr/0004) and re-reads a VMI a patch raced with.
        rule(
            &[KV],
            &["virtualmachineinstances"],
            &["update", "list", "watch", "get", "patch"],
        ),
        rule(&[""], &["nodes"], &["patch", "list", "watch", "get"]),
        // Not upstream's: without the device-plugin API the handler itself advertises
        // `devices.kubevirt.io/*` in the Node's capacity.
        rule(&[""], &["nodes/status"], &["patch"]),
        rule(&[""], &["configmaps"], GET_LIST_WATCH),
        // Not upstream's: upstream's kubelet pulls containerDisks with the VMI's
        // `imagePullSecret`; here virt-handler pulls them, so it reads that Secret by name
        // (`get` only: it can neither list nor watch Secrets).
        rule(&[""], &["secrets"], &["get"]),
        rule(&[""], &["events"], &["create", "patch"]),
        rule(
            &["apiextensions.k8s.io"],
            &["customresourcedefinitions"],
            GET_LIST_WATCH,
        ),
        rule(&[KV], &["kubevirts"], GET_LIST_WATCH),
        rule(&[MIGRATIONS], &["migrationpolicies"], GET_LIST_WATCH),
        rule(
            &["backup.kubevirt.io"],
            &[
                "virtualmachinebackuptrackers",
                "virtualmachinebackuptrackers/status",
            ],
            &["list", "watch", "patch"],
        ),
        rule(&["plugin.kubevirt.io"], &["plugins"], GET_LIST_WATCH),
    ]
}

fn handler_role_rules() -> Vec<PolicyRule> {
    vec![rule(&[""], &["configmaps"], GET_LIST_WATCH)]
}

/// virt-handler's roles and bindings.
pub(crate) fn handler_objects(namespace: &str) -> Vec<RbacObject> {
    vec![
        RbacObject::Role(RoleSpec::new(
            Scope::Cluster,
            HANDLER_SERVICE_ACCOUNT,
            handler_cluster_rules(),
        )),
        bind(Scope::Cluster, HANDLER_SERVICE_ACCOUNT, namespace),
        RbacObject::Role(RoleSpec::new(
            Scope::Namespaced,
            HANDLER_SERVICE_ACCOUNT,
            handler_role_rules(),
        )),
        bind(Scope::Namespaced, HANDLER_SERVICE_ACCOUNT, namespace),
    ]
}

/// The certificate Secrets the operator manages (upstream's `components/secrets.go`).
const OPERATOR_SECRETS: &[&str] = &[
    "kubevirt-ca",
    "kubevirt-export-ca",
    "kubevirt-backup-ca",
    "kubevirt-virt-handler-certs",
    "kubevirt-virt-handler-server-certs",
    "kubevirt-virt-handler-migration-client-certs",
    "kubevirt-virt-handler-vsock-client-certs",
    "kubevirt-virt-handler-monitoring-client-certs",
    "kubevirt-operator-certs",
    "kubevirt-virt-api-certs",
    "kubevirt-controller-certs",
    "kubevirt-exportproxy-certs",
    "kubevirt-synchronization-controller-certs",
    "kubevirt-synchronization-controller-server-certs",
    "kubevirt-virt-template-api-certs",
    "kubevirt-virt-template-webhook-certs",
    "kubevirt-virt-template-controller-metrics-certs",
];

fn operator_role_rules() -> Vec<PolicyRule> {
    let manage = &["create", "get", "list", "watch", "patch", "delete"];
    let mut rules = vec![
        named_rule(&[""], &["secrets"], OPERATOR_SECRETS, manage),
        rule(&[""], &["configmaps"], manage),
        rule(&["route.openshift.io"], &["routes"], manage),
        rule(
            &["route.openshift.io"],
            &["routes/custom-host"],
            &["create"],
        ),
        rule(&["coordination.k8s.io"], &["leases"], ALL_WRITE),
        // kubevirt-rs: the operator's readiness check includes a ready endpoint of virt-api's
        // Service (admission works), which upstream's operator does not look at.
        rule(&["discovery.k8s.io"], &["endpointslices"], GET_LIST_WATCH),
    ];
    rules.extend(api_role_rules());
    rules.extend(controller_role_rules());
    rules.extend(handler_role_rules());
    rules
}

fn operator_cluster_rules() -> Vec<PolicyRule> {
    let rw = &[
        "get", "list", "watch", "create", "delete", "update", "patch",
    ];
    let security = "security.openshift.io";
    let mut rules = vec![
        rule(
            &[KV],
            &["kubevirts"],
            &["get", "list", "watch", "patch", "update"],
        ),
        rule(
            &[""],
            &["serviceaccounts", "services", "endpoints", "pods/exec"],
            &[
                "get", "list", "watch", "create", "update", "delete", "patch",
            ],
        ),
        rule(&[""], &["configmaps"], &["patch", "delete"]),
        rule(
            &["batch"],
            &["jobs"],
            &["get", "list", "watch", "create", "delete", "patch"],
        ),
        rule(
            &["apps"],
            &["controllerrevisions"],
            &["watch", "list", "create", "delete", "patch"],
        ),
        rule(
            &["apps"],
            &["deployments", "daemonsets"],
            &["get", "list", "watch", "create", "delete", "patch"],
        ),
        rule(
            &[super::RBAC_GROUP],
            &[
                "clusterroles",
                "clusterrolebindings",
                "roles",
                "rolebindings",
            ],
            &[
                "get", "list", "watch", "create", "delete", "patch", "update",
            ],
        ),
        rule(
            &["apiextensions.k8s.io"],
            &["customresourcedefinitions"],
            &["get", "list", "watch", "create", "delete", "patch"],
        ),
        rule(
            &[security],
            &["securitycontextconstraints"],
            &["create", "get", "list", "watch"],
        ),
        named_rule(
            &[security],
            &["securitycontextconstraints"],
            &["privileged"],
            &["get", "patch", "update"],
        ),
        named_rule(
            &[security],
            &["securitycontextconstraints"],
            &["kubevirt-handler", "kubevirt-controller"],
            &["get", "list", "watch", "update", "delete"],
        ),
        rule(
            &["admissionregistration.k8s.io"],
            &[
                "validatingwebhookconfigurations",
                "mutatingwebhookconfigurations",
                "validatingadmissionpolicybindings",
                "validatingadmissionpolicies",
            ],
            rw,
        ),
        rule(&["apiregistration.k8s.io"], &["apiservices"], rw),
    ];
    rules.extend(operator_other_rules());
    rules.extend(api_cluster_rules());
    rules.extend(controller_cluster_rules());
    rules.extend(handler_cluster_rules());
    for role in cluster::upstream_roles() {
        rules.extend(role.rules);
    }
    // Auth delegation, which virt-api's `system:auth-delegator` binding grants.
    rules.push(rule(
        &["authentication.k8s.io"],
        &["tokenreviews"],
        &["create"],
    ));
    rules.push(rule(
        &["authorization.k8s.io"],
        &["subjectaccessreviews"],
        &["create"],
    ));
    rules
}

/// The second part of the operator's own rules: monitoring, namespaces, templates, metrics.
fn operator_other_rules() -> Vec<PolicyRule> {
    let rw = &[
        "get", "list", "watch", "create", "delete", "update", "patch",
    ];
    let template = "template.kubevirt.io";
    vec![
        rule(
            &["monitoring.coreos.com"],
            &["servicemonitors", "prometheusrules"],
            rw,
        ),
        rule(&[""], &["namespaces"], &["get", "list", "watch", "patch"]),
        rule(
            &[template],
            &["virtualmachinetemplates", "virtualmachinetemplaterequests"],
            &[
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ],
        ),
        rule(
            &[template],
            &[
                "virtualmachinetemplates/status",
                "virtualmachinetemplaterequests/status",
            ],
            &["get", "patch"],
        ),
        rule(
            &[template],
            &[
                "virtualmachinetemplates/finalizers",
                "virtualmachinetemplaterequests/finalizers",
            ],
            &["update"],
        ),
        rule(
            &[template],
            &["virtualmachinetemplaterequests/source"],
            &["create"],
        ),
        PolicyRule {
            non_resource_urls: Some(vec!["/metrics".into()]),
            verbs: vec!["get".into()],
            ..PolicyRule::default()
        },
    ]
}

/// The `kubevirt.io:operator` ClusterRole of upstream's operator manifest: managing the
/// KubeVirt CR, aggregated to `admin`.
fn operator_user_role() -> RoleSpec {
    RoleSpec {
        labels: vec![
            ("operator.kubevirt.io", ""),
            ("rbac.authorization.k8s.io/aggregate-to-admin", "true"),
        ],
        ..RoleSpec::new(
            Scope::Cluster,
            "kubevirt.io:operator",
            vec![rule(
                &[KV],
                &["kubevirts"],
                &[
                    "get",
                    "delete",
                    "create",
                    "update",
                    "patch",
                    "list",
                    "watch",
                    "deletecollection",
                ],
            )],
        )
    }
}

/// virt-operator's roles and bindings (upstream's `GetAllOperator` order, after the
/// manifest's `kubevirt.io:operator`).
pub(crate) fn operator_objects(namespace: &str) -> Vec<RbacObject> {
    vec![
        RbacObject::Role(operator_user_role()),
        RbacObject::Role(RoleSpec::new(
            Scope::Namespaced,
            OPERATOR_SERVICE_ACCOUNT,
            operator_role_rules(),
        )),
        RbacObject::Binding(BindingSpec {
            scope: Scope::Namespaced,
            name: "kubevirt-operator-rolebinding",
            role_kind: "Role",
            role: OPERATOR_SERVICE_ACCOUNT,
            annotations: Vec::new(),
            subjects: vec![service_account(namespace, OPERATOR_SERVICE_ACCOUNT)],
        }),
        RbacObject::Role(RoleSpec::new(
            Scope::Cluster,
            OPERATOR_SERVICE_ACCOUNT,
            operator_cluster_rules(),
        )),
        bind(Scope::Cluster, OPERATOR_SERVICE_ACCOUNT, namespace),
    ]
}

/// Every component role as upstream writes it (before dropping unserved groups).
pub(crate) fn upstream_roles(config: &InstallConfig) -> Vec<RoleSpec> {
    let ns = &config.namespace;
    let mut all = api_objects(ns);
    all.extend(controller_objects(config));
    all.extend(handler_objects(ns));
    all.extend(operator_objects(ns));
    all.into_iter()
        .filter_map(|o| match o {
            RbacObject::Role(role) => Some(role),
            RbacObject::Binding(_) => None,
        })
        .collect()
}
