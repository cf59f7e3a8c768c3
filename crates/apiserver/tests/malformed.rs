//! Malformed requests get a clear 4xx `Status` and change nothing.
//!
//! One table of requests against a server holding one ConfigMap; after each, the
//! namespace still holds exactly that ConfigMap, unchanged, and no pod.

mod common;

use common::TestServer;
use serde_json::{Value, json};

const CMS: &str = "/api/v1/namespaces/default/configmaps";
const PODS: &str = "/api/v1/namespaces/default/pods";
const EXISTING: &str = "/api/v1/namespaces/default/configmaps/existing";

const JSON: &str = "application/json";
const JSON_PATCH: &str = "application/json-patch+json";
const MERGE_PATCH: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";

/// One malformed request and the answer it must get.
struct Case {
    what: &'static str,
    method: &'static str,
    path: String,
    content_type: &'static str,
    body: Vec<u8>,
    code: u16,
    reason: &'static str,
}

fn case(
    what: &'static str,
    method: &'static str,
    path: &str,
    content_type: &'static str,
    body: impl Into<Vec<u8>>,
    (code, reason): (u16, &'static str),
) -> Case {
    Case {
        what,
        method,
        path: path.to_owned(),
        content_type,
        body: body.into(),
        code,
        reason,
    }
}

fn cm(metadata: &Value) -> Vec<u8> {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"a": "2"}})
        .to_string()
        .into_bytes()
}

fn pod(container: &str) -> Vec<u8> {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": container, "image": "i"}]}})
    .to_string()
    .into_bytes()
}

const BAD_REQUEST: (u16, &str) = (400, "BadRequest");
const INVALID: (u16, &str) = (422, "Invalid");
const NOT_FOUND: (u16, &str) = (404, "NotFound");
const UNSUPPORTED: (u16, &str) = (415, "UnsupportedMediaType");

#[allow(clippy::too_many_lines)]
fn cases(rv: &str) -> Vec<Case> {
    let named = |name: &str| json!({"name": name});
    let existing = |metadata: Value| cm(&metadata);
    let patch = |p: Value| p.to_string().into_bytes();
    vec![
        // Bodies that do not decode.
        case("bad JSON", "POST", CMS, JSON, "{not json", BAD_REQUEST),
        case("empty body", "POST", CMS, JSON, "", BAD_REQUEST),
        case("JSON array body", "POST", CMS, JSON, "[1, 2]", BAD_REQUEST),
        case("JSON string body", "POST", CMS, JSON, "\"cm\"", BAD_REQUEST),
        case(
            "metadata not an object",
            "POST",
            CMS,
            JSON,
            cm(&json!("x")),
            BAD_REQUEST,
        ),
        case(
            "bad YAML",
            "POST",
            CMS,
            "application/yaml",
            "a: [b\n  c: :",
            BAD_REQUEST,
        ),
        case(
            "bad protobuf",
            "POST",
            CMS,
            "application/vnd.kubernetes.protobuf",
            "k8s\0\x0a\x7f",
            UNSUPPORTED,
        ),
        case(
            "oversized body",
            "POST",
            CMS,
            JSON,
            vec![b' '; 3 * 1024 * 1024 + 1],
            (413, "RequestEntityTooLarge"),
        ),
        // Bodies of the wrong type or place.
        case(
            "wrong kind",
            "POST",
            CMS,
            JSON,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}).to_string(),
            BAD_REQUEST,
        ),
        case(
            "wrong apiVersion",
            "POST",
            CMS,
            JSON,
            json!({"apiVersion": "apps/v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
                .to_string(),
            BAD_REQUEST,
        ),
        case(
            "namespace mismatch",
            "POST",
            CMS,
            JSON,
            cm(&json!({"name": "c", "namespace": "kube-system"})),
            BAD_REQUEST,
        ),
        case(
            "missing namespace",
            "POST",
            "/api/v1/namespaces/nope/configmaps",
            JSON,
            cm(&named("c")),
            NOT_FOUND,
        ),
        case(
            "namespace on a cluster-scoped resource",
            "POST",
            "/api/v1/namespaces/default/nodes",
            JSON,
            "{}",
            NOT_FOUND,
        ),
        case(
            "unknown resource",
            "POST",
            "/api/v1/namespaces/default/widgets",
            JSON,
            "{}",
            NOT_FOUND,
        ),
        // Invalid objects.
        case(
            "oversized name",
            "POST",
            CMS,
            JSON,
            cm(&named(&"a".repeat(300))),
            INVALID,
        ),
        case(
            "name with bad characters",
            "POST",
            CMS,
            JSON,
            cm(&named("Bad_Name")),
            INVALID,
        ),
        case("no name", "POST", CMS, JSON, cm(&json!({})), INVALID),
        case(
            "multi-byte generateName",
            "POST",
            CMS,
            JSON,
            cm(&json!({"generateName": format!("a{}", "é".repeat(60))})),
            INVALID,
        ),
        case(
            "bad label key",
            "POST",
            CMS,
            JSON,
            cm(&json!({"name": "c", "labels": {"-bad": "x"}})),
            INVALID,
        ),
        case(
            "labels not a map",
            "POST",
            CMS,
            JSON,
            cm(&json!({"name": "c", "labels": "x"})),
            INVALID,
        ),
        case(
            "path in a container name",
            "POST",
            PODS,
            JSON,
            pod("../0000/compute"),
            INVALID,
        ),
        case("empty container name", "POST", PODS, JSON, pod(""), INVALID),
        case(
            "pod spec that is a string",
            "POST",
            PODS,
            JSON,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": "x"})
                .to_string(),
            INVALID,
        ),
        case(
            "service spec that is a list",
            "POST",
            "/api/v1/namespaces/default/services",
            JSON,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": []})
                .to_string(),
            INVALID,
        ),
        // Updates.
        case(
            "name mismatch with the URL",
            "PUT",
            EXISTING,
            JSON,
            existing(named("other")),
            BAD_REQUEST,
        ),
        case(
            "non-numeric resourceVersion",
            "PUT",
            EXISTING,
            JSON,
            existing(json!({"name": "existing", "resourceVersion": "abc"})),
            BAD_REQUEST,
        ),
        case(
            "stale resourceVersion",
            "PUT",
            EXISTING,
            JSON,
            existing(json!({"name": "existing", "resourceVersion": "1"})),
            (409, "Conflict"),
        ),
        case(
            "update of a missing object",
            "PUT",
            &format!("{CMS}/missing"),
            JSON,
            existing(named("missing")),
            NOT_FOUND,
        ),
        case(
            "invalid labels in an update",
            "PUT",
            EXISTING,
            JSON,
            existing(json!({"name": "existing", "resourceVersion": rv, "labels": {"a": "b c"}})),
            INVALID,
        ),
        // Query strings.
        case(
            "invalid label selector",
            "GET",
            &format!("{CMS}?labelSelector=a%20in%20(b"),
            JSON,
            "",
            BAD_REQUEST,
        ),
        case(
            "invalid label selector key",
            "GET",
            &format!("{CMS}?labelSelector=-a%3Db"),
            JSON,
            "",
            BAD_REQUEST,
        ),
        case(
            "invalid field selector",
            "GET",
            &format!("{CMS}?fieldSelector=metadata.name"),
            JSON,
            "",
            BAD_REQUEST,
        ),
        case(
            "invalid limit",
            "GET",
            &format!("{CMS}?limit=many"),
            JSON,
            "",
            BAD_REQUEST,
        ),
        case(
            "invalid continue token",
            "GET",
            &format!("{CMS}?limit=1&continue=garbage"),
            JSON,
            "",
            BAD_REQUEST,
        ),
        case(
            "invalid watch resourceVersion",
            "GET",
            &format!("{CMS}?watch=true&resourceVersion=abc"),
            JSON,
            "",
            BAD_REQUEST,
        ),
        case(
            "invalid watch label selector",
            "GET",
            &format!("{CMS}?watch=true&labelSelector=a%20in%20(b"),
            JSON,
            "",
            BAD_REQUEST,
        ),
        case(
            "invalid timeoutSeconds",
            "GET",
            &format!("{CMS}?watch=true&timeoutSeconds=soon"),
            JSON,
            "",
            BAD_REQUEST,
        ),
        case(
            "deletecollection with an invalid selector",
            "DELETE",
            &format!("{CMS}?labelSelector=a%20in%20(b"),
            JSON,
            "",
            BAD_REQUEST,
        ),
        // JSON Patch.
        case(
            "JSON patch not an array",
            "PATCH",
            EXISTING,
            JSON_PATCH,
            patch(json!({"op": "add"})),
            BAD_REQUEST,
        ),
        case(
            "JSON patch with an unknown op",
            "PATCH",
            EXISTING,
            JSON_PATCH,
            patch(json!([{"op": "frob", "path": "/data"}])),
            BAD_REQUEST,
        ),
        case(
            "JSON patch with a bad pointer",
            "PATCH",
            EXISTING,
            JSON_PATCH,
            patch(json!([{"op": "add", "path": "data", "value": 1}])),
            BAD_REQUEST,
        ),
        case(
            "JSON patch replacing the root with a string",
            "PATCH",
            EXISTING,
            JSON_PATCH,
            patch(json!([{"op": "replace", "path": "", "value": "x"}])),
            BAD_REQUEST,
        ),
        case(
            "JSON patch replacing metadata with a string",
            "PATCH",
            EXISTING,
            JSON_PATCH,
            patch(json!([{"op": "replace", "path": "/metadata", "value": "x"}])),
            BAD_REQUEST,
        ),
        case(
            "JSON patch with a failing test",
            "PATCH",
            EXISTING,
            JSON_PATCH,
            patch(json!([{"op": "test", "path": "/data/a", "value": "9"}])),
            INVALID,
        ),
        case(
            "JSON patch removing a missing path",
            "PATCH",
            EXISTING,
            JSON_PATCH,
            patch(json!([{"op": "remove", "path": "/data/zzz"}])),
            INVALID,
        ),
        case(
            "JSON patch that is not JSON",
            "PATCH",
            EXISTING,
            JSON_PATCH,
            "[{",
            BAD_REQUEST,
        ),
        // JSON merge patch.
        case(
            "merge patch that is an array",
            "PATCH",
            EXISTING,
            MERGE_PATCH,
            "[1]",
            BAD_REQUEST,
        ),
        case(
            "merge patch that is a string",
            "PATCH",
            EXISTING,
            MERGE_PATCH,
            "\"x\"",
            BAD_REQUEST,
        ),
        case(
            "merge patch setting metadata to a string",
            "PATCH",
            EXISTING,
            MERGE_PATCH,
            patch(json!({"metadata": "x"})),
            BAD_REQUEST,
        ),
        case(
            "merge patch with invalid labels",
            "PATCH",
            EXISTING,
            MERGE_PATCH,
            patch(json!({"metadata": {"labels": {"a": "b c"}}})),
            INVALID,
        ),
        case(
            "merge patch that is not JSON",
            "PATCH",
            EXISTING,
            MERGE_PATCH,
            "{",
            BAD_REQUEST,
        ),
        // Strategic merge patch.
        case(
            "strategic patch that is an array",
            "PATCH",
            EXISTING,
            STRATEGIC,
            "[1]",
            BAD_REQUEST,
        ),
        case(
            "strategic patch with an unknown directive",
            "PATCH",
            EXISTING,
            STRATEGIC,
            patch(json!({"$patch": "frob"})),
            BAD_REQUEST,
        ),
        case(
            "strategic patch setting metadata to a string",
            "PATCH",
            EXISTING,
            STRATEGIC,
            patch(json!({"metadata": "x"})),
            BAD_REQUEST,
        ),
        case(
            "strategic patch that is not JSON",
            "PATCH",
            EXISTING,
            STRATEGIC,
            "{",
            BAD_REQUEST,
        ),
        // Other patch requests.
        case(
            "patch of an unknown media type",
            "PATCH",
            EXISTING,
            "text/plain",
            "{}",
            UNSUPPORTED,
        ),
        case(
            "server-side apply",
            "PATCH",
            EXISTING,
            "application/apply-patch+yaml",
            "{}",
            UNSUPPORTED,
        ),
        case(
            "patch of a missing object",
            "PATCH",
            &format!("{CMS}/missing"),
            MERGE_PATCH,
            "{}",
            NOT_FOUND,
        ),
        // Deletes.
        case(
            "delete with bad options",
            "DELETE",
            EXISTING,
            JSON,
            "{bad",
            BAD_REQUEST,
        ),
        case(
            "delete with options of the wrong type",
            "DELETE",
            EXISTING,
            JSON,
            json!({"propagationPolicy": 3}).to_string(),
            BAD_REQUEST,
        ),
    ]
}

/// The names of the objects in a list reply, without the root CA ConfigMap every
/// namespace has.
fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_owned))
        .filter(|n| n != "kube-root-ca.crt")
        .collect()
}

#[tokio::test]
async fn malformed_requests_get_a_clear_4xx_status_and_store_nothing() {
    let s = TestServer::start().await;
    let created = s
        .request_raw(
            "POST",
            CMS,
            cm(&json!({"name": "existing", "labels": {"app": "x"}})),
            JSON,
        )
        .await;
    assert_eq!(created.status, 201);
    let before = created.json();
    let rv = before["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut failures = Vec::new();
    for c in cases(&rv) {
        let r = s
            .request_raw(c.method, &c.path, c.body, c.content_type)
            .await;
        let status = r.json();
        let ok = r.status == c.code
            && status["kind"] == "Status"
            && status["status"] == "Failure"
            && status["code"] == c.code
            && status["reason"] == c.reason
            && status["message"].as_str().is_some_and(|m| !m.is_empty());
        if !ok {
            failures.push(format!(
                "{}: want {} {}, got {} {}",
                c.what,
                c.code,
                c.reason,
                r.status,
                String::from_utf8_lossy(&r.body)
                    .chars()
                    .take(300)
                    .collect::<String>()
            ));
        }
        let now = s.request("GET", EXISTING, None).await.json();
        if now != before {
            failures.push(format!("{}: the ConfigMap changed to {now}", c.what));
        }
        let cms = s.request("GET", CMS, None).await.json();
        let pods = s.request("GET", PODS, None).await.json();
        if names(&cms) != ["existing"] || !names(&pods).is_empty() {
            failures.push(format!(
                "{}: stored {:?} {:?}",
                c.what,
                names(&cms),
                names(&pods)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn a_container_name_that_is_not_a_dns_label_is_refused_with_its_field_path() {
    let s = TestServer::start().await;
    let r = s
        .request_raw("POST", PODS, pod("../0000/compute"), JSON)
        .await;
    assert_eq!(r.status, 422);
    let st = r.json();
    assert_eq!(st["details"]["kind"], "Pod");
    assert_eq!(
        st["details"]["causes"][0]["field"],
        "spec.containers[0].name"
    );
    assert_eq!(st["details"]["causes"][0]["reason"], "FieldValueInvalid");
    assert_eq!(
        st["message"],
        "Pod \"p\" is invalid: spec.containers[0].name: Invalid value: \"../0000/compute\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
    );
    assert_eq!(
        s.request("GET", &format!("{PODS}/p"), None).await.status,
        404
    );

    // Updates are checked too: a valid pod cannot be renamed into an invalid one.
    assert_eq!(
        s.request_raw("POST", PODS, pod("compute"), JSON)
            .await
            .status,
        201
    );
    let mut got = s.request("GET", &format!("{PODS}/p"), None).await.json();
    got["spec"]["initContainers"] = json!([{"name": "Setup", "image": "i"}]);
    let r = s.request("PUT", &format!("{PODS}/p"), Some(&got)).await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.json()["details"]["causes"][0]["field"],
        "spec.initContainers[0].name"
    );
    let after = s.request("GET", &format!("{PODS}/p"), None).await.json();
    assert!(after["spec"].get("initContainers").is_none());
}
