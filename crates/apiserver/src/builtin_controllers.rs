//! Controllers the embedded Kubernetes needs of kube-controller-manager, run inside the API
//! server as one background task: the **serviceaccount** controller (a `default`
//! ServiceAccount in every namespace) and the **root-ca-cert-publisher** (a
//! `kube-root-ca.crt` ConfigMap in every namespace whose `ca.crt` is the cluster CA, which
//! projected service-account volumes mount next to the token).
//!
//! Data flow: list the namespaces and reconcile each, then follow three store watches —
//! namespaces, serviceaccounts, configmaps — from the list's revision. A namespace that
//! appears or changes, or whose `default` account or `kube-root-ca.crt` is deleted or
//! changed, is reconciled: missing objects are created and a ConfigMap whose `ca.crt`
//! differs is updated, through the same create and update paths as API requests
//! (admission included), as `system:serviceaccount:kube-system:service-account-controller`
//! and `…:root-ca-cert-publisher`. A failed reconcile is retried after [`RETRY_AFTER`].
//!
//! Another issue may move these roles into a controllers crate on the shared controller
//! runtime; they live here until then because nothing else of the embedded wing needs them
//! yet.
//!
//! # Guarantees
//! - Every namespace that exists (and is not being deleted) gets both objects, whether it
//!   was created while the server ran or before it started.
//! - Nothing is left behind in a deleted namespace: namespace deletion removes the contents
//!   before the namespace, so a reconcile racing with it could recreate an object in
//!   between; when the namespace's deletion is seen, such leftovers are removed.
//!
//! # Caveats
//! - A changed CA reaches existing ConfigMaps only at the next reconcile of each namespace
//!   (at start, the CA does not change while the server runs).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kubevirt_store::{Event, StoreError, WatchStream};
use serde_json::{Value, json};
use tracing::{debug, warn};

use crate::handlers::common::{WriteOptions, decode_record};
use crate::handlers::{create, update};
use crate::state::ApiState;
use crate::status::ApiError;

/// The service account every namespace gets.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// The ConfigMap carrying the cluster CA in every namespace.
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";

/// The key of the CA bundle in [`ROOT_CA_CONFIGMAP`].
pub const ROOT_CA_KEY: &str = "ca.crt";

/// How long a failed reconcile waits before it is tried again.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

const SA_CONTROLLER_USER: &str = "system:serviceaccount:kube-system:service-account-controller";
const CA_PUBLISHER_USER: &str = "system:serviceaccount:kube-system:root-ca-cert-publisher";

const NAMESPACES: &str = "/registry/core/namespaces/";
const SERVICE_ACCOUNTS: &str = "/registry/core/serviceaccounts/";
const CONFIG_MAPS: &str = "/registry/core/configmaps/";

/// Starts the controllers; they run until the task is aborted or the store closes.
pub fn spawn(state: Arc<ApiState>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(state))
}

/// What an event asks of the controllers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    /// Make sure the namespace has its objects.
    Reconcile(String),
    /// The namespace is gone: remove what a racing reconcile may have left.
    CleanUp(String),
}

/// The work one store event calls for, if any.
pub fn work_for(event: &Event) -> Option<Work> {
    let key = event.record().key.as_str();
    let deleted = matches!(event, Event::Delete { .. });
    if let Some(ns) = key.strip_prefix(NAMESPACES) {
        return Some(if deleted {
            Work::CleanUp(ns.to_owned())
        } else {
            Work::Reconcile(ns.to_owned())
        });
    }
    let (ns, name) = key
        .strip_prefix(SERVICE_ACCOUNTS)
        .map(|rest| (rest, DEFAULT_SERVICE_ACCOUNT))
        .or_else(|| {
            key.strip_prefix(CONFIG_MAPS)
                .map(|rest| (rest, ROOT_CA_CONFIGMAP))
        })
        .and_then(|(rest, wanted)| {
            let (ns, name) = rest.split_once('/')?;
            (name == wanted).then_some((ns, name))
        })?;
    // A change to our account is not ours to undo; a change to the CA map is.
    if name == DEFAULT_SERVICE_ACCOUNT && !deleted {
        return None;
    }
    Some(Work::Reconcile(ns.to_owned()))
}

async fn run(state: Arc<ApiState>) {
    let mut retry: BTreeSet<String> = BTreeSet::new();
    'relist: loop {
        let listed = state.store.list(NAMESPACES, None, None);
        for r in &listed.records {
            if let Some(ns) = r.key.strip_prefix(NAMESPACES) {
                do_work(&state, Work::Reconcile(ns.to_owned()), &mut retry).await;
            }
        }
        let watches: Result<Vec<WatchStream>, StoreError> =
            [NAMESPACES, SERVICE_ACCOUNTS, CONFIG_MAPS]
                .iter()
                .map(|p| state.store.watch(p, listed.revision))
                .collect();
        let [mut namespaces, mut accounts, mut maps] =
            match watches.map(<[WatchStream; 3]>::try_from) {
                Ok(Ok(w)) => w,
                Ok(Err(_)) => return,
                Err(e) => {
                    warn!(error = %e, "built-in controllers: watch failed; retrying");
                    tokio::time::sleep(RETRY_AFTER).await;
                    continue;
                }
            };
        loop {
            let event = tokio::select! {
                ev = namespaces.next() => ev,
                ev = accounts.next() => ev,
                ev = maps.next() => ev,
                () = tokio::time::sleep(RETRY_AFTER), if !retry.is_empty() => {
                    for ns in std::mem::take(&mut retry) {
                        do_work(&state, Work::Reconcile(ns), &mut retry).await;
                    }
                    continue;
                }
            };
            match event {
                Some(Ok(ev)) => {
                    if let Some(work) = work_for(&ev) {
                        do_work(&state, work, &mut retry).await;
                    }
                }
                Some(Err(e)) => {
                    debug!(error = %e, "built-in controllers: watch ended; listing again");
                    continue 'relist;
                }
                None => return,
            }
        }
    }
}

async fn do_work(state: &ApiState, work: Work, retry: &mut BTreeSet<String>) {
    match work {
        Work::Reconcile(ns) => {
            if let Err(e) = reconcile(state, &ns).await {
                warn!(namespace = %ns, error = %e.message, "built-in controllers: will retry");
                retry.insert(ns);
            }
        }
        Work::CleanUp(ns) => {
            retry.remove(&ns);
            clean_up(state, &ns).await;
        }
    }
}

fn writer(user: &str) -> WriteOptions {
    WriteOptions {
        user: user.to_owned(),
        ..WriteOptions::default()
    }
}

/// Gives namespace `ns` its `default` ServiceAccount and its `kube-root-ca.crt` ConfigMap
/// (with the current CA) unless the namespace is gone or being deleted.
pub async fn reconcile(state: &ApiState, ns: &str) -> Result<(), ApiError> {
    let Some(record) = state.store.get(&format!("{NAMESPACES}{ns}")) else {
        return Ok(());
    };
    let namespace = decode_record(&record)?;
    if namespace["metadata"]["deletionTimestamp"].is_string()
        || namespace["status"]["phase"] == "Terminating"
    {
        return Ok(());
    }
    let sa = json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": DEFAULT_SERVICE_ACCOUNT, "namespace": ns},
    });
    ensure(
        state,
        "serviceaccounts",
        ns,
        sa,
        &writer(SA_CONTROLLER_USER),
    )
    .await?;
    if state.outgoing.ca_pem.is_empty() {
        return Ok(());
    }
    publish_root_ca(state, ns).await
}

async fn publish_root_ca(state: &ApiState, ns: &str) -> Result<(), ApiError> {
    let mut data = serde_json::Map::new();
    data.insert(ROOT_CA_KEY.to_owned(), json!(state.outgoing.ca_pem));
    publish_config_map(state, ns, ROOT_CA_CONFIGMAP, data, CA_PUBLISHER_USER).await
}

/// The ConfigMap kube-apiserver publishes for aggregated API servers.
pub const AUTHENTICATION_CONFIGMAP: &str = "extension-apiserver-authentication";

/// Publishes `kube-system/extension-apiserver-authentication` as kube-apiserver does: the
/// cluster CA for client certificates, and the front-proxy CA with the name and headers an
/// aggregated API server trusts a proxied request by.
///
/// # Errors
/// When the ConfigMap cannot be written.
pub async fn publish_authentication_config(
    state: &ApiState,
    front_proxy_ca_pem: &str,
) -> Result<(), ApiError> {
    let list = |items: &[&str]| json!(serde_json::to_string(items).unwrap_or_default());
    let mut data = serde_json::Map::new();
    data.insert("client-ca-file".into(), json!(state.outgoing.ca_pem));
    data.insert(
        "requestheader-client-ca-file".into(),
        json!(front_proxy_ca_pem),
    );
    data.insert(
        "requestheader-allowed-names".into(),
        list(&["front-proxy-client"]),
    );
    data.insert(
        "requestheader-username-headers".into(),
        list(&["X-Remote-User"]),
    );
    data.insert(
        "requestheader-group-headers".into(),
        list(&["X-Remote-Group"]),
    );
    data.insert(
        "requestheader-extra-headers-prefix".into(),
        list(&["X-Remote-Extra-"]),
    );
    publish_config_map(
        state,
        "kube-system",
        AUTHENTICATION_CONFIGMAP,
        data,
        "system:apiserver",
    )
    .await
}

/// Creates ConfigMap `ns/name` with exactly `data`, or replaces its data when it differs.
async fn publish_config_map(
    state: &ApiState,
    ns: &str,
    name: &str,
    data: serde_json::Map<String, Value>,
    user: &str,
) -> Result<(), ApiError> {
    let info = core(state, "configmaps")?;
    let opts = writer(user);
    match state.store.get(&info.key(Some(ns), name)) {
        None => {
            let cm = json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns},
                "data": data,
            });
            ensure(state, "configmaps", ns, cm, &opts).await
        }
        Some(record) => {
            let mut cm = decode_record(&record)?;
            if cm["data"].as_object() == Some(&data) {
                return Ok(());
            }
            cm["data"] = Value::Object(data);
            match update::update(state, &info, Some(ns), name, None, cm, &opts).await {
                Ok(_) => Ok(()),
                // Gone or changed meanwhile: the watch brings the next reconcile.
                Err(e) if matches!(e.code, 404 | 409) => Ok(()),
                Err(e) => Err(e),
            }
        }
    }
}

fn core(state: &ApiState, plural: &str) -> Result<Arc<crate::registry::ResourceInfo>, ApiError> {
    state
        .registry
        .find("", "v1", plural)
        .ok_or_else(|| ApiError::internal(format!("{plural} are not served")))
}

/// Creates `obj` unless it exists; a namespace that went or is terminating is no failure.
async fn ensure(
    state: &ApiState,
    plural: &str,
    ns: &str,
    obj: Value,
    opts: &WriteOptions,
) -> Result<(), ApiError> {
    let info = core(state, plural)?;
    let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
    if state.store.get(&info.key(Some(ns), &name)).is_some() {
        return Ok(());
    }
    match create::create(state, &info, Some(ns), obj, opts).await {
        Ok(_) => {
            debug!(namespace = ns, %name, plural, "created");
            Ok(())
        }
        Err(e) if matches!(e.code, 404 | 403 | 409) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes the objects a reconcile may have created in namespace `ns` after its contents
/// were deleted (see the module's Guarantees).
async fn clean_up(state: &ApiState, ns: &str) {
    if state.store.get(&format!("{NAMESPACES}{ns}")).is_some() {
        return;
    }
    for key in [
        format!("{SERVICE_ACCOUNTS}{ns}/{DEFAULT_SERVICE_ACCOUNT}"),
        format!("{CONFIG_MAPS}{ns}/{ROOT_CA_CONFIGMAP}"),
    ] {
        if state.store.get(&key).is_some() {
            match state.store.delete(&key, None).await {
                Ok(_) => debug!(key, "removed from a deleted namespace"),
                Err(StoreError::NotFound { .. }) => {}
                Err(e) => {
                    warn!(key, error = %e, "built-in controllers: removing a leftover failed")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kubevirt_store::{Record, Store};

    use super::*;

    fn state() -> ApiState {
        let mut s = ApiState::new(Store::in_memory());
        s.outgoing.ca_pem = "CA PEM".into();
        s
    }

    async fn namespace(state: &ApiState, name: &str) {
        let info = core(state, "namespaces").unwrap();
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        create::create(state, &info, None, ns, &writer("test"))
            .await
            .unwrap();
    }

    fn get(state: &ApiState, key: &str) -> Option<Value> {
        state.store.get(key).map(|r| decode_record(&r).unwrap())
    }

    fn record(key: &str) -> Record {
        Record {
            key: key.into(),
            value: Arc::from(&b"{}"[..]),
            revision: 2,
            create_revision: 1,
        }
    }

    #[tokio::test]
    async fn a_namespace_gets_its_default_account_and_the_cluster_ca() {
        let s = state();
        namespace(&s, "team").await;
        reconcile(&s, "team").await.unwrap();
        let sa = get(&s, "/registry/core/serviceaccounts/team/default").unwrap();
        assert!(!sa["metadata"]["uid"].as_str().unwrap().is_empty());
        let cm = get(&s, "/registry/core/configmaps/team/kube-root-ca.crt").unwrap();
        assert_eq!(cm["data"]["ca.crt"], "CA PEM");
        // A second pass changes nothing.
        let rv = cm["metadata"]["resourceVersion"].clone();
        reconcile(&s, "team").await.unwrap();
        let cm = get(&s, "/registry/core/configmaps/team/kube-root-ca.crt").unwrap();
        assert_eq!(cm["metadata"]["resourceVersion"], rv);
    }

    #[tokio::test]
    async fn the_authentication_config_names_the_front_proxy_and_follows_its_ca() {
        let s = state();
        namespace(&s, "kube-system").await;
        publish_authentication_config(&s, "PROXY CA 1")
            .await
            .unwrap();
        let key = "/registry/core/configmaps/kube-system/extension-apiserver-authentication";
        let cm = get(&s, key).unwrap();
        assert_eq!(cm["data"]["client-ca-file"], "CA PEM");
        assert_eq!(cm["data"]["requestheader-client-ca-file"], "PROXY CA 1");
        assert_eq!(
            cm["data"]["requestheader-allowed-names"],
            r#"["front-proxy-client"]"#
        );
        assert_eq!(
            cm["data"]["requestheader-username-headers"],
            r#"["X-Remote-User"]"#
        );
        assert_eq!(
            cm["data"]["requestheader-group-headers"],
            r#"["X-Remote-Group"]"#
        );
        assert_eq!(
            cm["data"]["requestheader-extra-headers-prefix"],
            r#"["X-Remote-Extra-"]"#
        );
        let rv = cm["metadata"]["resourceVersion"].clone();
        publish_authentication_config(&s, "PROXY CA 1")
            .await
            .unwrap();
        assert_eq!(
            get(&s, key).unwrap()["metadata"]["resourceVersion"],
            rv,
            "unchanged"
        );
        // A renewed front-proxy CA is published at the next start.
        publish_authentication_config(&s, "PROXY CA 2")
            .await
            .unwrap();
        assert_eq!(
            get(&s, key).unwrap()["data"]["requestheader-client-ca-file"],
            "PROXY CA 2"
        );
    }

    #[tokio::test]
    async fn an_edited_ca_map_is_put_back() {
        let s = state();
        namespace(&s, "team").await;
        reconcile(&s, "team").await.unwrap();
        let key = "/registry/core/configmaps/team/kube-root-ca.crt";
        let rev = s.store.get(key).unwrap().revision;
        let mut cm = get(&s, key).unwrap();
        cm["data"] = json!({"ca.crt": "forged", "x": "y"});
        s.store
            .update(key, rev, crate::handlers::common::encoder(cm))
            .await
            .unwrap();
        reconcile(&s, "team").await.unwrap();
        assert_eq!(get(&s, key).unwrap()["data"], json!({"ca.crt": "CA PEM"}));
    }

    #[tokio::test]
    async fn a_missing_namespace_gets_nothing_and_leftovers_of_a_deleted_one_go() {
        let s = state();
        reconcile(&s, "gone").await.unwrap();
        assert!(get(&s, "/registry/core/serviceaccounts/gone/default").is_none());
        namespace(&s, "team").await;
        reconcile(&s, "team").await.unwrap();
        let ns_rev = s
            .store
            .get("/registry/core/namespaces/team")
            .unwrap()
            .revision;
        s.store
            .delete("/registry/core/namespaces/team", Some(ns_rev))
            .await
            .unwrap();
        clean_up(&s, "team").await;
        assert!(get(&s, "/registry/core/serviceaccounts/team/default").is_none());
        assert!(get(&s, "/registry/core/configmaps/team/kube-root-ca.crt").is_none());
    }

    #[test]
    fn events_map_to_the_namespace_they_concern() {
        let put = |key: &str| Event::Put {
            record: record(key),
            prev: None,
        };
        let del = |key: &str| Event::Delete {
            record: record(key),
        };
        let r = |ns: &str| Some(Work::Reconcile(ns.into()));
        assert_eq!(work_for(&put("/registry/core/namespaces/a")), r("a"));
        assert_eq!(
            work_for(&del("/registry/core/namespaces/a")),
            Some(Work::CleanUp("a".into()))
        );
        assert_eq!(
            work_for(&del("/registry/core/serviceaccounts/a/default")),
            r("a")
        );
        assert_eq!(
            work_for(&put("/registry/core/serviceaccounts/a/default")),
            None
        );
        assert_eq!(
            work_for(&del("/registry/core/serviceaccounts/a/other")),
            None
        );
        assert_eq!(
            work_for(&put("/registry/core/configmaps/a/kube-root-ca.crt")),
            r("a")
        );
        assert_eq!(
            work_for(&del("/registry/core/configmaps/a/kube-root-ca.crt")),
            r("a")
        );
        assert_eq!(work_for(&put("/registry/core/configmaps/a/other")), None);
    }
}
