//! `GET` one object (or its `status` subresource, which is the same object).

use super::common::{Reply, get_object};
use crate::registry::ResourceInfo;
use crate::state::ApiState;
use crate::status::ApiError;

/// Reads object `name`.
pub fn get(
    state: &ApiState,
    info: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
) -> Result<Reply, ApiError> {
    let (obj, _) = get_object(state, info, ns, name)?;
    Ok(Reply::ok(obj))
}
