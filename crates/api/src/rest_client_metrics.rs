//! Upstream's REST client metrics: what every request a component's `kube::Client` sends
//! cost and how it ended, as KubeVirt's client round-tripper and client-go's latency hook
//! count them.
//!
//! - `kubevirt_rest_client_requests_total{code,method,host,resource,verb}` (counter): `code`
//!   is the HTTP status, or `<error>` when no response came; `resource` and `verb` are read
//!   from the path as upstream reads them ([`resource_and_verb`]), `none` for paths outside
//!   the resource API (`/version`, discovery).
//! - `kubevirt_rest_client_request_latency_seconds{verb,url}` (histogram, upstream's
//!   buckets): time to the response's head; `url` is the request's URL with the namespace and
//!   the object's name replaced by `{namespace}` and `{name}` and every query value by
//!   `{value}`, as client-go's URL template, so the label set stays bounded.
//!
//! Not served: `kubevirt_rest_client_rate_limiter_duration_seconds`: kube-rs' client has no
//! client-side rate limiter to wait for.
//!
//! One process is one component, so the families are process-wide ([`RestClientMetrics::shared`],
//! as client-go's are): a component's clients add [`RestClientMetrics::layer`] to their
//! service stack and its metrics port registers the families once
//! ([`RestClientMetrics::register`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upstream's latency buckets (those of the API server's request duration), in seconds.
const LATENCY_BUCKETS: [f64; 23] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];

/// The label of requests whose path names no resource.
const NONE: &str = "none";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    code: String,
    method: String,
    host: String,
    resource: String,
    verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    verb: String,
    url: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// The REST client families of a process; cloning yields another handle to the same ones.
#[derive(Clone, Debug)]
pub struct RestClientMetrics {
    requests: Family<RequestLabels, Counter>,
    latency: Family<LatencyLabels, Histogram, fn() -> Histogram>,
}

impl Default for RestClientMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
        }
    }
}

static SHARED: LazyLock<RestClientMetrics> = LazyLock::new(RestClientMetrics::default);

impl RestClientMetrics {
    /// The families of this process.
    pub fn shared() -> &'static Self {
        &SHARED
    }

    /// Registers both families with `registry` (once per registry).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kubevirt_rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            self.requests.clone(),
        );
        registry.register(
            "kubevirt_rest_client_request_latency_seconds",
            "Request latency in seconds. Broken down by verb and URL.",
            self.latency.clone(),
        );
    }

    /// The layer that counts the requests of a client whose server is `host`
    /// (`host:port`, the `host` label).
    pub fn layer(&self, host: impl Into<String>) -> RestClientMetricsLayer {
        RestClientMetricsLayer {
            metrics: self.clone(),
            host: host.into().into(),
        }
    }

    fn record(&self, host: &str, request: &RequestLine, code: String, seconds: f64) {
        let (resource, verb) = resource_and_verb(&request.method, &request.path, &request.query);
        self.requests
            .get_or_create(&RequestLabels {
                code,
                method: request.method.clone(),
                host: host.to_owned(),
                resource: resource.to_owned(),
                verb: verb.clone(),
            })
            .inc();
        self.latency
            .get_or_create(&LatencyLabels {
                verb,
                url: url_template(host, &request.path, &request.query),
            })
            .observe(seconds);
    }
}

/// What [`RestClientMetrics`] needs of a request, taken before it is sent.
struct RequestLine {
    method: String,
    path: String,
    query: String,
}

/// A `tower` layer adding [`RestClientMetrics`] to a client's service (see
/// `kube::client::ClientBuilder::with_layer`).
#[derive(Clone, Debug)]
pub struct RestClientMetricsLayer {
    metrics: RestClientMetrics,
    host: Arc<str>,
}

impl<S> tower::Layer<S> for RestClientMetricsLayer {
    type Service = RestClientMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RestClientMetricsService {
            inner,
            metrics: self.metrics.clone(),
            host: Arc::clone(&self.host),
        }
    }
}

/// The service of [`RestClientMetricsLayer`].
#[derive(Clone, Debug)]
pub struct RestClientMetricsService<S> {
    inner: S,
    metrics: RestClientMetrics,
    host: Arc<str>,
}

impl<S, B, R> tower::Service<http::Request<B>> for RestClientMetricsService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let line = RequestLine {
            method: request.method().as_str().to_owned(),
            path: request.uri().path().to_owned(),
            query: request.uri().query().unwrap_or_default().to_owned(),
        };
        let (metrics, host) = (self.metrics.clone(), Arc::clone(&self.host));
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            let code = match &response {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "<error>".to_owned(),
            };
            metrics.record(&host, &line, code, started.elapsed().as_secs_f64());
            response
        })
    }
}

/// Where the resource segment of a path is: `(segments before it, namespaced)`.
///
/// Core paths are `/api/<version>/…`, group paths `/apis/<group>/<version>/…`; then an
/// optional `watch`, then `namespaces/<ns>/<resource>` or `<resource>`.
fn resource_index(segments: &[&str]) -> Option<(usize, bool)> {
    let mut i = match *segments.first()? {
        "api" => 2,
        "apis" => 3,
        _ => return None,
    };
    if segments.get(i) == Some(&"watch") {
        i += 1;
    }
    if segments.get(i) == Some(&"namespaces") && segments.len() > i + 2 {
        return Some((i + 2, true));
    }
    (segments.len() > i).then_some((i, false))
}

fn segments(path: &str) -> Vec<&str> {
    path.trim_start_matches('/').split('/').collect()
}

/// The `resource` and `verb` labels of a request, as upstream derives them: the resource is
/// the path segment after the version (after `namespaces/<ns>` when namespaced, and after a
/// legacy `watch` segment); the verb is `WATCH` for a watch, `LIST` for a GET of a
/// collection, `GET` for one object, `CREATE`/`UPDATE`/`PATCH`/`DELETE` for POST, PUT,
/// PATCH and DELETE, the method itself otherwise; both `none` when the path names no
/// resource.
pub fn resource_and_verb<'a>(method: &str, path: &'a str, query: &str) -> (&'a str, String) {
    let segments = segments(path);
    let Some(resource) = resource_index(&segments)
        .and_then(|(i, _)| segments.get(i).copied())
        .filter(|r| !r.is_empty())
    else {
        return (NONE, NONE.to_owned());
    };
    let verb = match method {
        "GET" => {
            let watch =
                segments.contains(&"watch") || query.split('&').any(|kv| kv == "watch=true");
            if watch {
                "WATCH"
            } else if segments.last() == Some(&resource) {
                "LIST"
            } else {
                "GET"
            }
        }
        "PUT" => "UPDATE",
        "POST" => "CREATE",
        other => other,
    };
    (resource, verb.to_owned())
}

/// The `url` label: `https://<host>` and the path with the namespace and the name replaced by
/// `{namespace}` and `{name}`, and the query's values by `{value}` (keys sorted).
pub fn url_template(host: &str, path: &str, query: &str) -> String {
    let mut segments: Vec<&str> = segments(path);
    if let Some((i, namespaced)) = resource_index(&segments) {
        if namespaced {
            segments[i - 1] = "{namespace}";
        }
        if segments.len() > i + 1 {
            segments[i + 1] = "{name}";
        }
    }
    let mut keys: Vec<&str> = query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| kv.split_once('=').map_or(kv, |(k, _)| k))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let mut url = format!("https://{host}/{}", segments.join("/"));
    if !keys.is_empty() {
        let query: Vec<String> = keys.iter().map(|k| format!("{k}=%7Bvalue%7D")).collect();
        url.push('?');
        url.push_str(&query.join("&"));
    }
    url
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use tower::{Layer, Service, ServiceExt};

    fn encoded(metrics: &RestClientMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        encode(&mut text, &registry).expect("encode");
        text
    }

    #[test]
    fn resources_and_verbs_are_read_from_the_path_as_upstream_reads_them() {
        let cases = [
            ("GET", "/api/v1/namespaces/default/pods", "", "pods", "LIST"),
            (
                "GET",
                "/api/v1/namespaces/default/pods/p",
                "",
                "pods",
                "GET",
            ),
            (
                "GET",
                "/api/v1/pods",
                "watch=true&resourceVersion=5",
                "pods",
                "WATCH",
            ),
            (
                "GET",
                "/api/v1/watch/namespaces/x/pods",
                "",
                "pods",
                "WATCH",
            ),
            ("GET", "/api/v1/namespaces/default", "", "namespaces", "GET"),
            ("GET", "/api/v1/nodes", "", "nodes", "LIST"),
            (
                "PATCH",
                "/apis/kubevirt.io/v1/namespaces/d/virtualmachineinstances/v/status",
                "",
                "virtualmachineinstances",
                "PATCH",
            ),
            (
                "POST",
                "/apis/kubevirt.io/v1/namespaces/d/virtualmachineinstances",
                "",
                "virtualmachineinstances",
                "CREATE",
            ),
            (
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/k/leases/l",
                "",
                "leases",
                "UPDATE",
            ),
            (
                "DELETE",
                "/api/v1/namespaces/d/pods/p",
                "",
                "pods",
                "DELETE",
            ),
            ("GET", "/version", "", "none", "none"),
            ("GET", "/api/v1", "", "none", "none"),
            ("GET", "/apis/kubevirt.io/v1", "", "none", "none"),
        ];
        for (method, path, query, resource, verb) in cases {
            assert_eq!(
                resource_and_verb(method, path, query),
                (resource, verb.to_owned()),
                "{method} {path}?{query}"
            );
        }
    }

    #[test]
    fn the_url_label_names_no_object_namespace_or_query_value() {
        assert_eq!(
            url_template(
                "h:6443",
                "/api/v1/namespaces/default/pods/p1/log",
                "tailLines=5"
            ),
            "https://h:6443/api/v1/namespaces/{namespace}/pods/{name}/log?tailLines=%7Bvalue%7D"
        );
        assert_eq!(
            url_template("h", "/api/v1/namespaces/default", ""),
            "https://h/api/v1/namespaces/{name}"
        );
        assert_eq!(
            url_template(
                "h",
                "/apis/kubevirt.io/v1/virtualmachines",
                "watch=true&labelSelector=a&watch=1"
            ),
            "https://h/apis/kubevirt.io/v1/virtualmachines?labelSelector=%7Bvalue%7D&watch=%7Bvalue%7D"
        );
        assert_eq!(url_template("h", "/version", ""), "https://h/version");
    }

    #[tokio::test]
    async fn a_request_through_the_layer_is_counted_with_its_status_and_timed() {
        let metrics = RestClientMetrics::default();
        let mut service = metrics.layer("10.0.0.1:6443").layer(tower::service_fn(
            |request: http::Request<()>| async move {
                let status = if request.method() == http::Method::POST {
                    409
                } else {
                    200
                };
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(status)
                        .body(())
                        .expect("response"),
                )
            },
        ));
        for (method, uri) in [
            ("GET", "/api/v1/namespaces/a/pods/x"),
            ("GET", "/api/v1/namespaces/b/pods/y"),
            ("POST", "/api/v1/namespaces/a/pods"),
        ] {
            let request = http::Request::builder()
                .method(method)
                .uri(uri)
                .body(())
                .expect("request");
            service
                .ready()
                .await
                .expect("ready")
                .call(request)
                .await
                .expect("response");
        }
        let text = encoded(&metrics);
        assert!(
            text.contains(r#"kubevirt_rest_client_requests_total{code="200",method="GET",host="10.0.0.1:6443",resource="pods",verb="GET"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kubevirt_rest_client_requests_total{code="409",method="POST",host="10.0.0.1:6443",resource="pods",verb="CREATE"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kubevirt_rest_client_request_latency_seconds_count{verb="GET",url="https://10.0.0.1:6443/api/v1/namespaces/{namespace}/pods/{name}"} 2"#),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_request_without_a_response_is_counted_as_an_error() {
        let metrics = RestClientMetrics::default();
        let mut service =
            metrics
                .layer("h")
                .layer(tower::service_fn(|_: http::Request<()>| async {
                    Err::<http::Response<()>, _>("refused")
                }));
        let request = http::Request::get("/api/v1/nodes")
            .body(())
            .expect("request");
        assert!(
            service
                .ready()
                .await
                .expect("ready")
                .call(request)
                .await
                .is_err()
        );
        let text = encoded(&metrics);
        assert!(
            text.contains(r#"kubevirt_rest_client_requests_total{code="<error>",method="GET",host="h",resource="nodes",verb="LIST"} 1"#),
            "{text}"
        );
    }
}
