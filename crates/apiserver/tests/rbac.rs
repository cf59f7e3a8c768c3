//! RBAC end to end over HTTPS: identities from client certificates and service-account
//! tokens are refused in kube's words until a binding grants them something, then allowed
//! exactly that; aggregation into `view` takes effect; impersonation needs the
//! `impersonate` verb; the authorization reviews answer as the authorizer decides; and the
//! real `kubectl auth can-i` agrees.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use common::{Reply, TestServer, kubectl, read};
use kubevirt_apiserver::client::{self, TlsOptions};
use kubevirt_apiserver::pki::{KubeAuth, kubeconfig_yaml};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(20);
const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1";

/// A client certificate from the cluster CA with subject CN `cn` and O `org`.
fn issue_client_cert(s: &TestServer, cn: &str, org: Option<&str>) -> (String, String) {
    kubevirt_apiserver::pki::issue_client_cert(s.dir.path(), cn, org).unwrap()
}

/// A TLS client trusting the cluster CA, presenting `identity` if any.
fn tls(s: &TestServer, identity: Option<(String, String)>) -> Arc<rustls::ClientConfig> {
    Arc::new(
        client::tls_config(&TlsOptions {
            ca_pem: read(&s.dir.path().join("pki/ca.crt")).into_bytes(),
            insecure: false,
            identity,
            server_name: None,
        })
        .unwrap(),
    )
}

/// Sends a request with `tls`, extra `headers` and a JSON `body`.
async fn send(
    s: &TestServer,
    tls: &Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Reply {
    let mut b = http::Request::builder()
        .method(method)
        .uri(s.url(path))
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b
        .body(body.map_or_else(Body::empty, |v| Body::from(serde_json::to_vec(v).unwrap())))
        .unwrap();
    common::send(tls, req).await
}

/// The status code of a body-less request.
async fn code(
    s: &TestServer,
    tls: &Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> u16 {
    send(s, tls, method, path, headers, None).await.status
}

async fn create(s: &TestServer, path: &str, obj: Value) {
    let r = s.request("POST", path, Some(&obj)).await;
    assert_eq!(
        r.status,
        201,
        "{path}: {}",
        String::from_utf8_lossy(&r.body)
    );
}

async fn create_namespace(s: &TestServer, name: &str) {
    create(
        s,
        "/api/v1/namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    )
    .await;
}

fn role(name: &str, rules: Value) -> Value {
    let mut r = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
           "metadata": {"name": name}});
    r["rules"] = rules;
    r
}

fn binding(kind: &str, name: &str, role_kind: &str, role: &str, subjects: Value) -> Value {
    let mut b = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
           "metadata": {"name": name},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role}});
    b["subjects"] = subjects;
    b
}

/// A token for `ns/name` (as admin), once the account exists.
async fn token_for(s: &TestServer, ns: &str, name: &str) -> String {
    let path = format!("/api/v1/namespaces/{ns}/serviceaccounts/{name}/token");
    let start = Instant::now();
    loop {
        let r = s.request("POST", &path, Some(&json!({"spec": {}}))).await;
        if r.status == 201 {
            return r.json()["status"]["token"].as_str().unwrap().to_owned();
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no token for {ns}/{name}: {}",
            r.status
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Watches, subresources and cluster-scoped resources are refused as kube refuses them;
/// discovery is every authenticated user's.
async fn refused_everywhere_but_discovery(
    s: &TestServer,
    anon: &Arc<rustls::ClientConfig>,
    h: &[(&str, &str)],
) {
    // Watches, subresources and cluster-scoped resources are refused the same way.
    let r = send(
        s,
        anon,
        "GET",
        "/api/v1/namespaces/team/pods?watch=true",
        h,
        None,
    )
    .await;
    assert_eq!(r.status, 403);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("cannot watch resource \"pods\"")
    );
    let r = send(
        s,
        anon,
        "GET",
        "/api/v1/namespaces/team/pods/p/log",
        h,
        None,
    )
    .await;
    assert_eq!(
        r.json()["message"],
        "pods \"p\" is forbidden: User \"system:serviceaccount:team:default\" cannot get resource \"pods/log\" in API group \"\" in the namespace \"team\""
    );
    let r = send(s, anon, "GET", "/apis/apps/v1/namespaces", h, None).await;
    assert_eq!(r.status, 403);
    let r = send(s, anon, "GET", "/api/v1/nodes", h, None).await;
    assert_eq!(
        r.json()["message"],
        "nodes is forbidden: User \"system:serviceaccount:team:default\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
    );
    // Discovery and the self reviews are every authenticated user's.
    assert_eq!(code(s, anon, "GET", "/api", h).await, 200);
    assert_eq!(code(s, anon, "GET", "/apis/apps/v1", h).await, 200);
}

#[tokio::test]
async fn a_service_account_is_refused_until_a_role_binding_grants_it_and_only_there() {
    let s = TestServer::start().await;
    create_namespace(&s, "team").await;
    let token = token_for(&s, "team", "default").await;
    let auth = format!("Bearer {token}");
    let anon = tls(&s, None);
    let h = [("authorization", auth.as_str())];

    let r = send(&s, &anon, "GET", "/api/v1/namespaces/team/pods", &h, None).await;
    assert_eq!(r.status, 403);
    let status = r.json();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "Forbidden");
    assert_eq!(
        status["message"],
        "pods is forbidden: User \"system:serviceaccount:team:default\" cannot list resource \"pods\" in API group \"\" in the namespace \"team\""
    );
    assert_eq!(status["details"], json!({"kind": "pods"}));
    refused_everywhere_but_discovery(&s, &anon, &h).await;

    create(&s, &format!("{RBAC}/namespaces/team/roles"), role("pod-reader", json!([
        {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]}
    ]))).await;
    create(
        &s,
        &format!("{RBAC}/namespaces/team/rolebindings"),
        binding(
            "RoleBinding",
            "default-reads-pods",
            "Role",
            "pod-reader",
            json!([{"kind": "ServiceAccount", "name": "default", "namespace": "team"}]),
        ),
    )
    .await;
    // The very next request sees the binding.
    let r = send(&s, &anon, "GET", "/api/v1/namespaces/team/pods", &h, None).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["kind"], "PodList");
    // Only reads, and only in its namespace.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                     "spec": {"containers": [{"name": "c", "image": "i"}]}});
    let r = send(
        &s,
        &anon,
        "POST",
        "/api/v1/namespaces/team/pods",
        &h,
        Some(&pod),
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        s.request("GET", "/api/v1/namespaces/team/pods/p", None)
            .await
            .status,
        404,
        "nothing stored"
    );
    let r = send(
        &s,
        &anon,
        "GET",
        "/api/v1/namespaces/default/pods",
        &h,
        None,
    )
    .await;
    assert_eq!(r.status, 403);
    let r = send(&s, &anon, "GET", "/api/v1/pods", &h, None).await;
    assert_eq!(r.status, 403, "all namespaces needs a cluster-wide grant");

    // Deleting the binding takes the grant away again.
    let r = s
        .request(
            "DELETE",
            &format!("{RBAC}/namespaces/team/rolebindings/default-reads-pods"),
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    let r = send(&s, &anon, "GET", "/api/v1/namespaces/team/pods", &h, None).await;
    assert_eq!(r.status, 403);
}

#[tokio::test]
async fn a_cluster_role_aggregated_into_view_takes_effect_for_views_holders() {
    let s = TestServer::start().await;
    create_namespace(&s, "team").await;
    let token = token_for(&s, "team", "default").await;
    let auth = format!("Bearer {token}");
    let anon = tls(&s, None);
    let h = [("authorization", auth.as_str())];
    create(
        &s,
        &format!("{RBAC}/namespaces/team/rolebindings"),
        binding(
            "RoleBinding",
            "default-views",
            "ClusterRole",
            "view",
            json!([{"kind": "ServiceAccount", "name": "default", "namespace": "team"}]),
        ),
    )
    .await;
    // view: pods yes, leases and secrets no.
    assert_eq!(
        code(&s, &anon, "GET", "/api/v1/namespaces/team/pods", &h).await,
        200
    );
    assert_eq!(
        code(&s, &anon, "GET", "/api/v1/namespaces/team/secrets", &h).await,
        403
    );
    let leases = "/apis/coordination.k8s.io/v1/namespaces/team/leases";
    assert_eq!(code(&s, &anon, "GET", leases, &h).await, 403);
    create(&s, &format!("{RBAC}/clusterroles"), json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "lease-viewer", "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list"]}],
    })).await;
    assert_eq!(code(&s, &anon, "GET", leases, &h).await, 200);
    // The aggregation controller shows it in view's stored rules, and in admin's.
    for role in ["view", "admin"] {
        let start = Instant::now();
        loop {
            let stored = s
                .request("GET", &format!("{RBAC}/clusterroles/{role}"), None)
                .await
                .json();
            let rules = stored["rules"].as_array().cloned().unwrap_or_default();
            if rules.iter().any(|r| {
                r["resources"] == json!(["leases"]) && r["verbs"] == json!(["get", "list"])
            }) {
                assert!(
                    rules
                        .iter()
                        .any(|r| r["resources"].as_array().unwrap().contains(&json!("pods")))
                );
                break;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{role} never showed the lease rule: {stored}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // edit and admin aggregate view, so they have it too.
    let sar = |role: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": format!("holder-of-{role}"), "resourceAttributes": {"verb": "list", "group": "coordination.k8s.io", "resource": "leases", "namespace": "team"}}})
    };
    for role in ["edit", "admin"] {
        create(
            &s,
            &format!("{RBAC}/namespaces/team/rolebindings"),
            binding(
                "RoleBinding",
                &format!("{role}-holder"),
                "ClusterRole",
                role,
                json!([{"kind": "User", "name": format!("holder-of-{role}")}]),
            ),
        )
        .await;
        let r = s
            .request(
                "POST",
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                Some(&sar(role)),
            )
            .await;
        assert_eq!(r.status, 201);
        assert_eq!(r.json()["status"]["allowed"], true, "{role}: {}", r.json());
    }
}

#[tokio::test]
async fn a_certificate_is_its_subject_and_is_refused_in_kubes_words() {
    let s = TestServer::start().await;
    create_namespace(&s, "devs-ns").await;
    let alice = tls(&s, Some(issue_client_cert(&s, "alice", Some("devs"))));
    let who = send(
        &s,
        &alice,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        &[],
        Some(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})),
    )
    .await;
    assert_eq!(who.status, 201);
    assert_eq!(
        who.json()["status"]["userInfo"],
        json!({"username": "alice", "groups": ["devs", "system:authenticated"]})
    );

    let r = send(
        &s,
        &alice,
        "GET",
        "/api/v1/namespaces/devs-ns/configmaps",
        &[],
        None,
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json()["message"],
        "configmaps is forbidden: User \"alice\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"devs-ns\""
    );
    let r = send(&s, &alice, "GET", "/metrics", &[], None).await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json()["message"],
        "forbidden: User \"alice\" cannot get path \"/metrics\""
    );
}

#[tokio::test]
async fn a_certificates_user_and_groups_get_their_grants_only() {
    let s = TestServer::start().await;
    create_namespace(&s, "devs-ns").await;
    let alice = tls(&s, Some(issue_client_cert(&s, "alice", Some("devs"))));
    // A group grant in one namespace, a user grant on one named object cluster-wide.
    create(
        &s,
        &format!("{RBAC}/namespaces/devs-ns/rolebindings"),
        binding(
            "RoleBinding",
            "devs-edit",
            "ClusterRole",
            "edit",
            json!([{"kind": "Group", "name": "devs"}]),
        ),
    )
    .await;
    create(&s, &format!("{RBAC}/clusterroles"), json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "see-default-ns"},
        "rules": [{"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["default"], "verbs": ["get"]}],
    })).await;
    create(
        &s,
        &format!("{RBAC}/clusterrolebindings"),
        binding(
            "ClusterRoleBinding",
            "alice-sees-default",
            "ClusterRole",
            "see-default-ns",
            json!([{"kind": "User", "name": "alice"}]),
        ),
    )
    .await;
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}});
    let r = send(
        &s,
        &alice,
        "POST",
        "/api/v1/namespaces/devs-ns/configmaps",
        &[],
        Some(&cm),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        code(
            &s,
            &alice,
            "GET",
            "/api/v1/namespaces/default/configmaps",
            &[]
        )
        .await,
        403
    );
    assert_eq!(
        code(&s, &alice, "GET", "/api/v1/namespaces/default", &[]).await,
        200
    );
    assert_eq!(
        code(&s, &alice, "GET", "/api/v1/namespaces/kube-system", &[]).await,
        403
    );
    // Another user of the same group has the group's grant but not alice's.
    let bob = tls(&s, Some(issue_client_cert(&s, "bob", Some("devs"))));
    assert_eq!(
        code(
            &s,
            &bob,
            "GET",
            "/api/v1/namespaces/devs-ns/configmaps/c",
            &[]
        )
        .await,
        200
    );
    assert_eq!(
        code(&s, &bob, "GET", "/api/v1/namespaces/default", &[]).await,
        403
    );
    // The admin certificate is unaffected; anonymous health checks still answer.
    assert_eq!(s.request("GET", "/api/v1/nodes", None).await.status, 200);
    assert_eq!(code(&s, &tls(&s, None), "GET", "/healthz", &[]).await, 200);
    assert_eq!(
        code(&s, &tls(&s, None), "GET", "/api/v1/pods", &[]).await,
        401
    );
}

#[tokio::test]
async fn impersonation_needs_the_impersonate_verb() {
    let s = TestServer::start().await;
    let alice = tls(&s, Some(issue_client_cert(&s, "alice", None)));
    let as_bob = [("impersonate-user", "bob")];
    let r = send(
        &s,
        &alice,
        "GET",
        "/api/v1/namespaces/default/pods",
        &as_bob,
        None,
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json()["message"],
        "users \"bob\" is forbidden: User \"alice\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
    );
    create(&s, &format!("{RBAC}/clusterroles"), json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "impersonate-bob"},
        "rules": [{"apiGroups": [""], "resources": ["users"], "resourceNames": ["bob"], "verbs": ["impersonate"]}],
    })).await;
    create(
        &s,
        &format!("{RBAC}/clusterrolebindings"),
        binding(
            "ClusterRoleBinding",
            "alice-as-bob",
            "ClusterRole",
            "impersonate-bob",
            json!([{"kind": "User", "name": "alice"}]),
        ),
    )
    .await;
    // Now alice acts as bob, with bob's permissions (none on pods) …
    let r = send(
        &s,
        &alice,
        "GET",
        "/api/v1/namespaces/default/pods",
        &as_bob,
        None,
    )
    .await;
    assert_eq!(r.status, 403);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("pods is forbidden: User \"bob\" cannot list")
    );
    let who = send(
        &s,
        &alice,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        &as_bob,
        Some(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})),
    )
    .await;
    assert_eq!(who.json()["status"]["userInfo"]["username"], "bob");
    // … but not as anyone else, nor with a group she may not impersonate.
    let r = send(
        &s,
        &alice,
        "GET",
        "/api",
        &[("impersonate-user", "carol")],
        None,
    )
    .await;
    assert_eq!(r.status, 403);
    let r = send(
        &s,
        &alice,
        "GET",
        "/api",
        &[
            ("impersonate-user", "bob"),
            ("impersonate-group", "system:masters"),
        ],
        None,
    )
    .await;
    assert_eq!(r.status, 403);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("cannot impersonate resource \"groups\"")
    );
    // The admin may impersonate anyone.
    let r = s
        .request_with(
            "GET",
            "/api/v1/namespaces/default/pods",
            None,
            "application/json",
            &[("impersonate-user", "carol")],
        )
        .await;
    assert_eq!(r.status, 403);
}

#[tokio::test]
async fn access_reviews_answer_as_the_authorizer_decides_and_bad_ones_name_the_field() {
    let s = TestServer::start().await;
    let sar = |spec: Value| json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec});
    let path = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    let r = s
        .request(
            "POST",
            path,
            Some(&sar(json!({"user": "x", "groups": ["system:masters"],
        "resourceAttributes": {"verb": "delete", "resource": "nodes"}}))),
        )
        .await;
    assert_eq!(r.status, 201);
    assert_eq!(r.json()["status"]["allowed"], true);
    let r = s
        .request(
            "POST",
            path,
            Some(&sar(json!({"user": "x",
        "nonResourceAttributes": {"verb": "get", "path": "/healthz"}}))),
        )
        .await;
    assert_eq!(
        r.json()["status"]["allowed"],
        false,
        "x has no groups, so not system:authenticated"
    );
    let r = s
        .request(
            "POST",
            path,
            Some(&sar(
                json!({"user": "x", "groups": ["system:authenticated"],
        "nonResourceAttributes": {"verb": "get", "path": "/healthz"}}),
            )),
        )
        .await;
    assert_eq!(r.json()["status"]["allowed"], true);
    assert!(
        r.json()["status"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("RBAC: allowed by ClusterRoleBinding \"system:")
    );

    let r = s
        .request("POST", path, Some(&sar(json!({"user": "x"}))))
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(r.json()["reason"], "Invalid");
    assert_eq!(
        r.json()["details"]["causes"][0]["field"],
        "spec.resourceAttributes"
    );
    let r = s
        .request(
            "POST",
            path,
            Some(&sar(json!({"resourceAttributes": {"verb": "get"}}))),
        )
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(r.json()["details"]["causes"][0]["field"], "spec.user");
    let local = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview",
        "spec": {"user": "x", "resourceAttributes": {"verb": "get", "resource": "pods", "namespace": "other"}}});
    let r = s
        .request(
            "POST",
            "/apis/authorization.k8s.io/v1/namespaces/default/localsubjectaccessreviews",
            Some(&local),
        )
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.json()["details"]["causes"][0]["field"],
        "spec.resourceAttributes.namespace"
    );
    // Reviews are never stored.
    assert_eq!(s.request("GET", path, None).await.status, 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_auth_can_i_answers_yes_and_no() {
    if test_prerequisites::available(test_prerequisites::command("kubectl", "kubernetes-client"))
        .is_none()
    {
        return;
    }
    let s = TestServer::start().await;
    create_namespace(&s, "team").await;
    let admin = s.server.kubeconfig.clone();
    let (code, out, err) = kubectl(admin.clone(), &["auth", "can-i", "delete", "nodes"]).await;
    assert_eq!((code, out.trim()), (0, "yes"), "{err}");
    let sa = "--as=system:serviceaccount:team:default";
    let (code, out, _) = kubectl(
        admin.clone(),
        &["auth", "can-i", "list", "pods", "-n", "team", sa],
    )
    .await;
    assert_eq!((code, out.trim()), (1, "no"));
    let (code, _, err) = kubectl(
        admin.clone(),
        &[
            "create",
            "rolebinding",
            "team-view",
            "--clusterrole=view",
            "--serviceaccount=team:default",
            "-n",
            "team",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = kubectl(
        admin.clone(),
        &["auth", "can-i", "list", "pods", "-n", "team", sa],
    )
    .await;
    assert_eq!((code, out.trim()), (0, "yes"));
    let (code, out, _) = kubectl(
        admin.clone(),
        &["auth", "can-i", "list", "pods", "-n", "default", sa],
    )
    .await;
    assert_eq!((code, out.trim()), (1, "no"));
    let (code, out, _) = kubectl(
        admin.clone(),
        &["auth", "can-i", "get", "pods/log", "-n", "team", sa],
    )
    .await;
    assert_eq!((code, out.trim()), (0, "yes"));
    let (code, out, _) = kubectl(
        admin.clone(),
        &["auth", "can-i", "create", "pods", "-n", "team", sa],
    )
    .await;
    assert_eq!((code, out.trim()), (1, "no"));

    // The account's own kubeconfig: can-i about itself, and --list.
    let token = token_for(&s, "team", "default").await;
    let path = s.dir.path().join("kubeconfig-sa");
    let server = format!("https://{}", s.server.addr);
    let ca = read(&s.dir.path().join("pki/ca.crt"));
    std::fs::write(
        &path,
        kubeconfig_yaml(&server, &ca, "sa", KubeAuth::Token(&token)),
    )
    .unwrap();
    let (code, out, _) = kubectl(
        path.clone(),
        &["auth", "can-i", "watch", "deployments.apps", "-n", "team"],
    )
    .await;
    assert_eq!((code, out.trim()), (0, "yes"));
    let (code, out, err) = kubectl(path.clone(), &["auth", "can-i", "--list", "-n", "team"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("selfsubjectaccessreviews.authorization.k8s.io"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("pods ") && l.contains("[get list watch]")),
        "{out}"
    );
    let (code, _, err) = kubectl(path.clone(), &["get", "pods", "-n", "default"]).await;
    assert_eq!(code, 1);
    assert!(err.contains(
        "Error from server (Forbidden): pods is forbidden: User \"system:serviceaccount:team:default\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
    ), "{err}");
    let (code, out, err) = kubectl(path, &["get", "pods", "-n", "team"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.is_empty() || out.contains("No resources"), "{out}");
}

#[tokio::test]
async fn roles_and_bindings_grant_only_what_their_author_holds_unless_it_may_escalate_or_bind() {
    let s = TestServer::start().await;
    create_namespace(&s, "own").await;
    create(
        &s,
        &format!("{RBAC}/namespaces/own/rolebindings"),
        binding(
            "RoleBinding",
            "alice-admin",
            "ClusterRole",
            "admin",
            json!([{"kind": "User", "name": "alice"}]),
        ),
    )
    .await;
    let alice = tls(&s, Some(issue_client_cert(&s, "alice", None)));
    let roles = format!("{RBAC}/namespaces/own/roles");
    let held = role(
        "cm-reader",
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]),
    );
    let r = send(&s, &alice, "POST", &roles, &[], Some(&held)).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let more = role(
        "node-lister",
        json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]),
    );
    let r = send(&s, &alice, "POST", &roles, &[], Some(&more)).await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json()["message"],
        "roles.rbac.authorization.k8s.io \"node-lister\" is forbidden: user \"alice\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"nodes\"], Verbs:[\"list\"]}"
    );
    assert_eq!(
        s.request("GET", &format!("{roles}/node-lister"), None)
            .await
            .status,
        404,
        "nothing stored"
    );
    // Binding what she holds is fine; binding cluster-admin is not …
    let bindings = format!("{RBAC}/namespaces/own/rolebindings");
    let to = |name: &str, role: &str| {
        binding(
            "RoleBinding",
            name,
            "ClusterRole",
            role,
            json!([{"kind": "User", "name": "bob"}]),
        )
    };
    let r = send(
        &s,
        &alice,
        "POST",
        &bindings,
        &[],
        Some(&to("bob-views", "view")),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let r = send(
        &s,
        &alice,
        "POST",
        &bindings,
        &[],
        Some(&to("bob-rules", "cluster-admin")),
    )
    .await;
    assert_eq!(r.status, 403);
    // … until she may `bind` it.
    create(
        &s,
        &format!("{RBAC}/clusterroles"),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "bind-cluster-admin"},
               "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                          "resourceNames": ["cluster-admin"], "verbs": ["bind"]}]}),
    )
    .await;
    create(
        &s,
        &bindings,
        binding(
            "RoleBinding",
            "alice-binds",
            "ClusterRole",
            "bind-cluster-admin",
            json!([{"kind": "User", "name": "alice"}]),
        ),
    )
    .await;
    let r = send(
        &s,
        &alice,
        "POST",
        &bindings,
        &[],
        Some(&to("bob-rules", "cluster-admin")),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
}

#[tokio::test]
async fn the_controller_manager_may_run_the_endpointslice_and_disruption_controllers() {
    let s = TestServer::start().await;
    let path = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    let allowed = async |group: &str, resource: &str, subresource: &str, verb: &str| {
        let sar = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": "system:kube-controller-manager", "groups": ["system:authenticated"],
                     "resourceAttributes": {"group": group, "resource": resource,
                         "subresource": subresource, "verb": verb, "namespace": "kubevirt"}}});
        let r = s.request("POST", path, Some(&sar)).await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        r.json()["status"]["allowed"] == true
    };
    for verb in ["get", "list", "watch"] {
        for (group, resource) in [
            ("", "services"),
            ("", "pods"),
            ("policy", "poddisruptionbudgets"),
        ] {
            assert!(
                allowed(group, resource, "", verb).await,
                "{verb} {resource}"
            );
        }
    }
    for verb in ["create", "delete", "get", "list", "update", "watch"] {
        assert!(
            allowed("discovery.k8s.io", "endpointslices", "", verb).await,
            "{verb} endpointslices"
        );
    }
    assert!(allowed("", "services", "finalizers", "update").await);
    assert!(allowed("policy", "poddisruptionbudgets", "status", "update").await);
    for group in ["", "events.k8s.io"] {
        for verb in ["create", "patch"] {
            assert!(
                allowed(group, "events", "", verb).await,
                "{verb} {group} events"
            );
        }
    }
    // Nothing beyond what those controllers call.
    assert!(!allowed("", "services", "", "delete").await);
    assert!(!allowed("policy", "poddisruptionbudgets", "", "delete").await);
    assert!(!allowed("", "secrets", "", "get").await);
}

/// `kubectl auth can-i` about a subresource answers as the real request is decided: a node
/// may patch its Node's status but not read it through the subresource, and the review
/// says the same for both (kubectl's `nodes/status` names a Node called `status`; the
/// subresource is `--subresource`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_auth_can_i_about_a_subresource_agrees_with_the_request() {
    if test_prerequisites::available(test_prerequisites::command("kubectl", "kubernetes-client"))
        .is_none()
    {
        return;
    }
    let s = TestServer::start().await;
    let admin = s.server.kubeconfig.clone();
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "x"}});
    assert_eq!(
        s.request("POST", "/api/v1/nodes", Some(&node)).await.status,
        201
    );
    let node_user = ["--as=system:node:x", "--as-group=system:nodes"];
    let can_i = |verb: &'static str, sub: Option<&'static str>| {
        let admin = admin.clone();
        async move {
            let mut args = vec!["auth", "can-i", verb, "nodes"];
            if let Some(sub) = sub {
                args.push(sub);
            }
            args.extend(node_user);
            let (code, out, err) = kubectl(admin, &args).await;
            assert!(code == 0 || code == 1, "{err}");
            out.trim().to_owned()
        }
    };
    assert_eq!(can_i("get", Some("--subresource=status")).await, "no");
    assert_eq!(can_i("patch", Some("--subresource=status")).await, "yes");
    assert_eq!(can_i("get", None).await, "yes");
    assert_eq!(can_i("delete", Some("--subresource=status")).await, "no");
    // The real requests, impersonated the same way.
    let (code, _, err) = kubectl(
        admin.clone(),
        &[
            "get",
            "--raw",
            "/api/v1/nodes/x/status",
            node_user[0],
            node_user[1],
        ],
    )
    .await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("Forbidden") || err.contains("forbidden"),
        "{err}"
    );
    // (kubectl patch reads the subresource first, so the patch is sent as it is.)
    let pki = s.dir.path().join("pki");
    let as_admin = tls(
        &s,
        Some((read(&pki.join("admin.crt")), read(&pki.join("admin.key")))),
    );
    let req = http::Request::builder()
        .method("PATCH")
        .uri(s.url("/api/v1/nodes/x/status"))
        .header("content-type", "application/merge-patch+json")
        .header("impersonate-user", "system:node:x")
        .header("impersonate-group", "system:nodes")
        .body(Body::from(r#"{"status":{"phase":"Running"}}"#))
        .unwrap();
    let patched = common::send(&as_admin, req).await;
    assert_eq!(
        patched.status,
        200,
        "{}",
        String::from_utf8_lossy(&patched.body)
    );
    let (code, _, err) = kubectl(
        admin,
        &[
            "get",
            "--raw",
            "/api/v1/nodes/x",
            node_user[0],
            node_user[1],
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
}

/// The certificate the server issues for its connections to node log servers is its subject
/// and nothing more here: a copy is refused what only the admin certificate may do (the
/// front proxy's is no identity at all, see below).
#[tokio::test]
async fn the_servers_outgoing_certificates_are_no_administrators() {
    let s = TestServer::start().await;
    let pki = s.dir.path().join("pki");
    for (file, user) in [
        ("apiserver-kubelet-client", "kube-apiserver-kubelet-client"),
        ("admin", "kubernetes-admin"),
    ] {
        let identity = (
            read(&pki.join(format!("{file}.crt"))),
            read(&pki.join(format!("{file}.key"))),
        );
        let client = tls(&s, Some(identity));
        let who = send(
            &s,
            &client,
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            &[],
            Some(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})),
        )
        .await;
        assert_eq!(who.status, 201, "{file}");
        assert_eq!(who.json()["status"]["userInfo"]["username"], user);
        let secrets = send(&s, &client, "GET", "/api/v1/secrets", &[], None).await;
        let want = if file == "admin" { 200 } else { 403 };
        assert_eq!(secrets.status, want, "{file}");
    }
}

/// A serving certificate of the cluster CA (the API server's own, or a node's) has one use:
/// presented as a client certificate it is refused at the handshake, so it is no identity;
/// so is the front proxy's, which another CA signed.
#[tokio::test]
async fn a_serving_certificate_is_no_client_identity() {
    let s = TestServer::start().await;
    let pki = s.dir.path().join("pki");
    let node_serving =
        kubevirt_apiserver::pki::issue_serving_cert(s.dir.path(), vec!["127.0.0.1".into()])
            .unwrap();
    let api_serving = (read(&pki.join("server.crt")), read(&pki.join("server.key")));
    // The front proxy's certificate is of its own CA, which the API server does not trust.
    let front_proxy = (
        read(&pki.join("front-proxy-client.crt")),
        read(&pki.join("front-proxy-client.key")),
    );
    for (what, identity) in [
        ("node", node_serving),
        ("API server", api_serving),
        ("front proxy", front_proxy),
    ] {
        let req = http::Request::builder()
            .method("GET")
            .uri(s.url("/api/v1/secrets"))
            .body(Body::empty())
            .unwrap();
        let answer = client::send(tls(&s, Some(identity)), req).await;
        assert!(answer.is_err(), "{what}: {:?}", answer.map(|r| r.status()));
    }
}

/// An extension API server's account `ext/server`, bound in kube-system to the
/// authentication reader as extension servers bind it, and a ConfigMap of the reader's name
/// in `default`; returns the account's token.
async fn bind_extension_server(s: &TestServer) -> String {
    // An extension API server's account, bound in kube-system as extension servers bind it.
    create_namespace(s, "ext").await;
    create(
        s,
        "/api/v1/namespaces/ext/serviceaccounts",
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "server"}}),
    )
    .await;
    create(
        s,
        &format!("{RBAC}/namespaces/kube-system/rolebindings"),
        binding(
            "RoleBinding",
            "ext-server-authentication-reader",
            "Role",
            "extension-apiserver-authentication-reader",
            json!([{"kind": "ServiceAccount", "name": "server", "namespace": "ext"}]),
        ),
    )
    .await;
    // A ConfigMap of the same name elsewhere is not covered.
    create(
        s,
        "/api/v1/namespaces/default/configmaps",
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "extension-apiserver-authentication"}}),
    )
    .await;
    token_for(s, "ext", "server").await
}

#[tokio::test]
async fn the_authentication_reader_role_grants_that_config_map_and_nothing_else() {
    let s = TestServer::start().await;
    let role = s
        .request(
            "GET",
            &format!(
                "{RBAC}/namespaces/kube-system/roles/extension-apiserver-authentication-reader"
            ),
            None,
        )
        .await;
    assert_eq!(role.status, 200, "{}", String::from_utf8_lossy(&role.body));
    assert_eq!(
        role.json()["metadata"]["labels"]["kubernetes.io/bootstrapping"],
        "rbac-defaults"
    );

    let token = bind_extension_server(&s).await;
    let auth = format!("Bearer {token}");
    let anon = tls(&s, None);
    let h = [("authorization", auth.as_str())];
    let cms = "/api/v1/namespaces/kube-system/configmaps";

    let r = send(
        &s,
        &anon,
        "GET",
        &format!("{cms}/extension-apiserver-authentication"),
        &h,
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        r.json()["data"]["requestheader-client-ca-file"].is_string(),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let by_name = format!("{cms}?fieldSelector=metadata.name%3Dextension-apiserver-authentication");
    let r = send(&s, &anon, "GET", &by_name, &h, None).await;
    assert_eq!(
        r.status,
        200,
        "a list of that name: {}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.json()["items"].as_array().map(Vec::len), Some(1));

    for (path, what) in [
        (
            format!("{cms}/kube-root-ca.crt"),
            "another ConfigMap of kube-system",
        ),
        (cms.to_owned(), "every ConfigMap of kube-system"),
        (
            "/api/v1/namespaces/kube-system/secrets".to_owned(),
            "the Secrets of kube-system",
        ),
        (
            "/api/v1/namespaces/default/configmaps/extension-apiserver-authentication".to_owned(),
            "the same name in another namespace",
        ),
    ] {
        let r = send(&s, &anon, "GET", &path, &h, None).await;
        assert_eq!(
            r.status,
            403,
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    let r = send(
        &s,
        &anon,
        "PUT",
        &format!("{cms}/extension-apiserver-authentication"),
        &h,
        Some(&json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"}})),
    )
    .await;
    assert_eq!(
        r.status,
        403,
        "reads only: {}",
        String::from_utf8_lossy(&r.body)
    );

    // kube binds the role to the scheduler and the controller-manager.
    let scheduler = tls(
        &s,
        Some(issue_client_cert(&s, "system:kube-scheduler", None)),
    );
    let r = send(
        &s,
        &scheduler,
        "GET",
        &format!("{cms}/extension-apiserver-authentication"),
        &[],
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}
