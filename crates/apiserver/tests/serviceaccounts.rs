//! Service accounts end to end over HTTPS: a new namespace gets its `default` account and
//! the `kube-root-ca.crt` ConfigMap, a TokenRequest gives a token, and that token (with no
//! client certificate) authenticates as the account until the account goes. The same
//! with the real `kubectl create token` and `kubectl auth whoami` when kubectl is there.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::{Reply, TestServer, kubectl, read};
use http_body_util::BodyExt;
use kubevirt_apiserver::client::{self, TlsOptions};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(20);

/// Polls `path` (as admin) until it answers 200; the object.
async fn wait_for_object(s: &TestServer, path: &str) -> Value {
    let start = Instant::now();
    loop {
        let r = s.request("GET", path, None).await;
        if r.status == 200 {
            return r.json();
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{path} did not appear: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn create_namespace(s: &TestServer, name: &str) {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    assert_eq!(
        s.request("POST", "/api/v1/namespaces", Some(&ns))
            .await
            .status,
        201
    );
}

/// A client trusting the cluster CA that presents no certificate.
fn anonymous_tls(s: &TestServer) -> Arc<rustls::ClientConfig> {
    let tls = client::tls_config(&TlsOptions {
        ca_pem: read(&s.dir.path().join("pki/ca.crt")).into_bytes(),
        insecure: false,
        identity: None,
        server_name: None,
    })
    .unwrap();
    Arc::new(tls)
}

/// Sends `body` to `path` with `Authorization: Bearer <token>` and no client certificate.
async fn with_token(
    s: &TestServer,
    tls: &Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&Value>,
) -> Reply {
    let req = http::Request::builder()
        .method(method)
        .uri(s.url(path))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {token}"))
        .body(match body {
            Some(v) => Body::from(serde_json::to_vec(v).unwrap()),
            None => Body::empty(),
        })
        .unwrap();
    let resp = client::send(tls.clone(), req).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Reply {
        status,
        headers,
        body,
    }
}

fn review() -> Value {
    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
}

const SSR: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";

#[tokio::test]
async fn a_new_namespaces_default_account_gets_a_token_that_authenticates_as_it() {
    let s = TestServer::start().await;
    create_namespace(&s, "team").await;
    let sa = wait_for_object(&s, "/api/v1/namespaces/team/serviceaccounts/default").await;
    let cm = wait_for_object(&s, "/api/v1/namespaces/team/configmaps/kube-root-ca.crt").await;
    assert_eq!(
        cm["data"]["ca.crt"].as_str(),
        Some(read(&s.dir.path().join("pki/ca.crt")).as_str())
    );
    let sa_uid = sa["metadata"]["uid"].as_str().unwrap().to_owned();

    let token_path = "/api/v1/namespaces/team/serviceaccounts/default/token";
    let request = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    });
    let r = s.request("POST", token_path, Some(&request)).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let tr = r.json();
    assert_eq!(tr["kind"], "TokenRequest");
    assert_eq!(tr["spec"]["expirationSeconds"], 3600);
    assert_eq!(
        tr["spec"]["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    assert!(tr["status"]["expirationTimestamp"].is_string());
    let token = tr["status"]["token"].as_str().unwrap().to_owned();

    // The token's key is the one the issuer publishes.
    let header: Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(token.split('.').next().unwrap())
            .unwrap(),
    )
    .unwrap();
    let jwks = s.request("GET", "/openid/v1/jwks", None).await.json();
    assert_eq!(jwks["keys"][0]["kid"], header["kid"]);

    let tls = anonymous_tls(&s);
    let who = with_token(&s, &tls, "POST", SSR, &token, Some(&review())).await;
    assert_eq!(who.status, 201, "{}", String::from_utf8_lossy(&who.body));
    let info = &who.json()["status"]["userInfo"];
    assert_eq!(info["username"], "system:serviceaccount:team:default");
    assert_eq!(info["uid"], sa_uid.as_str());
    assert_eq!(
        info["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:team",
            "system:authenticated"
        ])
    );
    // The token is authorized like any client: nothing grants it pods (see rbac.rs).
    let pods = with_token(
        &s,
        &tls,
        "GET",
        "/api/v1/namespaces/team/pods",
        &token,
        None,
    )
    .await;
    assert_eq!(pods.status, 403);
    assert_eq!(pods.json()["reason"], "Forbidden");

    // A token with a broken signature, or none that we issued, is a 401.
    let (signed, sig) = token.rsplit_once('.').unwrap();
    let flipped = if sig.starts_with('A') { "B" } else { "A" };
    let forged = format!("{signed}.{flipped}{}", &sig[1..]);
    for bad in [forged.as_str(), "not-a-token"] {
        let r = with_token(&s, &tls, "POST", SSR, bad, Some(&review())).await;
        assert_eq!(r.status, 401, "{bad}");
        assert_eq!(r.json()["reason"], "Unauthorized");
    }

    // TokenReview says the same as the token's own request.
    let tr = s
        .request(
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            Some(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})),
        )
        .await;
    assert_eq!(tr.status, 201);
    let status = &tr.json()["status"];
    assert_eq!(status["authenticated"], true);
    assert_eq!(
        status["user"]["username"],
        "system:serviceaccount:team:default"
    );

    // Once the account is gone, so is the token (the controller makes a new `default`
    // with another uid, which the old token does not name).
    let gone = s
        .request(
            "DELETE",
            "/api/v1/namespaces/team/serviceaccounts/default",
            None,
        )
        .await;
    assert_eq!(gone.status, 200);
    let r = with_token(&s, &tls, "POST", SSR, &token, Some(&review())).await;
    assert_eq!(r.status, 401);
    let again = wait_for_object(&s, "/api/v1/namespaces/team/serviceaccounts/default").await;
    assert_ne!(again["metadata"]["uid"], sa_uid.as_str());
    let r = with_token(&s, &tls, "POST", SSR, &token, Some(&review())).await;
    assert_eq!(r.status, 401);
}

#[tokio::test]
async fn token_requests_are_checked_as_kube_checks_them() {
    let s = TestServer::start().await;
    let path = "/api/v1/namespaces/default/serviceaccounts/default/token";
    wait_for_object(&s, "/api/v1/namespaces/default/serviceaccounts/default").await;
    let short = json!({"spec": {"expirationSeconds": 599}});
    let r = s.request("POST", path, Some(&short)).await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.json()["details"]["causes"][0]["field"],
        "spec.expirationSeconds"
    );
    let r = s
        .request(
            "POST",
            "/api/v1/namespaces/default/serviceaccounts/nobody/token",
            Some(&json!({"spec": {}})),
        )
        .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["reason"], "NotFound");
    let bound =
        json!({"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "absent"}}});
    let r = s.request("POST", path, Some(&bound)).await;
    assert_eq!(r.status, 404);

    // Discovery: the subresource and the review resources, create only.
    let core = s.request("GET", "/api/v1", None).await.json();
    let token = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "serviceaccounts/token")
        .expect("serviceaccounts/token in /api/v1");
    assert_eq!(token["kind"], "TokenRequest");
    assert_eq!(token["verbs"], json!(["create"]));
    let authn = s
        .request("GET", "/apis/authentication.k8s.io/v1", None)
        .await
        .json();
    for name in ["selfsubjectreviews", "tokenreviews"] {
        let r = authn["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} in authentication.k8s.io/v1"));
        assert_eq!(r["verbs"], json!(["create"]));
    }
    let list = s.request("GET", SSR, None).await;
    assert_eq!(list.status, 405);
}

#[tokio::test]
async fn namespaces_from_before_the_start_get_their_objects_too() {
    let s = TestServer::start().await;
    // The built-in namespaces exist before the controllers start.
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        wait_for_object(
            &s,
            &format!("/api/v1/namespaces/{ns}/serviceaccounts/default"),
        )
        .await;
        wait_for_object(
            &s,
            &format!("/api/v1/namespaces/{ns}/configmaps/kube-root-ca.crt"),
        )
        .await;
    }
    // A deleted namespace takes them along and they stay gone.
    create_namespace(&s, "brief").await;
    wait_for_object(&s, "/api/v1/namespaces/brief/serviceaccounts/default").await;
    wait_for_object(&s, "/api/v1/namespaces/brief/configmaps/kube-root-ca.crt").await;
    assert_eq!(
        s.request("DELETE", "/api/v1/namespaces/brief", None)
            .await
            .status,
        200
    );
    // Wait for a later namespace's objects: the controllers handled every earlier event.
    create_namespace(&s, "later").await;
    wait_for_object(&s, "/api/v1/namespaces/later/configmaps/kube-root-ca.crt").await;
    let sas = s
        .request("GET", "/api/v1/serviceaccounts", None)
        .await
        .json();
    let left: Vec<&Value> = sas["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["metadata"]["namespace"] == "brief")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_token_and_auth_whoami_agree() {
    if test_prerequisites::available(test_prerequisites::command("kubectl", "kubernetes-client"))
        .is_none()
    {
        return;
    }
    let s = TestServer::start().await;
    create_namespace(&s, "team").await;
    wait_for_object(&s, "/api/v1/namespaces/team/serviceaccounts/default").await;
    let admin = s.server.kubeconfig.clone();
    let (code, token, err) =
        kubectl(admin.clone(), &["create", "token", "default", "-n", "team"]).await;
    assert_eq!(code, 0, "kubectl create token: {err}");
    let token = token.trim().to_owned();

    let ca = read(&s.dir.path().join("pki/ca.crt"));
    let server = format!("https://{}", s.server.addr);
    let as_token = |name: &str, token: &str| {
        let path = s.dir.path().join(name);
        let yaml = kubevirt_apiserver::pki::kubeconfig_yaml(
            &server,
            &ca,
            "sa",
            kubevirt_apiserver::pki::KubeAuth::Token(token),
        );
        std::fs::write(&path, yaml).unwrap();
        path
    };
    let (code, out, err) = kubectl(
        as_token("kubeconfig-sa", &token),
        &["auth", "whoami", "-o", "json"],
    )
    .await;
    assert_eq!(code, 0, "kubectl auth whoami: {err}");
    let who: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        who["status"]["userInfo"]["username"],
        "system:serviceaccount:team:default"
    );
    assert!(
        who["status"]["userInfo"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:serviceaccounts:team"))
    );
    let (code, _, err) = kubectl(
        as_token("kubeconfig-bad", "bogus.token.value"),
        &["auth", "whoami"],
    )
    .await;
    assert_ne!(code, 0);
    assert!(err.contains("Unauthorized"), "{err}");
    // The admin's certificate, for comparison.
    let (code, out, err) = kubectl(admin, &["auth", "whoami"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("kubernetes-admin") && out.contains("system:masters"),
        "{out}"
    );
}

#[tokio::test]
async fn pods_get_their_service_account_and_its_projected_credentials_on_create() {
    let s = TestServer::start().await;
    create_namespace(&s, "apps").await;
    wait_for_object(&s, "/api/v1/namespaces/apps/serviceaccounts/default").await;
    let pod = |name: &str, automount: Option<bool>| {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "x"}]}});
        if let Some(a) = automount {
            pod["spec"]["automountServiceAccountToken"] = json!(a);
        }
        pod
    };
    let created = s
        .request(
            "POST",
            "/api/v1/namespaces/apps/pods",
            Some(&pod("p", None)),
        )
        .await;
    assert_eq!(created.status, 201);
    let spec = &created.json()["spec"];
    assert_eq!(spec["serviceAccountName"], "default");
    let volume = &spec["volumes"][0];
    let name = volume["name"].as_str().unwrap();
    assert!(
        name.starts_with("kube-api-access-") && name.len() == 21,
        "{name}"
    );
    let sources = &volume["projected"]["sources"];
    assert_eq!(sources[0]["serviceAccountToken"]["expirationSeconds"], 3607);
    assert_eq!(sources[1]["configMap"]["name"], "kube-root-ca.crt");
    assert_eq!(
        sources[2]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    let mount = &spec["containers"][0]["volumeMounts"][0];
    assert_eq!(mount["name"], name);
    assert_eq!(
        mount["mountPath"],
        "/var/run/secrets/kubernetes.io/serviceaccount"
    );
    assert_eq!(mount["readOnly"], true);

    let opted_out = s
        .request(
            "POST",
            "/api/v1/namespaces/apps/pods",
            Some(&pod("q", Some(false))),
        )
        .await;
    assert_eq!(opted_out.status, 201);
    assert!(opted_out.json()["spec"]["volumes"].is_null());
}
