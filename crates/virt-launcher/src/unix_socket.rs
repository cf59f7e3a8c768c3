//! Connecting to unix sockets whose path is longer than `sun_path` allows.
//!
//! A socket address holds at most 107 bytes of path, and a launcher's sockets in the
//! kubelet's pod directory (`…/pods/<uid>/volumes/kubernetes.io~empty-dir/public/launcher.sock`)
//! easily exceed that under a deep data directory. Such a path is reached through its
//! directory instead: the directory is opened (`O_PATH`) and the socket connected as
//! `/proc/self/fd/<fd>/<name>`, which the kernel resolves like the full path.

use std::path::Path;

use tokio::net::UnixStream;

/// The longest path a `sockaddr_un` holds (108 bytes with the terminating NUL).
const MAX_SUN_PATH: usize = 107;

/// Connects to the unix socket at `path`, however long the path is.
///
/// # Errors
/// The error of opening the directory or of connecting.
pub async fn connect(path: &Path) -> std::io::Result<UnixStream> {
    use std::os::unix::ffi::OsStrExt;
    if path.as_os_str().as_bytes().len() <= MAX_SUN_PATH {
        return UnixStream::connect(path).await;
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return UnixStream::connect(path).await;
    };
    let dir = std::fs::File::open(dir)?;
    let short = Path::new("/proc/self/fd")
        .join(std::os::fd::AsRawFd::as_raw_fd(&dir).to_string())
        .join(name);
    let stream = UnixStream::connect(&short).await;
    drop(dir);
    stream
}

/// Binds a listening unix socket at `path`, however long the path is (through its directory,
/// as [`connect`]). Must be called inside a tokio runtime.
///
/// # Errors
/// The error of opening the directory or of binding.
pub fn bind(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::ffi::OsStrExt;
    if path.as_os_str().as_bytes().len() <= MAX_SUN_PATH {
        return tokio::net::UnixListener::bind(path);
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return tokio::net::UnixListener::bind(path);
    };
    let dir = std::fs::File::open(dir)?;
    let short = Path::new("/proc/self/fd")
        .join(std::os::fd::AsRawFd::as_raw_fd(&dir).to_string())
        .join(name);
    let listener = tokio::net::UnixListener::bind(&short);
    drop(dir);
    listener
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_socket_below_a_path_longer_than_sun_path_is_reached() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let deep = tmp.path().join("d".repeat(60)).join("e".repeat(60));
        std::fs::create_dir_all(&deep).expect("mkdir");
        let socket = deep.join("launcher.sock");
        assert!(socket.as_os_str().len() > MAX_SUN_PATH);
        // Bind through the same directory trick (bind has the same limit).
        let listener = bind(&socket).expect("bind");
        assert!(
            UnixStream::connect(&socket).await.is_err(),
            "the plain path is too long"
        );
        let (client, server) = tokio::join!(connect(&socket), listener.accept());
        client.expect("connect");
        server.expect("accept");
    }
}
