//! AdmissionReview v1 handling: decode the request, run the mutator or validator of the path,
//! encode the response (JSON patch, warnings, or a 422 `Invalid` status with the causes).

use std::collections::BTreeSet;

use base64::Engine;
use kubevirt_api::pool::v1beta1::VirtualMachinePool;
use kubevirt_api::v1::{
    VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration,
    VirtualMachineInstanceReplicaSet,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::config::ClusterConfig;
use crate::mutate;
use crate::validate::{self, Cause, migration::MigrationContext, vm::VmRequest};

/// Webhook paths, as upstream registers them.
pub mod paths {
    /// VMI mutator (CREATE, UPDATE).
    pub const VMI_MUTATE: &str = "/virtualmachineinstances-mutate";
    /// VM mutator (CREATE, UPDATE).
    pub const VM_MUTATE: &str = "/virtualmachines-mutate";
    /// Migration mutator (CREATE).
    pub const MIGRATION_MUTATE: &str = "/migration-mutate-create";
    /// VMI create validator.
    pub const VMI_VALIDATE_CREATE: &str = "/virtualmachineinstances-validate-create";
    /// VMI update validator.
    pub const VMI_VALIDATE_UPDATE: &str = "/virtualmachineinstances-validate-update";
    /// VM validator (CREATE, UPDATE).
    pub const VM_VALIDATE: &str = "/virtualmachines-validate";
    /// Replica set validator (CREATE, UPDATE).
    pub const VMIRS_VALIDATE: &str = "/virtualmachinereplicaset-validate";
    /// Pool validator (CREATE, UPDATE).
    pub const POOL_VALIDATE: &str = "/virtualmachinepool-validate";
    /// Migration create validator.
    pub const MIGRATION_VALIDATE_CREATE: &str = "/migration-validate-create";
    /// Migration update validator.
    pub const MIGRATION_VALIDATE_UPDATE: &str = "/migration-validate-update";
    /// Pod eviction validator (`pods/eviction`, launcher and hotplug pods).
    pub const POD_EVICTION_VALIDATE: &str = "/pod-eviction-validate";
}

/// Service accounts KubeVirt components run as, in `namespace`.
#[must_use]
pub fn kubevirt_service_accounts(namespace: &str) -> BTreeSet<String> {
    [
        "kubevirt-apiserver",
        "kubevirt-controller",
        "kubevirt-handler",
        "kubevirt-synchronization-controller",
    ]
    .iter()
    .map(|sa| format!("system:serviceaccount:{namespace}:{sa}"))
    .collect()
}

/// What a handler needs besides the request.
pub struct ReviewContext<'a> {
    /// Current cluster configuration.
    pub cfg: &'a ClusterConfig,
    /// Users treated as KubeVirt service accounts.
    pub service_accounts: &'a BTreeSet<String>,
    /// Client for look-ups (migration create); `None` skips the checks that need other objects.
    pub client: Option<&'a kube::Client>,
}

/// A malformed `AdmissionReview` (answered with HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The body is not an AdmissionReview with a `request`.
    #[error("malformed AdmissionReview: {0}")]
    Malformed(String),
    /// No webhook is served at the path.
    #[error("no admission webhook at {0}")]
    UnknownPath(String),
}

/// The outcome of one admission.
#[derive(Debug, Default, PartialEq)]
pub struct Outcome {
    /// Causes of a denial (422).
    pub causes: Vec<Cause>,
    /// A denial without causes (400), e.g. an undecodable object.
    pub error: Option<String>,
    /// JSON patch operations of a mutation.
    pub patch: Vec<Value>,
    /// Warnings shown to the client.
    pub warnings: Vec<String>,
    /// The HTTP code of an `error` denial (400 when unset; 429 for evictions).
    pub code: Option<u16>,
}

impl Outcome {
    /// A denial with `causes` (422).
    pub fn causes(causes: Vec<Cause>) -> Self {
        Self {
            causes,
            ..Self::default()
        }
    }

    /// A denial without causes (400).
    pub fn error(message: impl Into<String>) -> Self {
        Self {
            error: Some(message.into()),
            ..Self::default()
        }
    }
}

/// The `status` of a denial, as upstream's `ToAdmissionResponse`: the first ten causes, their
/// messages joined as the message.
#[must_use]
pub fn invalid_status(causes: &[Cause]) -> Value {
    let shown = &causes[..causes.len().min(10)];
    let mut message = shown
        .iter()
        .map(|c| c.message.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    if causes.len() > 10 {
        message = format!(
            "{message}, and {} more validation errors",
            causes.len() - 10
        );
    }
    json!({
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Invalid",
        "details": {"causes": shown},
        "code": 422,
    })
}

/// Handles one AdmissionReview body posted to `path`; returns the response review.
///
/// # Errors
/// When the body is not an AdmissionReview or the path is unknown.
pub async fn handle(
    path: &str,
    body: &Value,
    ctx: &ReviewContext<'_>,
) -> Result<Value, ReviewError> {
    let request = review_request(body)?;
    let outcome = admit(path, request, ctx).await?;
    respond(body, outcome)
}

/// The `request` of an AdmissionReview body.
///
/// # Errors
/// When there is none.
pub fn review_request(body: &Value) -> Result<&Value, ReviewError> {
    body.get("request")
        .filter(|r| r.is_object())
        .ok_or_else(|| ReviewError::Malformed("missing request".into()))
}

/// The AdmissionReview answering `body` with `outcome` (any webhook server's answer).
///
/// # Errors
/// When the body has no request or the patch cannot be encoded.
pub fn respond(body: &Value, outcome: Outcome) -> Result<Value, ReviewError> {
    let uid = review_request(body)?
        .get("uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let api_version = body
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("admission.k8s.io/v1");
    let mut response = json!({"uid": uid, "allowed": true});
    if let Some(message) = outcome.error {
        response["allowed"] = json!(false);
        response["status"] = json!({"metadata": {}, "status": "Failure", "message": message, "code": outcome.code.unwrap_or(400)});
    } else if !outcome.causes.is_empty() {
        response["allowed"] = json!(false);
        response["status"] = invalid_status(&outcome.causes);
    } else if !outcome.patch.is_empty() {
        let bytes = serde_json::to_vec(&outcome.patch)
            .map_err(|e| ReviewError::Malformed(e.to_string()))?;
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    if !outcome.warnings.is_empty() {
        response["warnings"] = json!(outcome.warnings);
    }
    Ok(json!({"apiVersion": api_version, "kind": "AdmissionReview", "response": response}))
}

fn decode<T: DeserializeOwned>(request: &Value, key: &str) -> Result<T, String> {
    let raw = request.get(key).cloned().unwrap_or(Value::Null);
    serde_json::from_value(raw).map_err(|e| e.to_string())
}

/// The patch turning the submitted `raw` object into `after`.
///
/// `typed_before` is the submitted object after a decode/encode round trip; diffing it (not the
/// raw body) against `after` keeps round-trip artifacts out of the patch. Top-level members whose
/// raw value differs from the round trip (unknown fields) are replaced whole with `add`, which
/// also works when the member is absent.
fn mutation<T: Serialize>(raw: &Value, typed_before: &Value, after: &T) -> Outcome {
    let after = match serde_json::to_value(after) {
        Ok(a) => a,
        Err(e) => return Outcome::error(e.to_string()),
    };
    let (Some(before_map), Some(after_map)) = (typed_before.as_object(), after.as_object()) else {
        return Outcome {
            patch: mutate::diff(raw, &after),
            ..Outcome::default()
        };
    };
    let mut patch = Vec::new();
    for (key, value) in after_map {
        let old = before_map.get(key).unwrap_or(&Value::Null);
        if old == value {
            continue;
        }
        let path = format!("/{}", mutate::patch::escape(key));
        match raw.get(key) {
            Some(r) if r == old => {
                for mut op in mutate::diff(old, value) {
                    let sub = op["path"].as_str().unwrap_or_default().to_owned();
                    op["path"] = json!(format!("{path}{sub}"));
                    patch.push(op);
                }
            }
            _ => patch.push(json!({"op": "add", "path": path, "value": value})),
        }
    }
    Outcome {
        patch,
        ..Outcome::default()
    }
}

/// Runs the webhook of `path` on an admission `request`.
///
/// # Errors
/// When the path is unknown.
pub async fn admit(
    path: &str,
    request: &Value,
    ctx: &ReviewContext<'_>,
) -> Result<Outcome, ReviewError> {
    let op = request
        .get("operation")
        .and_then(Value::as_str)
        .unwrap_or("");
    let user = request
        .pointer("/userInfo/username")
        .and_then(Value::as_str)
        .unwrap_or("");
    let is_sa = ctx.service_accounts.contains(user);
    macro_rules! obj {
        ($t:ty, $key:expr) => {
            match decode::<$t>(request, $key) {
                Ok(v) => v,
                Err(e) => return Ok(Outcome::error(e)),
            }
        };
    }
    let outcome = match path {
        paths::VMI_MUTATE | paths::VM_MUTATE | paths::MIGRATION_MUTATE => {
            admit_mutation(path, request, ctx, is_sa)
        }
        paths::VMI_VALIDATE_CREATE => {
            let vmi = obj!(VirtualMachineInstance, "object");
            Outcome::causes(validate::validate_vmi_create(&vmi, ctx.cfg, is_sa))
        }
        paths::VMI_VALIDATE_UPDATE => {
            let (new, old) = (
                obj!(VirtualMachineInstance, "object"),
                obj!(VirtualMachineInstance, "oldObject"),
            );
            Outcome::causes(validate::validate_vmi_update(&old, &new, is_sa))
        }
        paths::VM_VALIDATE => {
            let vm = obj!(VirtualMachine, "object");
            let req = VmRequest {
                create: op == "CREATE",
                user_is_kubevirt_sa: is_sa,
            };
            let causes = validate::vm::validate_vm_request(&vm, ctx.cfg, req);
            let warnings = if causes.is_empty() {
                validate::vm::vm_warnings(&vm)
            } else {
                Vec::new()
            };
            Outcome {
                causes,
                warnings,
                ..Outcome::default()
            }
        }
        paths::VMIRS_VALIDATE => {
            let rs = obj!(VirtualMachineInstanceReplicaSet, "object");
            Outcome::causes(validate::validate_replicaset(&rs, ctx.cfg))
        }
        paths::POOL_VALIDATE => {
            let pool = obj!(VirtualMachinePool, "object");
            let old = if op == "UPDATE" {
                Some(obj!(VirtualMachinePool, "oldObject"))
            } else {
                None
            };
            Outcome::causes(validate::validate_pool(&pool, old.as_ref(), ctx.cfg))
        }
        paths::MIGRATION_VALIDATE_CREATE => {
            let m = obj!(VirtualMachineInstanceMigration, "object");
            migration_create(&m, user, ctx).await
        }
        paths::MIGRATION_VALIDATE_UPDATE => {
            let (new, old) = (
                obj!(VirtualMachineInstanceMigration, "object"),
                obj!(VirtualMachineInstanceMigration, "oldObject"),
            );
            Outcome::causes(validate::validate_migration_update(&old, &new))
        }
        paths::POD_EVICTION_VALIDATE => match ctx.client {
            Some(client) => {
                let strategy = ctx.cfg.eviction_strategy.as_ref();
                match super::pod_eviction::admit(client, request, strategy).await {
                    Some(message) => Outcome {
                        code: Some(429),
                        ..Outcome::error(message)
                    },
                    None => Outcome::default(),
                }
            }
            None => Outcome::default(),
        },
        other => return Err(ReviewError::UnknownPath(other.to_owned())),
    };
    Ok(outcome)
}

fn admit_mutation(path: &str, request: &Value, ctx: &ReviewContext<'_>, is_sa: bool) -> Outcome {
    let op = request
        .get("operation")
        .and_then(Value::as_str)
        .unwrap_or("");
    let object = request.get("object").cloned().unwrap_or(Value::Null);
    macro_rules! obj {
        ($t:ty, $key:expr) => {
            match decode::<$t>(request, $key) {
                Ok(v) => v,
                Err(e) => return Outcome::error(e),
            }
        };
    }
    match path {
        paths::VMI_MUTATE => {
            let mut vmi = obj!(VirtualMachineInstance, "object");
            let before = serde_json::to_value(&vmi).unwrap_or(Value::Null);
            if op == "CREATE" {
                match mutate::mutate_vmi_create(&mut vmi, ctx.cfg) {
                    Ok(()) => mutation(&object, &before, &vmi),
                    Err(e) => Outcome::error(e.to_string()),
                }
            } else if op == "UPDATE" && !is_sa {
                let old = obj!(VirtualMachineInstance, "oldObject");
                if old.status == vmi.status {
                    Outcome::default()
                } else {
                    vmi.status = old.status;
                    mutation(&object, &before, &vmi)
                }
            } else {
                Outcome::default()
            }
        }
        paths::VM_MUTATE => {
            let mut vm = obj!(VirtualMachine, "object");
            let before = serde_json::to_value(&vm).unwrap_or(Value::Null);
            if op == "CREATE" {
                mutate::mutate_vm_create(&mut vm, ctx.cfg);
                mutation(&object, &before, &vm)
            } else {
                Outcome::default()
            }
        }
        paths::MIGRATION_MUTATE => {
            let mut m = obj!(VirtualMachineInstanceMigration, "object");
            let before = serde_json::to_value(&m).unwrap_or(Value::Null);
            mutate::mutate_migration_create(&mut m);
            mutation(&object, &before, &m)
        }
        _ => Outcome::default(),
    }
}

async fn migration_create(
    m: &VirtualMachineInstanceMigration,
    user: &str,
    ctx: &ReviewContext<'_>,
) -> Outcome {
    let is_controller =
        ctx.service_accounts.contains(user) && user.ends_with(":kubevirt-controller");
    let Some(client) = ctx.client else {
        // Without a client only the request itself is checked; the VMI is assumed to exist.
        let vmi = VirtualMachineInstance::default();
        let ctx2 = MigrationContext {
            vmi: Some(&vmi),
            others: &[],
            user_is_virt_controller: is_controller,
        };
        return Outcome::causes(validate::validate_migration(m, ctx2, ctx.cfg));
    };
    let ns = m.metadata.namespace.clone().unwrap_or_default();
    let vmis: kube::Api<VirtualMachineInstance> = kube::Api::namespaced(client.clone(), &ns);
    let migrations: kube::Api<VirtualMachineInstanceMigration> =
        kube::Api::namespaced(client.clone(), &ns);
    let name = m.spec.vmi_name.clone().unwrap_or_default();
    let vmi = if name.is_empty() {
        None
    } else {
        match vmis.get_opt(&name).await {
            Ok(v) => v,
            Err(e) => return Outcome::error(e.to_string()),
        }
    };
    let others = match migrations.list(&kube::api::ListParams::default()).await {
        Ok(list) => list.items,
        Err(e) => return Outcome::error(e.to_string()),
    };
    let mctx = MigrationContext {
        vmi: vmi.as_ref(),
        others: &others,
        user_is_virt_controller: is_controller,
    };
    Outcome::causes(validate::validate_migration(m, mctx, ctx.cfg))
}
