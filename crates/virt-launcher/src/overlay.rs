//! qcow2 overlays: the writable layer a guest writes to over a pristine disk — a containerDisk's
//! image (virt-handler writes those in the pod directory) or the `disk.img` (or block device)
//! of an `ephemeral` volume's claim (the launcher writes those, in its own mount namespace
//! where the claim is mounted). Upstream does the same with `qemu-img create -b`.
//!
//! [`write_overlay`] writes an empty qcow2 (version 3, 64 KiB clusters, 16-bit refcounts)
//! whose backing file is named relative to the overlay's directory (a containerDisk's, beside
//! it) or by its absolute path (a claim's), with its format in the backing-format header
//! extension so QEMU never probes it. No `qemu-img` is needed. QEMU opens the backing file
//! read-only; every guest write lands in the overlay.
//!
//! Layout: cluster 0 header + extensions + backing name, cluster 1 the refcount table,
//! cluster 2 its one refcount block, clusters 3… the (empty) L1 table.

use std::io::Write;
use std::path::Path;

const CLUSTER_BITS: u32 = 16;
const CLUSTER: u64 = 1 << CLUSTER_BITS;
const HEADER_LENGTH: u32 = 104;
const BACKING_FORMAT_EXTENSION: u32 = 0xE279_2ACA;

/// The virtual size of a disk: a raw file's (or block device's) length, a qcow2's header
/// `size`.
///
/// # Errors
/// Reading the file failed, or a `.qcow2` file has no qcow2 header.
pub fn virtual_size(path: &Path, qcow2: bool) -> std::io::Result<u64> {
    if !qcow2 {
        // Seeking to the end measures a block device too (its metadata length is 0).
        return std::io::Seek::seek(&mut std::fs::File::open(path)?, std::io::SeekFrom::End(0));
    }
    let mut header = [0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open(path)?, &mut header)?;
    if header[..4] != *b"QFI\xfb" {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is not a qcow2 image", path.display()),
        ));
    }
    let mut size = [0u8; 8];
    size.copy_from_slice(&header[24..32]);
    Ok(u64::from_be_bytes(size))
}

/// The bytes of an empty qcow2 of `size` bytes over `backing` (a name relative to the
/// overlay's directory, or an absolute path) in `backing_format` (`raw` or `qcow2`).
///
/// # Errors
/// A backing name or format too long to fit the header cluster.
pub fn overlay_bytes(backing: &str, backing_format: &str, size: u64) -> std::io::Result<Vec<u8>> {
    let l2_coverage = CLUSTER * (CLUSTER / 8);
    let l1_entries = size.div_ceil(l2_coverage).max(1);
    let l1_clusters = (l1_entries * 8).div_ceil(CLUSTER);
    let clusters = 3 + l1_clusters;
    let too_long =
        || std::io::Error::new(std::io::ErrorKind::InvalidInput, "backing name too long");
    let format_padded = backing_format.len().div_ceil(8) * 8;
    let backing_offset = u64::from(HEADER_LENGTH) + 8 + format_padded as u64 + 8;
    if backing_offset + backing.len() as u64 > CLUSTER || backing.len() > 1023 {
        return Err(too_long());
    }
    let l1_entries = u32::try_from(l1_entries).map_err(|_| too_long())?;
    let mut out = Vec::with_capacity(usize::try_from(clusters * CLUSTER).unwrap_or(0));
    out.extend_from_slice(b"QFI\xfb");
    out.extend_from_slice(&3u32.to_be_bytes()); // version
    out.extend_from_slice(&backing_offset.to_be_bytes());
    out.extend_from_slice(
        &u32::try_from(backing.len())
            .map_err(|_| too_long())?
            .to_be_bytes(),
    );
    out.extend_from_slice(&CLUSTER_BITS.to_be_bytes());
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes()); // crypt_method
    out.extend_from_slice(&l1_entries.to_be_bytes());
    out.extend_from_slice(&(3 * CLUSTER).to_be_bytes()); // l1_table_offset
    out.extend_from_slice(&CLUSTER.to_be_bytes()); // refcount_table_offset
    out.extend_from_slice(&1u32.to_be_bytes()); // refcount_table_clusters
    out.extend_from_slice(&0u32.to_be_bytes()); // nb_snapshots
    out.extend_from_slice(&0u64.to_be_bytes()); // snapshots_offset
    out.extend_from_slice(&0u64.to_be_bytes()); // incompatible_features
    out.extend_from_slice(&0u64.to_be_bytes()); // compatible_features
    out.extend_from_slice(&0u64.to_be_bytes()); // autoclear_features
    out.extend_from_slice(&4u32.to_be_bytes()); // refcount_order: 16-bit
    out.extend_from_slice(&HEADER_LENGTH.to_be_bytes());
    out.extend_from_slice(&BACKING_FORMAT_EXTENSION.to_be_bytes());
    out.extend_from_slice(
        &u32::try_from(backing_format.len())
            .map_err(|_| too_long())?
            .to_be_bytes(),
    );
    out.extend_from_slice(backing_format.as_bytes());
    out.resize(out.len() + format_padded - backing_format.len(), 0);
    out.extend_from_slice(&[0u8; 8]); // end of the extensions
    out.extend_from_slice(backing.as_bytes());
    out.resize(usize::try_from(CLUSTER).unwrap_or(0), 0);
    // Cluster 1: the refcount table, pointing at the refcount block in cluster 2.
    let mut table = vec![0u8; usize::try_from(CLUSTER).unwrap_or(0)];
    table[..8].copy_from_slice(&(2 * CLUSTER).to_be_bytes());
    out.extend_from_slice(&table);
    // Cluster 2: refcount 1 for every cluster of the file.
    let mut block = vec![0u8; usize::try_from(CLUSTER).unwrap_or(0)];
    for i in 0..usize::try_from(clusters).unwrap_or(0) {
        block[2 * i..2 * i + 2].copy_from_slice(&1u16.to_be_bytes());
    }
    out.extend_from_slice(&block);
    // Clusters 3…: the L1 table, all unallocated.
    out.resize(
        out.len() + usize::try_from(l1_clusters * CLUSTER).unwrap_or(0),
        0,
    );
    Ok(out)
}

/// Writes the overlay `path` over `backing` (relative name or absolute path) of `backing_format` and `size`.
///
/// # Errors
/// As [`overlay_bytes`], and writing the file.
pub fn write_overlay(
    path: &Path,
    backing: &str,
    backing_format: &str,
    size: u64,
) -> std::io::Result<()> {
    let bytes = overlay_bytes(backing, backing_format, size)?;
    let mut file = std::fs::File::create(path)?;
    file.write_all(&bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    #[test]
    fn the_header_names_its_backing_file_format_and_size() {
        let bytes = overlay_bytes("root.base.img", "raw", 10 << 30).unwrap();
        assert_eq!(&bytes[..4], b"QFI\xfb");
        assert_eq!(bytes.len() as u64 % CLUSTER, 0);
        let offset = u64::from_be_bytes(bytes[8..16].try_into().unwrap()) as usize;
        let len = u32::from_be_bytes(bytes[16..20].try_into().unwrap()) as usize;
        assert_eq!(&bytes[offset..offset + len], b"root.base.img");
        assert_eq!(
            u64::from_be_bytes(bytes[24..32].try_into().unwrap()),
            10 << 30
        );
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("o.qcow2");
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(virtual_size(&path, true).unwrap(), 10 << 30);
        assert!(overlay_bytes(&"x".repeat(2000), "raw", 1).is_err());
    }

    /// Runs `qemu-io` commands on the overlay inside a real QEMU (HMP through QMP); returns
    /// what `qemu-io` printed (on QEMU's stdout, between the QMP answers).
    fn qemu_io(qemu: &Path, overlay: &Path, commands: &[&str]) -> String {
        let file = serde_json::json!({"driver": "file", "filename": overlay, "node-name": "f"});
        let disk = serde_json::json!({"driver": "qcow2", "file": "f", "node-name": "d"});
        let mut child = Command::new(qemu)
            .args([
                "-machine",
                "none",
                "-nodefaults",
                "-display",
                "none",
                "-qmp",
                "stdio",
            ])
            .arg("-blockdev")
            .arg(file.to_string())
            .arg("-blockdev")
            .arg(disk.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut printed = String::new();
        let mut send = |value: serde_json::Value| {
            writeln!(stdin, "{value}").unwrap();
            loop {
                let line = lines.next().expect("QEMU answered").unwrap();
                match serde_json::from_str::<serde_json::Value>(&line) {
                    Ok(answer) if answer.get("return").is_some() => return,
                    Ok(answer) if answer.get("error").is_some() => panic!("QMP error: {answer}"),
                    Ok(_) => {}
                    Err(_) => {
                        printed.push_str(&line);
                        printed.push('\n');
                    }
                }
            }
        };
        send(serde_json::json!({"execute": "qmp_capabilities"}));
        for command in commands {
            send(serde_json::json!({
                "execute": "human-monitor-command",
                "arguments": {"command-line": format!("qemu-io d \"{command}\"")},
            }));
        }
        send(serde_json::json!({"execute": "quit"}));
        let _ = child.wait();
        printed
    }

    #[test]
    fn qemu_reads_the_backing_disk_through_the_overlay_and_writes_only_the_overlay() {
        let Some(qemu) = test_prerequisites::available(test_prerequisites::qemu_binary()) else {
            return;
        };
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("root.base.img");
        std::fs::write(&base, vec![0x5a_u8; 1 << 20]).unwrap();
        let overlay = tmp.path().join("root.qcow2");
        write_overlay(&overlay, "root.base.img", "raw", 1 << 20).unwrap();
        let out = qemu_io(
            &qemu,
            &overlay,
            &[
                "read -P 0x5a 0 1M",
                "write -P 0x11 4096 4096",
                "read -P 0x11 4096 4096",
                "read -P 0x5a 8192 8192",
            ],
        );
        assert_eq!(out.matches(" bytes at offset ").count(), 4, "{out}");
        assert!(!out.contains("failed"), "{out}");
        assert!(
            std::fs::read(&base).unwrap().iter().all(|b| *b == 0x5a),
            "the backing disk is pristine"
        );
        assert!(std::fs::metadata(&overlay).unwrap().len() > 4 * CLUSTER);
    }

    #[test]
    fn a_backing_named_by_its_absolute_path_is_read_and_never_written() {
        let Some(qemu) = test_prerequisites::available(test_prerequisites::qemu_binary()) else {
            return;
        };
        let tmp = tempfile::tempdir().unwrap();
        let claim = tmp.path().join("claim");
        std::fs::create_dir_all(&claim).unwrap();
        let base = claim.join("disk.img");
        std::fs::write(&base, vec![0x5a_u8; 1 << 20]).unwrap();
        let pod = tmp.path().join("pod");
        std::fs::create_dir_all(&pod).unwrap();
        let overlay = pod.join("eph.qcow2");
        write_overlay(&overlay, &base.display().to_string(), "raw", 1 << 20).unwrap();
        let out = qemu_io(
            &qemu,
            &overlay,
            &[
                "read -P 0x5a 0 1M",
                "write -P 0x22 0 4096",
                "read -P 0x22 0 4096",
            ],
        );
        assert_eq!(out.matches(" bytes at offset ").count(), 3, "{out}");
        assert!(!out.contains("failed"), "{out}");
        assert!(std::fs::read(&base).unwrap().iter().all(|b| *b == 0x5a));
    }
}
