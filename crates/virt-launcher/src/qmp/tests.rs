use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

use super::*;
use crate::test_support::{ProcessGroupGuard, wait_until};
use test_prerequisites::{available, qemu_binary};

const GREETING: &str = r#"{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian 1:7.2"}, "capabilities": ["oob"]}}"#;

/// A scripted QMP server: sends the greeting, then answers each command line with what
/// `script` returns (zero or more raw lines).
async fn fake_server(
    script: impl Fn(&Value) -> Vec<String> + Send + 'static,
) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qmp.sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let (read, mut write) = stream.into_split();
        write
            .write_all(format!("{GREETING}\n").as_bytes())
            .await
            .unwrap();
        let mut lines = BufReader::new(read).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let command: Value = serde_json::from_str(&line).unwrap();
            for reply in script(&command) {
                if reply == "CLOSE" {
                    return;
                }
                write
                    .write_all(format!("{reply}\n").as_bytes())
                    .await
                    .unwrap();
            }
        }
    });
    (dir, path)
}

#[allow(clippy::needless_pass_by_value)] // callers build the value inline
fn ok(command: &Value, value: Value) -> String {
    json!({"return": value, "id": command["id"]}).to_string()
}

#[tokio::test]
async fn handshake_reads_the_version_and_negotiates_capabilities() {
    let (_dir, path) = fake_server(|c| {
        assert!(c["execute"] == "qmp_capabilities" || c["execute"] == "query-status");
        match c["execute"].as_str() {
            Some("query-status") => vec![ok(c, json!({"status": "running", "running": true}))],
            _ => vec![ok(c, json!({}))],
        }
    })
    .await;
    let (client, _events) = QmpClient::connect(&path).await.unwrap();
    assert_eq!(client.version().major, 7);
    assert_eq!(client.version().package, "Debian 1:7.2");
    let status = client.query_status().await.unwrap();
    assert_eq!(
        status,
        VmStatus {
            status: "running".into(),
            running: true
        }
    );
}

#[tokio::test]
async fn replies_are_matched_by_id_even_when_they_arrive_out_of_order() {
    // The server holds back the reply to the first `stop` and sends it after the reply
    // to the following command.
    let held = Arc::new(Mutex::new(None::<String>));
    let (_dir, path) = fake_server(move |c| {
        let mut held = held.lock().unwrap();
        match c["execute"].as_str() {
            Some("stop") => {
                *held = Some(ok(c, json!("first")));
                vec![]
            }
            Some("cont") => {
                let mut out = vec![ok(c, json!("second"))];
                out.extend(held.take());
                out
            }
            _ => vec![ok(c, json!({}))],
        }
    })
    .await;
    let (client, _events) = QmpClient::connect(&path).await.unwrap();
    let (a, b) = tokio::join!(client.execute("stop", None), async {
        tokio::task::yield_now().await;
        client.execute("cont", None).await
    });
    assert_eq!(a.unwrap(), json!("first"));
    assert_eq!(b.unwrap(), json!("second"));
}

#[tokio::test]
async fn an_error_reply_carries_class_and_description() {
    let (_dir, path) = fake_server(|c| match c["execute"].as_str() {
        Some("device_del") => vec![json!({"error": {"class": "DeviceNotFound", "desc": "Device 'x' not found"}, "id": c["id"]}).to_string()],
        _ => vec![ok(c, json!({}))],
    })
    .await;
    let (client, _events) = QmpClient::connect(&path).await.unwrap();
    let err = client.device_del("x").await.unwrap_err();
    assert!(
        matches!(&err, QmpError::Command { class, desc, .. } if class == "DeviceNotFound" && desc.contains("'x'")),
        "{err}"
    );
}

#[tokio::test]
async fn events_are_streamed_in_order_and_decoded() {
    let (_dir, path) = fake_server(|c| match c["execute"].as_str() {
        Some("system_powerdown") => vec![
            r#"{"timestamp": {"seconds": 1, "microseconds": 5}, "event": "POWERDOWN"}"#.to_owned(),
            ok(c, json!({})),
            r#"{"timestamp": {"seconds": 2, "microseconds": 0}, "event": "SHUTDOWN", "data": {"guest": true, "reason": "guest-shutdown"}}"#.to_owned(),
            "CLOSE".to_owned(),
        ],
        _ => vec![ok(c, json!({}))],
    })
    .await;
    let (client, mut events) = QmpClient::connect(&path).await.unwrap();
    client.system_powerdown().await.unwrap();
    let first = events.recv().await.unwrap();
    assert_eq!(
        (first.kind(), first.timestamp_micros),
        (QmpEventKind::Powerdown, 1_000_005)
    );
    let second = events.recv().await.unwrap();
    assert_eq!(
        second.kind(),
        QmpEventKind::Shutdown {
            guest: true,
            reason: "guest-shutdown".into()
        }
    );
    assert!(
        events.recv().await.is_none(),
        "the stream ends when the socket closes"
    );
    assert!(matches!(
        client.query_status().await,
        Err(QmpError::Disconnected)
    ));
}

#[tokio::test]
async fn a_command_pending_when_the_socket_closes_fails_as_disconnected() {
    let (_dir, path) = fake_server(|c| match c["execute"].as_str() {
        Some("stop") => vec!["CLOSE".to_owned()],
        _ => vec![ok(c, json!({}))],
    })
    .await;
    let (client, _events) = QmpClient::connect(&path).await.unwrap();
    assert!(matches!(client.stop().await, Err(QmpError::Disconnected)));
}

#[tokio::test]
async fn quit_counts_a_closed_connection_as_success() {
    let (_dir, path) = fake_server(|c| match c["execute"].as_str() {
        Some("quit") => vec!["CLOSE".to_owned()],
        _ => vec![ok(c, json!({}))],
    })
    .await;
    let (client, _events) = QmpClient::connect(&path).await.unwrap();
    client.quit().await.unwrap();
}

/// Real QEMU (no guest: `-machine none`): version, stop/cont with their events, quit.
#[tokio::test]
async fn real_qemu_answers_status_pause_resume_and_quit() {
    let Some(qemu) = available(qemu_binary()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("qmp.sock");
    let mut child = tokio::process::Command::new(qemu)
        .args([
            "-machine",
            "none",
            "-accel",
            "tcg",
            "-nodefaults",
            "-display",
            "none",
            "-qmp",
        ])
        .arg(format!("unix:{},server=on,wait=off", sock.display()))
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let _guard = ProcessGroupGuard(child.id().map_or(0, |p| p as i32));
    assert!(
        wait_until(Duration::from_secs(10), || sock.exists()).await,
        "no QMP socket"
    );
    let (client, mut events) = QmpClient::connect(&sock).await.unwrap();
    let version = client.query_version().await.unwrap();
    assert!(version.major >= 7, "{version:?}");
    client.stop().await.unwrap();
    assert_eq!(events.recv().await.unwrap().kind(), QmpEventKind::Stop);
    assert!(!client.query_status().await.unwrap().running);
    client.cont().await.unwrap();
    assert_eq!(events.recv().await.unwrap().kind(), QmpEventKind::Resume);
    client.quit().await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
}

/// Real QEMU (no guest): a file sent with `add-fd` is opened by a block node as
/// `/dev/fdset/N` (only with the access mode it was opened with), and `remove-fd` after
/// `blockdev-del` leaves no fd set behind.
#[tokio::test]
async fn real_qemu_opens_a_file_passed_with_add_fd_from_its_fd_set() {
    let Some(qemu) = available(qemu_binary()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("qmp.sock");
    let mut child = tokio::process::Command::new(qemu)
        .args([
            "-machine",
            "none",
            "-accel",
            "tcg",
            "-nodefaults",
            "-display",
            "none",
            "-qmp",
        ])
        .arg(format!("unix:{},server=on,wait=off", sock.display()))
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let _guard = ProcessGroupGuard(child.id().map_or(0, |p| p as i32));
    assert!(
        wait_until(Duration::from_secs(10), || sock.exists()).await,
        "no QMP socket"
    );
    let (client, _events) = QmpClient::connect(&sock).await.unwrap();
    let image = dir.path().join("image.raw");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&image)
        .unwrap();
    file.set_len(3 << 20).unwrap();
    use std::os::fd::AsFd;
    let set = client.add_fd(file.as_fd(), "hot").await.unwrap();
    drop(file);
    std::fs::remove_file(&image).unwrap(); // QEMU can only reach it through the descriptor
    let node = |read_only: bool| {
        json!({"driver": "file", "filename": format!("/dev/fdset/{set}"), "node-name": "f",
               "read-only": read_only, "cache": {"direct": false, "no-flush": false}})
    };
    let refused = client.blockdev_add(node(true)).await.unwrap_err();
    assert!(
        refused.to_string().contains("fdset"),
        "a read-write file does not serve a read-only node: {refused}"
    );
    client.blockdev_add(node(false)).await.unwrap();
    let nodes = client
        .execute("query-named-block-nodes", None)
        .await
        .unwrap();
    let size = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node-name"] == "f")
        .map(|n| n["image"]["virtual-size"].clone());
    assert_eq!(size, Some(json!(3 << 20)), "{nodes}");
    client.blockdev_del("f").await.unwrap();
    client.remove_fd(set).await.unwrap();
    let sets = client.execute("query-fdsets", None).await.unwrap();
    assert_eq!(sets, json!([]), "no fd set is left");
    client.quit().await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
}
