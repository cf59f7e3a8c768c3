//! Service-account tokens: the issuer's key and JWTs ([`jwt`]) and their authentication
//! against the store ([`authenticator`]).
//!
//! Tokens are requested through the `serviceaccounts/token` subresource
//! ([`crate::handlers::token_request`]), checked on every request by [`crate::auth`], and
//! reviewed through `tokenreviews` ([`crate::handlers::reviews`]). The `default` service
//! account of each namespace comes from [`crate::builtin_controllers`].

pub mod authenticator;
pub mod jwt;

pub use jwt::{Claims, DEFAULT_ISSUER, ObjectClaim, TokenError, TokenIssuer};
