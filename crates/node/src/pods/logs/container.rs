//! `GET /containerLogs/{ns}/{pod}/{container}`: a container's log file, streamed in bounded
//! chunks.
//!
//! Data flow: [`parse_query`] checks kubelet's query parameters; [`container_logs`] finds the
//! file `<state dir>/<uid>/<container>.log`, picks the first byte to send ([`start_offset`]:
//! `tailLines` by reading backwards in [`BLOCK`]-sized blocks; a file not modified since
//! `sinceSeconds`/`sinceTime` is skipped whole) and streams from there in chunks of at most
//! [`CHUNK`] bytes, at most `limitBytes` in all. What is read goes through [`cri::Lines`]: an
//! entry of a CRI-format log becomes its content, after its time for `timestamps=true`, and
//! is left out when it is older than `sinceSeconds`/`sinceTime`; other lines are sent as they
//! are. Without `follow` it stops at the size the file had when the request came; with
//! `follow` it then polls from the last offset for what was appended, starts again from the
//! beginning after a rotation (the file shrank, or `<log>.1` is new), and ends when the pod is
//! gone, the limit is reached or the client goes away. Memory per request is one chunk and
//! at most one line.
//!
//! # Caveats
//! - Lines not in the CRI format carry no time: `timestamps=true` adds none to them, and
//!   `sinceSeconds`/`sinceTime` only skip the file when it was not modified since.
//! - `previous=true` is answered from the current file (the rotated `<log>.1` is not served,
//!   as kubelet serves only the current file).
//! - Follow mode polls every [`FOLLOW_POLL`]; it does not use inotify.

use std::io::SeekFrom;
use std::path::{Path as FsPath, PathBuf};
use std::time::{Duration, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::cri;
use super::{LogState, PodLookup};

/// The largest piece of a log read and sent at once.
pub(super) const CHUNK: usize = 64 * 1024;
/// The block size of the backwards scan for `tailLines`.
pub(super) const BLOCK: usize = 8 * 1024;
/// How often a followed log is checked for new bytes.
pub(super) const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// kubelet's log query parameters, as sent.
#[derive(serde::Deserialize, Default, Debug)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawLogQuery {
    follow: Option<bool>,
    tail_lines: Option<i64>,
    limit_bytes: Option<i64>,
    since_seconds: Option<i64>,
    since_time: Option<String>,
    timestamps: Option<bool>,
    // `previous` is accepted and ignored (see the caveats).
}

/// A checked log request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct LogRequest {
    pub follow: bool,
    pub tail_lines: Option<u64>,
    pub limit_bytes: Option<u64>,
    /// Only content written at or after this time.
    pub since: Option<SystemTime>,
    /// Each line after the time it was written.
    pub timestamps: bool,
}

/// Checks the query as the API server's `PodLogOptions` validation does.
///
/// # Errors
/// The message of a 400 answer.
pub(super) fn parse_query(raw: &RawLogQuery, now: SystemTime) -> Result<LogRequest, String> {
    let tail_lines = match raw.tail_lines {
        Some(n) if n < 0 => return Err("tailLines: must be greater than or equal to 0".into()),
        n => n.and_then(|n| u64::try_from(n).ok()),
    };
    let limit_bytes = match raw.limit_bytes {
        Some(n) if n < 1 => return Err("limitBytes: must be greater than 0".into()),
        n => n.and_then(|n| u64::try_from(n).ok()),
    };
    let since = match (raw.since_seconds, raw.since_time.as_deref()) {
        (Some(_), Some(_)) => {
            return Err("sinceSeconds, sinceTime: at most one of them may be set".into());
        }
        (Some(s), None) if s < 1 => return Err("sinceSeconds: must be greater than 0".into()),
        (Some(s), None) => {
            let back = Duration::from_secs(u64::try_from(s).unwrap_or(0));
            Some(now.checked_sub(back).unwrap_or(SystemTime::UNIX_EPOCH))
        }
        (None, Some(t)) => {
            let ts: jiff::Timestamp = t
                .parse()
                .map_err(|e| format!("sinceTime: {t:?} is not an RFC 3339 time: {e}"))?;
            Some(SystemTime::from(ts))
        }
        (None, None) => None,
    };
    Ok(LogRequest {
        follow: raw.follow.unwrap_or(false),
        tail_lines,
        limit_bytes,
        since,
        timestamps: raw.timestamps.unwrap_or(false),
    })
}

/// The offset of the first of the last `lines` lines of the first `len` bytes of `file`
/// (a final newline ends the last line, it does not start another), reading backwards in
/// [`BLOCK`]-sized blocks.
///
/// # Errors
/// The I/O error of a seek or read.
pub(super) async fn tail_offset(
    file: &mut tokio::fs::File,
    len: u64,
    lines: u64,
) -> std::io::Result<u64> {
    if lines == 0 {
        return Ok(len);
    }
    let mut found = 0;
    let mut end = len;
    let mut block = vec![0u8; BLOCK];
    while end > 0 {
        let start = end.saturating_sub(BLOCK as u64);
        let size = usize::try_from(end - start).unwrap_or(BLOCK);
        file.seek(SeekFrom::Start(start)).await?;
        file.read_exact(&mut block[..size]).await?;
        for (i, byte) in block[..size].iter().enumerate().rev() {
            let at = start + i as u64;
            if *byte == b'\n' && at + 1 != len {
                found += 1;
                if found == lines {
                    return Ok(at + 1);
                }
            }
        }
        end = start;
    }
    Ok(0)
}

/// Where to start sending `file` (of `len` bytes, modified at `modified`) for `request`.
async fn start_offset(
    file: &mut tokio::fs::File,
    len: u64,
    modified: Option<SystemTime>,
    request: &LogRequest,
) -> std::io::Result<u64> {
    if let (Some(since), Some(modified)) = (request.since, modified)
        && modified < since
    {
        return Ok(len);
    }
    match request.tail_lines {
        Some(lines) => tail_offset(file, len, lines).await,
        None => Ok(0),
    }
}

/// One log response being streamed.
struct LogStream {
    path: PathBuf,
    file: Option<tokio::fs::File>,
    offset: u64,
    /// Without follow: stop here (the size at request time).
    end: Option<u64>,
    /// What `limitBytes` still allows.
    remaining: Option<u64>,
    /// For follow mode: whether the pod still exists.
    pod: Option<(PodLookup, String, String)>,
    /// The inode of the rotated `<log>.1` last seen: a new one means a rotation.
    rotated: Option<u64>,
    buf: Vec<u8>,
    /// Log lines to what is answered.
    lines: cri::Lines,
}

impl LogStream {
    /// The next chunk; `None` at the end of the response.
    async fn next_chunk(&mut self) -> Option<std::io::Result<Bytes>> {
        loop {
            if self.remaining == Some(0) {
                return None;
            }
            if self.end.is_some_and(|end| self.offset >= end) {
                let mut out = Vec::new();
                self.lines.flush(true, &mut out);
                return (!out.is_empty()).then(|| self.answer(out));
            }
            match self.read().await {
                Err(e) => return Some(Err(e)),
                // Read, but nothing to answer (yet): read on.
                Ok(Some(out)) if out.is_empty() => continue,
                Ok(Some(out)) => return Some(self.answer(out)),
                Ok(None) => {}
            }
            // Nothing new: without follow that is the end; with it, wait while the pod exists.
            let mut out = Vec::new();
            self.lines.flush(self.pod.is_none(), &mut out);
            if !out.is_empty() {
                return Some(self.answer(out));
            }
            let (lookup, namespace, pod) = self.pod.as_ref()?;
            lookup(namespace, pod)?;
            tokio::time::sleep(FOLLOW_POLL).await;
        }
    }

    /// Reads what the file has past the offset (up to a chunk) and turns it into output:
    /// `None` when nothing new was there, an empty output when what was read answers nothing
    /// (yet).
    async fn read(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        if self.file.is_none() {
            self.file = tokio::fs::File::open(&self.path).await.ok();
        }
        let Some(file) = self.file.as_mut() else {
            return Ok(None);
        };
        let len = file.metadata().await?.len();
        let rotated = rotated_inode(&self.path).await;
        if len < self.offset || rotated != self.rotated {
            // Truncated by a rotation: what is there now was written after it.
            self.offset = 0;
            self.rotated = rotated;
            self.lines.reset();
        }
        let bound = self.end.unwrap_or(len).min(len);
        if bound <= self.offset {
            return Ok(None);
        }
        let mut want = usize::try_from(bound - self.offset)
            .unwrap_or(CHUNK)
            .min(CHUNK);
        if let Some(remaining) = self.remaining {
            // The answer is never longer than what it is made of.
            want = want.min(usize::try_from(remaining).unwrap_or(CHUNK));
        }
        file.seek(SeekFrom::Start(self.offset)).await?;
        let n = file.read(&mut self.buf[..want]).await?;
        if n == 0 {
            return Ok(None);
        }
        self.offset += n as u64;
        let mut out = Vec::with_capacity(n);
        self.lines.feed(&self.buf[..n], &mut out);
        Ok(Some(out))
    }

    /// `out` as the next chunk, within `limitBytes`.
    fn answer(&mut self, mut out: Vec<u8>) -> std::io::Result<Bytes> {
        if let Some(remaining) = self.remaining.as_mut() {
            out.truncate(usize::try_from(*remaining).unwrap_or(usize::MAX));
            *remaining -= out.len() as u64;
        }
        Ok(Bytes::from(out))
    }
}

/// Handles `GET /containerLogs/{namespace}/{pod}/{container}`.
pub(super) async fn container_logs(
    State(state): State<LogState>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    Query(raw): Query<RawLogQuery>,
) -> Response {
    let request = match parse_query(&raw, SystemTime::now()) {
        Ok(r) => r,
        Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
    };
    let Some((uid, containers)) = (state.lookup)(&namespace, &pod) else {
        return (
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{pod} is not on this node"),
        )
            .into_response();
    };
    if !containers.contains(&container) {
        return (
            StatusCode::BAD_REQUEST,
            format!("container {container} is not valid for pod {pod}"),
        )
            .into_response();
    }
    let path = state.state_dir.join(&uid).join(format!("{container}.log"));
    let stream = match open_stream(&path, &request).await {
        Ok(mut stream) => {
            if request.follow {
                stream.pod = Some((state.lookup.clone(), namespace, pod));
            }
            stream
        }
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reading the log of container {container}: {e}"),
            )
                .into_response();
        }
    };
    let body = futures::stream::unfold(stream, |mut stream| async move {
        let chunk = stream.next_chunk().await?;
        Some((chunk, stream))
    });
    ([("content-type", "text/plain")], Body::from_stream(body)).into_response()
}

/// The inode of `<log>.1`, if there is one ([`private_fs::log_rotation`]).
async fn rotated_inode(log: &FsPath) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let rotated = private_fs::log_rotation::rotated_path(log);
    tokio::fs::metadata(rotated).await.ok().map(|m| m.ino())
}

/// Opens the log at `path` and positions the stream for `request`. A log that does not exist
/// yet is empty (and followed from its beginning once it appears).
async fn open_stream(path: &FsPath, request: &LogRequest) -> std::io::Result<LogStream> {
    let mut stream = LogStream {
        path: path.to_owned(),
        file: None,
        offset: 0,
        end: (!request.follow).then_some(0),
        remaining: request.limit_bytes,
        pod: None,
        rotated: rotated_inode(path).await,
        buf: vec![0u8; CHUNK],
        lines: cri::Lines::new(request.since, request.timestamps),
    };
    let mut file = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(stream),
        Err(e) => return Err(e),
    };
    let meta = file.metadata().await?;
    let len = meta.len();
    stream.offset = start_offset(&mut file, len, meta.modified().ok(), request).await?;
    if !request.follow {
        stream.end = Some(len);
    }
    stream.file = Some(file);
    Ok(stream)
}

#[cfg(test)]
mod tests;
