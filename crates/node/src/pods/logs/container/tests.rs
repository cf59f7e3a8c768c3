use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use futures::StreamExt;
use tower::ServiceExt;

use super::*;

const UID: &str = "0a7e3c52-1b1f-4d47-9c1e-6b2d1f0a0001";

struct Node {
    dir: tempfile::TempDir,
    present: Arc<AtomicBool>,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(UID)).unwrap();
        Node {
            dir,
            present: Arc::new(AtomicBool::new(true)),
        }
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join(UID).join("compute.log")
    }

    fn write(&self, bytes: &[u8]) {
        std::fs::write(self.log(), bytes).unwrap();
    }

    fn append(&self, bytes: &[u8]) {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(self.log())
            .unwrap();
        file.write_all(bytes).unwrap();
    }

    fn app(&self) -> Router {
        let present = Arc::clone(&self.present);
        let lookup: PodLookup = Arc::new(move |ns: &str, pod: &str| {
            (present.load(Ordering::SeqCst) && ns == "default" && pod == "virt-launcher-a")
                .then(|| (UID.to_owned(), vec!["compute".to_owned()]))
        });
        super::super::router(self.dir.path().to_owned(), lookup)
    }

    /// The response's status and its body as the frames it was sent in.
    async fn get(&self, query: &str) -> (StatusCode, Vec<Bytes>) {
        let mut frames = Vec::new();
        let (status, mut body) = self.open(query).await;
        while let Some(frame) = body.next().await {
            frames.push(frame.unwrap());
        }
        (status, frames)
    }

    async fn open(
        &self,
        query: &str,
    ) -> (
        StatusCode,
        impl futures::Stream<Item = Result<Bytes, axum::Error>> + Unpin + use<>,
    ) {
        let uri = format!("/containerLogs/default/virt-launcher-a/compute?{query}");
        let req = axum::http::Request::get(uri).body(Body::empty()).unwrap();
        let res = self.app().oneshot(req).await.unwrap();
        (res.status(), res.into_body().into_data_stream())
    }
}

fn joined(frames: &[Bytes]) -> Vec<u8> {
    frames.iter().flat_map(|f| f.iter().copied()).collect()
}

/// The last `n` lines of `bytes`, the simple way (the oracle of the backwards scan).
fn naive_tail(bytes: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &[];
    }
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let start = body
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, b)| **b == b'\n')
        .nth(n - 1)
        .map_or(0, |(i, _)| i + 1);
    &bytes[start..]
}

#[tokio::test]
async fn the_backwards_scan_finds_the_same_lines_as_a_full_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let mut long = Vec::new();
    for i in 0..3000 {
        long.extend_from_slice(format!("line {i} {}\n", "x".repeat(i % 37)).as_bytes());
    }
    let cases: [&[u8]; 6] = [b"a\nb\nc\n", b"a\nb\nc", b"a\nb\n", b"", b"\n\n\n", &long];
    for content in cases {
        std::fs::write(&path, content).unwrap();
        let mut file = tokio::fs::File::open(&path).await.unwrap();
        let len = content.len() as u64;
        for n in [0, 1, 2, 5, 100, 2999, 5000] {
            let offset = tail_offset(&mut file, len, n).await.unwrap();
            let tail = &content[usize::try_from(offset).unwrap()..];
            assert_eq!(
                tail,
                naive_tail(content, usize::try_from(n).unwrap()),
                "n={n}"
            );
        }
    }
}

#[tokio::test]
async fn tail_lines_answers_the_last_lines_of_a_large_log() {
    let node = Node::new();
    let mut content = Vec::new();
    for i in 0..50_000 {
        content.extend_from_slice(format!("serial line {i}\n").as_bytes());
    }
    node.write(&content);
    let (status, frames) = node.get("tailLines=2").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(joined(&frames), b"serial line 49998\nserial line 49999\n");
}

#[tokio::test]
async fn a_large_log_is_sent_in_bounded_chunks() {
    let node = Node::new();
    let content: Vec<u8> = (0..300 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    node.write(&content);
    let (_, frames) = node.get("").await;
    assert!(frames.len() > 1, "sent as one piece");
    assert!(frames.iter().all(|f| f.len() <= CHUNK));
    assert_eq!(joined(&frames), content);
}

/// A 1 GiB log (sparse: it takes no disk) is never read whole: `tailLines` reads from its
/// end, and a plain request is answered chunk by chunk as the client reads (the first
/// frames arrive, at most [`CHUNK`] bytes each, and the client can stop after them).
#[tokio::test]
async fn a_gibibyte_log_is_tailed_from_its_end_and_streamed_in_chunks() {
    const GIB: u64 = 1 << 30;
    let node = Node::new();
    {
        let file = std::fs::File::create(node.log()).unwrap();
        file.set_len(GIB).unwrap();
    }
    node.append(b"\nbefore last\nlast line\n");
    let (status, frames) = node.get("tailLines=2").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(joined(&frames), b"before last\nlast line\n");

    let (status, frames) = node.get("limitBytes=100000").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(joined(&frames).len(), 100_000);
    assert!(frames.iter().all(|f| f.len() <= CHUNK));

    let (status, mut body) = node.open("").await;
    assert_eq!(status, StatusCode::OK);
    let mut received = 0;
    for _ in 0..16 {
        let frame = body.next().await.expect("a frame").unwrap();
        assert!(frame.len() <= CHUNK, "a frame of {} bytes", frame.len());
        assert!(frame.iter().all(|b| *b == 0));
        received += frame.len();
    }
    assert!(received <= 16 * CHUNK);
    drop(body);
}

#[tokio::test]
async fn limit_bytes_caps_the_answer() {
    let node = Node::new();
    node.write(b"0123456789\nabcdef\n");
    let (_, frames) = node.get("limitBytes=5").await;
    assert_eq!(joined(&frames), b"01234");
    let (_, frames) = node.get("tailLines=1&limitBytes=3").await;
    assert_eq!(joined(&frames), b"abc");
}

#[tokio::test]
async fn since_seconds_leaves_out_a_log_not_written_since() {
    let node = Node::new();
    node.write(b"old boot\n");
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(node.log())
        .unwrap()
        .set_modified(an_hour_ago)
        .unwrap();
    let (_, frames) = node.get("sinceSeconds=60").await;
    assert_eq!(joined(&frames), b"");
    let (_, frames) = node.get("sinceSeconds=7200").await;
    assert_eq!(joined(&frames), b"old boot\n");
    let (_, frames) = node.get("sinceTime=2000-01-01T00:00:00Z").await;
    assert_eq!(joined(&frames), b"old boot\n");
}

#[tokio::test]
async fn invalid_log_options_are_refused() {
    let node = Node::new();
    node.write(b"x\n");
    for query in [
        "tailLines=-1",
        "limitBytes=0",
        "sinceSeconds=0",
        "sinceSeconds=5&sinceTime=2000-01-01T00:00:00Z",
        "sinceTime=yesterday",
    ] {
        let (status, _) = node.get(query).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
    }
}

#[tokio::test(start_paused = true)]
async fn follow_sends_only_what_was_appended_and_starts_over_after_a_rotation() {
    let node = Node::new();
    node.write(b"boot\n");
    let (status, mut body) = node.open("follow=true").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&body.next().await.unwrap().unwrap()[..], b"boot\n");
    node.append(b"login:\n");
    assert_eq!(&body.next().await.unwrap().unwrap()[..], b"login:\n");
    // A rotation truncates the log; what comes after is sent from its start, also when it
    // has grown past the old offset before the next poll.
    assert!(private_fs::log_rotation::rotate_if_larger(&node.log(), 1).unwrap());
    node.append(b"after rotation\n");
    assert_eq!(
        &body.next().await.unwrap().unwrap()[..],
        b"after rotation\n"
    );
    node.present.store(false, Ordering::SeqCst);
    assert!(body.next().await.is_none(), "the stream ends with the pod");
}

#[tokio::test(start_paused = true)]
async fn follow_with_limit_bytes_ends_at_the_limit() {
    let node = Node::new();
    node.write(b"abc");
    let (_, mut body) = node.open("follow=true&limitBytes=5").await;
    assert_eq!(&body.next().await.unwrap().unwrap()[..], b"abc");
    node.append(b"defgh");
    assert_eq!(&body.next().await.unwrap().unwrap()[..], b"de");
    assert!(body.next().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn follow_of_a_log_that_does_not_exist_yet_starts_when_it_appears() {
    let node = Node::new();
    let (_, mut body) = node.open("follow=true").await;
    let next = tokio::spawn(async move { body.next().await.map(|f| f.unwrap()) });
    node.write(b"first line\n");
    assert_eq!(&next.await.unwrap().unwrap()[..], b"first line\n");
}

/// A log as a container runtime writes it: an entry per line, with the time it was written.
fn cri_log() -> String {
    [
        "2026-03-01T10:00:00.000000001Z stdout F booting",
        "2026-03-01T10:00:01.5Z stderr F a warning",
        "2026-03-01T10:00:02Z stdout P a long ",
        "2026-03-01T10:00:02Z stdout F line",
        "2026-03-01T10:00:03.25Z stdout F ready",
        "",
    ]
    .join("\n")
}

#[tokio::test]
async fn a_cri_log_is_answered_as_the_containers_output() {
    let node = Node::new();
    node.write(cri_log().as_bytes());
    let (status, frames) = node.get("").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        String::from_utf8(joined(&frames)).unwrap(),
        "booting\na warning\na long line\nready\n"
    );
    let (_, frames) = node.get("tailLines=1").await;
    assert_eq!(joined(&frames), b"ready\n");
    let (_, frames) = node.get("limitBytes=10").await;
    assert_eq!(
        joined(&frames),
        b"booting\na ",
        "the limit counts what is answered"
    );
}

#[tokio::test]
async fn timestamps_put_each_lines_time_in_front() {
    let node = Node::new();
    node.write(cri_log().as_bytes());
    let (_, frames) = node.get("timestamps=true&tailLines=2").await;
    assert_eq!(
        String::from_utf8(joined(&frames)).unwrap(),
        "2026-03-01T10:00:02Z line\n2026-03-01T10:00:03.25Z ready\n"
    );
    let (_, frames) = node.get("timestamps=true&limitBytes=40").await;
    assert_eq!(
        String::from_utf8(joined(&frames)).unwrap(),
        "2026-03-01T10:00:00.000000001Z booting\n2"
    );
}

#[tokio::test]
async fn since_time_leaves_out_the_lines_written_before_it() {
    let node = Node::new();
    node.write(cri_log().as_bytes());
    let (_, frames) = node.get("sinceTime=2026-03-01T10:00:01.5Z").await;
    assert_eq!(
        String::from_utf8(joined(&frames)).unwrap(),
        "a warning\na long line\nready\n"
    );
    let (_, frames) = node
        .get("sinceTime=2026-03-01T10:00:02.000000001Z&timestamps=true")
        .await;
    assert_eq!(
        String::from_utf8(joined(&frames)).unwrap(),
        "2026-03-01T10:00:03.25Z ready\n"
    );
    // sinceSeconds too: every line of this log is older than a minute.
    let (_, frames) = node.get("sinceSeconds=60").await;
    assert_eq!(joined(&frames), b"");
}

#[tokio::test(start_paused = true)]
async fn follow_of_a_cri_log_sends_whole_lines() {
    let node = Node::new();
    node.write(b"2026-03-01T10:00:00Z stdout F first\n");
    let (_, mut body) = node.open("follow=true&timestamps=true").await;
    assert_eq!(
        &body.next().await.unwrap().unwrap()[..],
        b"2026-03-01T10:00:00Z first\n"
    );
    // An entry caught half-written is sent once its newline is there (the clock is paused:
    // three polls pass without a frame).
    node.append(b"2026-03-01T10:00:05Z stdout F sec");
    let waited = tokio::time::timeout(FOLLOW_POLL * 3, body.next()).await;
    assert!(waited.is_err(), "sent half-written: {waited:?}");
    node.append(b"ond\n");
    assert_eq!(
        &body.next().await.unwrap().unwrap()[..],
        b"2026-03-01T10:00:05Z second\n"
    );
}
