//! The `/metrics` answer every component serves: a registry in the OpenMetrics text format.

use prometheus_client::registry::Registry;

/// The content type of [`openmetrics_response`]'s body.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `registry` encoded as OpenMetrics text: 200 with the text, or 500 with why it could not be
/// encoded.
#[must_use]
pub fn openmetrics_response(registry: &Registry) -> http::Response<String> {
    let mut text = String::new();
    let (status, content_type, body) =
        match prometheus_client::encoding::text::encode(&mut text, registry) {
            Ok(()) => (http::StatusCode::OK, OPENMETRICS_CONTENT_TYPE, text),
            Err(e) => (
                http::StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain; charset=utf-8",
                e.to_string(),
            ),
        };
    let mut response = http::Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::gauge::Gauge;

    use super::*;

    #[test]
    fn a_registry_is_served_as_openmetrics_text() {
        let mut registry = Registry::default();
        let gauge: Gauge = Gauge::default();
        gauge.set(3);
        registry.register("things", "How many.", gauge);
        let response = openmetrics_response(&registry);
        assert_eq!(response.status(), http::StatusCode::OK);
        assert_eq!(
            response.headers()[http::header::CONTENT_TYPE],
            OPENMETRICS_CONTENT_TYPE
        );
        assert!(
            response.body().contains("things 3\n"),
            "{}",
            response.body()
        );
        assert!(response.body().ends_with("# EOF\n"));
    }
}
