//! Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`) → JSON.
//! (Skeleton: the signature is the contract.)

/// Why a protobuf body could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    /// The body does not start with the `k8s\0` magic or the envelope is malformed.
    #[error("not a Kubernetes protobuf envelope: {0}")]
    Envelope(String),
    /// The envelope names a kind this server cannot decode.
    #[error("protobuf decoding of {api_version}/{kind} is not supported")]
    UnsupportedKind { api_version: String, kind: String },
    /// The inner message is malformed.
    #[error("malformed protobuf for {kind}: {message}")]
    Malformed { kind: String, message: String },
}

/// Decodes a whole request body (`k8s\0` magic + `runtime.Unknown` envelope) into the
/// object's JSON form, including `apiVersion` and `kind`.
pub fn decode_to_json(_body: &[u8]) -> Result<serde_json::Value, ProtobufError> {
    Err(ProtobufError::Envelope("not implemented yet".into()))
}
