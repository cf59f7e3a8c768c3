//! Defaulting of built-in kinds, as kube-apiserver's scheme defaulters do while decoding a
//! request body: on create and on update (every write path: PUT, PATCH, `scale`), before
//! the mutating admission phase, so webhooks see defaulted objects.
//!
//! - `Pod`: [`pod_spec`] (kube's `SetDefaults_PodSpec` with its containers, probes, ports,
//!   env and volumes) plus what `SetDefaults_Pod` adds to pods only: `enableServiceLinks`,
//!   resource requests taken from limits, host ports of host-network pods.
//! - `apps/v1` (`pkg/apis/apps/v1/defaults.go`): `Deployment` (replicas 1, strategy
//!   `RollingUpdate` with `maxUnavailable`/`maxSurge` `25%`, `revisionHistoryLimit` 10,
//!   `progressDeadlineSeconds` 600), `ReplicaSet` (replicas 1), `DaemonSet` (update strategy
//!   `RollingUpdate` with `maxUnavailable` 1 and `maxSurge` 0, `revisionHistoryLimit` 10);
//!   the pod template of each gets [`pod_spec`], the same function pods get.
//!
//! Pure functions over JSON; a field of the wrong type is left alone for validation.

use serde_json::{Map, Value, json};

/// Applies the defaults of `group`/`kind` to `obj`; other kinds are left as they are.
pub fn apply(group: &str, kind: &str, obj: &mut Value) {
    match (group, kind) {
        ("", "Pod") => pod(obj),
        ("", "PodTemplate") => template(&mut obj["template"]),
        ("", "ReplicationController") => {
            if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                spec.entry("replicas").or_insert(json!(1));
                if let Some(t) = spec.get_mut("template") {
                    template(t);
                }
            }
        }
        ("apps", "Deployment") => deployment(obj),
        ("apps", "ReplicaSet") => replica_set(obj),
        ("apps", "DaemonSet") => daemon_set(obj),
        _ => {}
    }
}

fn object<'a>(v: &'a mut Value, key: &str) -> Option<&'a mut Map<String, Value>> {
    v.get_mut(key).and_then(Value::as_object_mut)
}

/// Inserts `default` when `key` is absent or `null`.
fn or_default(m: &mut Map<String, Value>, key: &str, default: Value) {
    match m.get(key) {
        None | Some(Value::Null) => {
            m.insert(key.to_owned(), default);
        }
        Some(_) => {}
    }
}

/// Sets `key` to `default` when absent, `null` or the empty string.
fn or_default_str(m: &mut Map<String, Value>, key: &str, default: &str) {
    match m.get(key) {
        None | Some(Value::Null) => {
            m.insert(key.to_owned(), json!(default));
        }
        Some(Value::String(s)) if s.is_empty() => {
            m.insert(key.to_owned(), json!(default));
        }
        Some(_) => {}
    }
}

fn template(t: &mut Value) {
    if let Some(spec) = object(t, "spec") {
        pod_spec(spec);
    }
}

/// kube's `SetDefaults_PodSpec` and the defaults of what a pod spec holds (containers and
/// init containers, their ports, probes and env; volumes). Used for pods and for every pod
/// template, so a pod made from a template carries what the template carried.
pub fn pod_spec(spec: &mut Map<String, Value>) {
    or_default_str(spec, "dnsPolicy", "ClusterFirst");
    or_default_str(spec, "restartPolicy", "Always");
    or_default(spec, "terminationGracePeriodSeconds", json!(30));
    or_default(spec, "securityContext", json!({}));
    or_default_str(spec, "schedulerName", "default-scheduler");
    for list in ["initContainers", "containers"] {
        for c in spec
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object_mut)
        {
            container(c);
        }
    }
    for v in spec
        .get_mut("volumes")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        volume(v);
    }
}

/// `IfNotPresent` for an image with a tag other than `latest` or a digest, else `Always`.
fn pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, tag)) if tag != "latest" => "IfNotPresent",
        _ => "Always",
    }
}

fn container(c: &mut Map<String, Value>) {
    or_default_str(c, "terminationMessagePath", "/dev/termination-log");
    or_default_str(c, "terminationMessagePolicy", "File");
    if let Some(image) = c.get("image").and_then(Value::as_str) {
        let policy = pull_policy(image);
        or_default_str(c, "imagePullPolicy", policy);
    }
    for p in c
        .get_mut("ports")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        or_default_str(p, "protocol", "TCP");
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        let Some(pr) = c.get_mut(probe).and_then(Value::as_object_mut) else {
            continue;
        };
        or_default(pr, "timeoutSeconds", json!(1));
        or_default(pr, "periodSeconds", json!(10));
        or_default(pr, "successThreshold", json!(1));
        or_default(pr, "failureThreshold", json!(3));
        if let Some(h) = pr.get_mut("httpGet").and_then(Value::as_object_mut) {
            or_default_str(h, "path", "/");
            or_default_str(h, "scheme", "HTTP");
        }
    }
    for e in c
        .get_mut("env")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(f) = e
            .get_mut("valueFrom")
            .and_then(|v| v.get_mut("fieldRef"))
            .and_then(Value::as_object_mut)
        {
            or_default_str(f, "apiVersion", "v1");
        }
    }
}

fn volume(v: &mut Map<String, Value>) {
    const MODE: i64 = 0o644;
    for source in ["secret", "configMap", "downwardAPI", "projected"] {
        if let Some(s) = v.get_mut(source).and_then(Value::as_object_mut) {
            or_default(s, "defaultMode", json!(MODE));
        }
    }
    if let Some(h) = v.get_mut("hostPath").and_then(Value::as_object_mut) {
        or_default(h, "type", json!(""));
    }
}

/// kube's `SetDefaults_Pod`: the pod spec's defaults and what only pods get.
fn pod(obj: &mut Value) {
    let Some(spec) = object(obj, "spec") else {
        return;
    };
    pod_spec(spec);
    or_default(spec, "enableServiceLinks", json!(true));
    let host_network = spec.get("hostNetwork") == Some(&json!(true));
    for list in ["initContainers", "containers"] {
        for c in spec
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object_mut)
        {
            // Requests default to the limits of the resources they do not name.
            if let Some(res) = c.get_mut("resources").and_then(Value::as_object_mut)
                && let Some(limits) = res.get("limits").and_then(Value::as_object).cloned()
                && !limits.is_empty()
            {
                let requests = res.entry("requests").or_insert_with(|| json!({}));
                if let Some(requests) = requests.as_object_mut() {
                    for (k, v) in limits {
                        requests.entry(k).or_insert(v);
                    }
                }
            }
            if host_network {
                for p in c
                    .get_mut("ports")
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_object_mut)
                {
                    if let Some(cp) = p.get("containerPort").cloned()
                        && matches!(p.get("hostPort"), None | Some(Value::Null))
                    {
                        p.insert("hostPort".into(), cp);
                    }
                }
            }
        }
    }
}

fn spec_with_template(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    let spec = object(obj, "spec")?;
    or_default(spec, "replicas", json!(1));
    if let Some(t) = spec.get_mut("template") {
        template(t);
    }
    Some(spec)
}

fn replica_set(obj: &mut Value) {
    spec_with_template(obj);
}

fn deployment(obj: &mut Value) {
    let Some(spec) = spec_with_template(obj) else {
        return;
    };
    let strategy = spec.entry("strategy").or_insert_with(|| json!({}));
    if let Some(s) = strategy.as_object_mut() {
        or_default_str(s, "type", "RollingUpdate");
        if s.get("type") == Some(&json!("RollingUpdate")) {
            or_default(s, "rollingUpdate", json!({}));
            if let Some(ru) = s.get_mut("rollingUpdate").and_then(Value::as_object_mut) {
                or_default(ru, "maxUnavailable", json!("25%"));
                or_default(ru, "maxSurge", json!("25%"));
            }
        }
    }
    or_default(spec, "revisionHistoryLimit", json!(10));
    or_default(spec, "progressDeadlineSeconds", json!(600));
}

fn daemon_set(obj: &mut Value) {
    let Some(spec) = object(obj, "spec") else {
        return;
    };
    if let Some(t) = spec.get_mut("template") {
        template(t);
    }
    let strategy = spec.entry("updateStrategy").or_insert_with(|| json!({}));
    if let Some(s) = strategy.as_object_mut() {
        or_default_str(s, "type", "RollingUpdate");
        if s.get("type") == Some(&json!("RollingUpdate")) {
            or_default(s, "rollingUpdate", json!({}));
            if let Some(ru) = s.get_mut("rollingUpdate").and_then(Value::as_object_mut) {
                or_default(ru, "maxUnavailable", json!(1));
                or_default(ru, "maxSurge", json!(0));
            }
        }
    }
    or_default(spec, "revisionHistoryLimit", json!(10));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_gets_kubes_defaults_and_keeps_what_it_says() {
        let mut d = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "quay.io/x/y:v1"}]}}}});
        apply("apps", "Deployment", &mut d);
        let spec = &d["spec"];
        assert_eq!(spec["replicas"], 1);
        assert_eq!(
            spec["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
        );
        assert_eq!(spec["revisionHistoryLimit"], 10);
        assert_eq!(spec["progressDeadlineSeconds"], 600);
        let pod = &spec["template"]["spec"];
        assert_eq!(pod["restartPolicy"], "Always");
        assert_eq!(pod["dnsPolicy"], "ClusterFirst");
        assert_eq!(pod["schedulerName"], "default-scheduler");
        assert_eq!(pod["terminationGracePeriodSeconds"], 30);
        assert_eq!(pod["containers"][0]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(
            pod["containers"][0]["terminationMessagePath"],
            "/dev/termination-log"
        );
        // Templates do not get what only pods get.
        assert!(pod.get("enableServiceLinks").is_none());

        let mut recreate = json!({"spec": {"replicas": 0, "strategy": {"type": "Recreate"}}});
        apply("apps", "Deployment", &mut recreate);
        assert_eq!(recreate["spec"]["replicas"], 0);
        assert_eq!(recreate["spec"]["strategy"], json!({"type": "Recreate"}));
    }

    #[test]
    fn a_daemonsets_update_strategy_defaults_to_a_rolling_update_of_one() {
        let mut ds =
            json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}});
        apply("apps", "DaemonSet", &mut ds);
        assert_eq!(
            ds["spec"]["updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})
        );
        assert_eq!(ds["spec"]["revisionHistoryLimit"], 10);
        assert!(ds["spec"].get("replicas").is_none());
        assert_eq!(
            ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
            "Always"
        );
        let mut on_delete = json!({"spec": {"updateStrategy": {"type": "OnDelete"}}});
        apply("apps", "DaemonSet", &mut on_delete);
        assert_eq!(
            on_delete["spec"]["updateStrategy"],
            json!({"type": "OnDelete"})
        );
    }

    #[test]
    fn image_pull_policies_follow_the_tag() {
        assert_eq!(pull_policy("nginx"), "Always");
        assert_eq!(pull_policy("nginx:latest"), "Always");
        assert_eq!(pull_policy("nginx:1.27"), "IfNotPresent");
        assert_eq!(pull_policy("registry:5000/nginx"), "Always");
        assert_eq!(pull_policy("nginx@sha256:abc"), "IfNotPresent");
    }

    #[test]
    fn pods_get_requests_from_limits_and_service_links() {
        let mut p = json!({"spec": {"containers": [{"name": "c", "image": "x:1",
            "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m"}},
            "ports": [{"containerPort": 80}],
            "readinessProbe": {"httpGet": {"port": 80}}}]}});
        apply("", "Pod", &mut p);
        let c = &p["spec"]["containers"][0];
        assert_eq!(
            c["resources"]["requests"],
            json!({"cpu": "500m", "memory": "1Gi"})
        );
        assert_eq!(c["ports"][0]["protocol"], "TCP");
        assert_eq!(
            c["readinessProbe"],
            json!({"httpGet": {"port": 80, "path": "/", "scheme": "HTTP"},
                   "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3})
        );
        assert_eq!(p["spec"]["enableServiceLinks"], true);
    }
}
