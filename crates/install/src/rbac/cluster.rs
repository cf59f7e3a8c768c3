//! KubeVirt's user roles (upstream's `rbac/cluster.go`): `kubevirt.io:default` for every
//! authenticated user, `kubevirt.io:{admin,edit,view}` aggregated into Kubernetes'
//! `admin`/`edit`/`view`, `instancetype.kubevirt.io:view` and `kubevirt.io:migrate`.

use k8s_openapi::api::rbac::v1::PolicyRule;

use super::{BindingSpec, RbacObject, RoleSpec, SUBRESOURCES_GROUP, Scope, group, rule};
use crate::meta::APP_LABEL;

const KV: &str = "kubevirt.io";
const SUB: &str = SUBRESOURCES_GROUP;
const INSTANCETYPES: &[&str] = &[
    "virtualmachineinstancetypes",
    "virtualmachineclusterinstancetypes",
    "virtualmachinepreferences",
    "virtualmachineclusterpreferences",
];
const AUTOUPDATE: (&str, &str) = ("rbac.authorization.kubernetes.io/autoupdate", "true");
const GET_LIST_WATCH: &[&str] = &["get", "list", "watch"];
const EDIT: &[&str] = &[
    "get", "delete", "create", "update", "patch", "list", "watch",
];
const ADMIN: &[&str] = &[
    "get",
    "delete",
    "create",
    "update",
    "patch",
    "list",
    "watch",
    "deletecollection",
];

/// Name of the role every authenticated user holds.
pub const DEFAULT_ROLE: &str = "kubevirt.io:default";
/// The role aggregated to `admin`.
pub const ADMIN_ROLE: &str = "kubevirt.io:admin";
/// The role aggregated to `edit`.
pub const EDIT_ROLE: &str = "kubevirt.io:edit";
/// The role aggregated to `view`.
pub const VIEW_ROLE: &str = "kubevirt.io:view";
/// The cluster instance types and preferences every authenticated user may read.
pub const INSTANCETYPE_VIEW_ROLE: &str = "instancetype.kubevirt.io:view";

/// Console, VNC and the other read subresources of VMIs and VMs.
const VMI_GET_SUBRESOURCES: &[&str] = &[
    "virtualmachineinstances/console",
    "virtualmachineinstances/vnc",
    "virtualmachineinstances/vnc/screenshot",
    "virtualmachineinstances/portforward",
    "virtualmachineinstances/guestosinfo",
    "virtualmachineinstances/filesystemlist",
    "virtualmachineinstances/userlist",
    "virtualmachineinstances/sev/fetchcertchain",
    "virtualmachineinstances/sev/querylaunchmeasurement",
    "virtualmachineinstances/usbredir",
    "virtualmachines/objectgraph",
    "virtualmachineinstances/objectgraph",
];

const VMI_UPDATE_SUBRESOURCES: &[&str] = &[
    "virtualmachineinstances/pause",
    "virtualmachineinstances/unpause",
    "virtualmachineinstances/addvolume",
    "virtualmachineinstances/removevolume",
    "virtualmachineinstances/freeze",
    "virtualmachineinstances/unfreeze",
    "virtualmachineinstances/softreboot",
    "virtualmachineinstances/reset",
    "virtualmachineinstances/sev/setupsession",
    "virtualmachineinstances/sev/injectlaunchsecret",
    "virtualmachineinstances/evacuate/cancel",
];

const VM_UPDATE_SUBRESOURCES: &[&str] = &[
    "virtualmachines/start",
    "virtualmachines/stop",
    "virtualmachines/restart",
    "virtualmachines/addvolume",
    "virtualmachines/removevolume",
    "virtualmachines/memorydump",
    "virtualmachines/removememorydump",
    "virtualmachines/evacuate/cancel",
];

const CORE_KINDS: &[&str] = &[
    "virtualmachines",
    "virtualmachineinstances",
    "virtualmachineinstancepresets",
    "virtualmachineinstancereplicasets",
];

/// The rules `admin` and `edit` share, with `verbs` on the objects users own.
fn writer_rules(vmi_get: &[&str], verbs: &[&str]) -> Vec<PolicyRule> {
    vec![
        rule(&[SUB], vmi_get, &["get"]),
        rule(&[SUB], VMI_UPDATE_SUBRESOURCES, &["update"]),
        rule(
            &[SUB],
            &["virtualmachines/expand-spec", "virtualmachines/portforward"],
            &["get"],
        ),
        rule(&[SUB], VM_UPDATE_SUBRESOURCES, &["update"]),
        rule(&[SUB], &["expand-vm-spec"], &["update"]),
        rule(&[KV], CORE_KINDS, verbs),
        rule(&[KV], &["virtualmachineinstancemigrations"], GET_LIST_WATCH),
        rule(
            &["snapshot.kubevirt.io"],
            &[
                "virtualmachinesnapshots",
                "virtualmachinesnapshotcontents",
                "virtualmachinerestores",
            ],
            verbs,
        ),
        rule(
            &["backup.kubevirt.io"],
            &["virtualmachinebackups", "virtualmachinebackuptrackers"],
            verbs,
        ),
    ]
}

fn admin_rules() -> Vec<PolicyRule> {
    let mut rules = writer_rules(VMI_GET_SUBRESOURCES, ADMIN);
    rules.extend([
        rule(&["plugin.kubevirt.io"], &["plugins"], ADMIN),
        rule(&["export.kubevirt.io"], &["virtualmachineexports"], ADMIN),
        rule(&["clone.kubevirt.io"], &["virtualmachineclones"], ADMIN),
        rule(&["instancetype.kubevirt.io"], INSTANCETYPES, ADMIN),
        rule(&["pool.kubevirt.io"], &["virtualmachinepools"], ADMIN),
        rule(
            &["migrations.kubevirt.io"],
            &["migrationpolicies"],
            GET_LIST_WATCH,
        ),
    ]);
    rules
}

fn edit_rules() -> Vec<PolicyRule> {
    // Upstream's edit role has no VNC screenshot.
    let vmi_get: Vec<&str> = VMI_GET_SUBRESOURCES
        .iter()
        .copied()
        .filter(|r| *r != "virtualmachineinstances/vnc/screenshot")
        .collect();
    let mut rules = writer_rules(&vmi_get, EDIT);
    rules.extend([
        rule(&["export.kubevirt.io"], &["virtualmachineexports"], EDIT),
        rule(&["clone.kubevirt.io"], &["virtualmachineclones"], EDIT),
        rule(&["instancetype.kubevirt.io"], INSTANCETYPES, EDIT),
        rule(&["pool.kubevirt.io"], &["virtualmachinepools"], EDIT),
        rule(&[KV], &["kubevirts"], &["get", "list"]),
        rule(
            &["migrations.kubevirt.io"],
            &["migrationpolicies"],
            GET_LIST_WATCH,
        ),
    ]);
    rules
}

fn view_rules() -> Vec<PolicyRule> {
    let mut kinds = CORE_KINDS.to_vec();
    kinds.push("virtualmachineinstancemigrations");
    vec![
        rule(&[KV], &["kubevirts"], &["get", "list"]),
        rule(
            &[SUB],
            &[
                "virtualmachines/expand-spec",
                "virtualmachineinstances/guestosinfo",
                "virtualmachineinstances/filesystemlist",
                "virtualmachineinstances/userlist",
                "virtualmachineinstances/sev/fetchcertchain",
                "virtualmachineinstances/sev/querylaunchmeasurement",
                "virtualmachines/objectgraph",
                "virtualmachineinstances/objectgraph",
            ],
            &["get"],
        ),
        rule(&[SUB], &["expand-vm-spec"], &["update"]),
        rule(&[KV], &kinds, GET_LIST_WATCH),
        rule(
            &["snapshot.kubevirt.io"],
            &[
                "virtualmachinesnapshots",
                "virtualmachinesnapshotcontents",
                "virtualmachinerestores",
            ],
            GET_LIST_WATCH,
        ),
        rule(
            &["backup.kubevirt.io"],
            &["virtualmachinebackups", "virtualmachinebackuptrackers"],
            GET_LIST_WATCH,
        ),
        rule(
            &["export.kubevirt.io"],
            &["virtualmachineexports"],
            GET_LIST_WATCH,
        ),
        rule(
            &["clone.kubevirt.io"],
            &["virtualmachineclones"],
            GET_LIST_WATCH,
        ),
        rule(&["instancetype.kubevirt.io"], INSTANCETYPES, GET_LIST_WATCH),
        rule(
            &["pool.kubevirt.io"],
            &["virtualmachinepools"],
            GET_LIST_WATCH,
        ),
        rule(
            &["migrations.kubevirt.io"],
            &["migrationpolicies"],
            GET_LIST_WATCH,
        ),
        rule(&["plugin.kubevirt.io"], &["plugins"], GET_LIST_WATCH),
    ]
}

fn aggregated(name: &'static str, to: &'static str, rules: Vec<PolicyRule>) -> RoleSpec {
    RoleSpec {
        labels: vec![(APP_LABEL, ""), (to, "true")],
        ..RoleSpec::new(Scope::Cluster, name, rules)
    }
}

/// The user roles as upstream writes them, in upstream's order.
pub(crate) fn upstream_roles() -> Vec<RoleSpec> {
    vec![
        RoleSpec {
            labels: vec![
                (APP_LABEL, ""),
                ("kubernetes.io/bootstrapping", "rbac-defaults"),
            ],
            annotations: vec![AUTOUPDATE],
            ..RoleSpec::new(
                Scope::Cluster,
                DEFAULT_ROLE,
                vec![
                    rule(&[KV], &["kubevirts"], &["get", "list"]),
                    rule(&[SUB], &["version", "guestfs"], &["get", "list"]),
                ],
            )
        },
        aggregated(
            ADMIN_ROLE,
            "rbac.authorization.k8s.io/aggregate-to-admin",
            admin_rules(),
        ),
        aggregated(
            EDIT_ROLE,
            "rbac.authorization.k8s.io/aggregate-to-edit",
            edit_rules(),
        ),
        aggregated(
            VIEW_ROLE,
            "rbac.authorization.k8s.io/aggregate-to-view",
            view_rules(),
        ),
        RoleSpec::new(
            Scope::Cluster,
            INSTANCETYPE_VIEW_ROLE,
            vec![rule(
                &["instancetype.kubevirt.io"],
                &[
                    "virtualmachineclusterinstancetypes",
                    "virtualmachineclusterpreferences",
                ],
                GET_LIST_WATCH,
            )],
        ),
        RoleSpec::new(
            Scope::Cluster,
            "kubevirt.io:migrate",
            vec![
                rule(&[SUB], &["virtualmachines/migrate"], &["update"]),
                rule(&[KV], &["virtualmachineinstancemigrations"], ADMIN),
            ],
        ),
    ]
}

fn authenticated_binding(name: &'static str) -> RbacObject {
    RbacObject::Binding(BindingSpec {
        scope: Scope::Cluster,
        name,
        role_kind: "ClusterRole",
        role: name,
        annotations: vec![AUTOUPDATE],
        subjects: vec![group("system:authenticated")],
    })
}

/// The roles with their bindings, in upstream's order (`GetAllCluster`).
///
/// `instancetype.kubevirt.io:view` and its binding are kept even while no instance type CRD
/// exists: the role is then empty, which grants nothing, and the binding keeps its name.
pub(crate) fn objects() -> Vec<RbacObject> {
    let mut roles = upstream_roles().into_iter().map(RbacObject::Role);
    let mut out = Vec::new();
    out.extend(roles.next()); // default
    out.push(authenticated_binding(DEFAULT_ROLE));
    out.extend(roles.by_ref().take(4)); // admin, edit, view, instancetype view
    out.push(authenticated_binding(INSTANCETYPE_VIEW_ROLE));
    out.extend(roles); // migrate
    out
}
