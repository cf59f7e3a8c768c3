//! The last line of defence for request handling: a panic in a handler becomes a `500`
//! `Status` for that request (and an error log naming the request and the panic) instead
//! of a connection dropped mid-request.
//!
//! Data flow: [`catch_panic`] wraps the rest of the middleware stack and the handlers
//! (see [`crate::server::router`]); it polls their future inside `catch_unwind`.
//!
//! # Caveats
//! - Only the request's own future is covered: a panic in a task it spawned (the
//!   producer of a watch stream) ends that task and so the stream, not the server.
//! - The panic message is logged, never sent to the client (as kube-apiserver).

use std::any::Any;
use std::panic::AssertUnwindSafe;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::FutureExt;

use crate::status::ApiError;

/// What the client is told (kube-apiserver's wording).
pub const PANIC_MESSAGE: &str =
    "This request caused apiserver to panic. Look in the logs for details.";

/// The text of a panic payload (`panic!` with a literal or a formatted message).
fn panic_text(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

/// Middleware: runs the request, answering `500 InternalError` if it panics.
pub async fn catch_panic(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    // Nothing the request future borrows is observed after a panic: the future is
    // dropped and the shared state is only touched through locks that tolerate
    // poisoning (the store) or atomics (metrics).
    match AssertUnwindSafe(next.run(req)).catch_unwind().await {
        Ok(response) => response,
        Err(payload) => {
            tracing::error!(
                %method,
                path,
                panic = panic_text(payload.as_ref()),
                "request handler panicked"
            );
            ApiError::internal(PANIC_MESSAGE).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_payloads_give_their_message() {
        let literal: Box<dyn Any + Send> = Box::new("boom");
        assert_eq!(panic_text(literal.as_ref()), "boom");
        let formatted: Box<dyn Any + Send> = Box::new(format!("boom {}", 1));
        assert_eq!(panic_text(formatted.as_ref()), "boom 1");
        let other: Box<dyn Any + Send> = Box::new(3);
        assert_eq!(panic_text(other.as_ref()), "(no message)");
    }
}
