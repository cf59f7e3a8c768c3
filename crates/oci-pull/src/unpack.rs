//! Layers (tar, gzip-compressed or not) unpacked into a directory, safely.
//!
//! [`unpack_layers`] applies the layers in order into a fresh temporary directory next to the
//! target and renames it into place only when every layer applied, so a reader never sees a
//! half-unpacked image and a refused layer leaves nothing behind.
//!
//! # Guarantees
//! - Nothing is written outside the temporary directory: entries with an absolute path or a
//!   `..` component are refused, and so is any entry whose parent is reached through a
//!   symlink or a non-directory; hard links must name a regular file already unpacked.
//! - Device nodes and FIFOs are refused; symlinks are created but never followed.
//! - Whiteouts (`.wh.<name>`, `.wh..wh..opq`) remove what lower layers put there, as the OCI
//!   image spec says; entries of the same layer are kept.
//! - Files are `0600` and directories `0700` whatever the archive says (the store is
//!   owner-only).

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Component, Path, PathBuf};

const FILE_MODE: u32 = 0o600;
const DIR_MODE: u32 = 0o700;
const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Why a layer could not be unpacked.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// An entry has an absolute path or a `..` component.
    #[error("layer entry {0:?} leaves the image (absolute path or '..')")]
    Traversal(String),
    /// An entry's parent is a symlink or not a directory.
    #[error("layer entry {0:?} goes through a symlink or a non-directory")]
    ThroughLink(String),
    /// A device node or FIFO.
    #[error("layer entry {0:?} is a device node or FIFO, which an image may not hold")]
    Special(String),
    /// A hard link whose target is not a regular file unpacked before it.
    #[error("layer entry {entry:?} links to {target:?}, which is not a regular file of the image")]
    BadLink {
        /// The entry.
        entry: String,
        /// Its link target.
        target: String,
    },
    /// The layer is compressed in a way not supported (zstd).
    #[error("layer {0} is compressed with zstd, which is not supported")]
    Zstd(String),
    /// Reading the archive or writing a file failed.
    #[error("unpacking {0}")]
    Io(String, #[source] std::io::Error),
}

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> UnpackError {
    let what = what.to_string();
    move |e| UnpackError::Io(what, e)
}

/// A path inside the image as plain relative components; `None` for the root itself.
fn relative(entry: &str) -> Result<Option<PathBuf>, UnpackError> {
    let mut out = PathBuf::new();
    for component in Path::new(entry).components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            Component::RootDir | Component::ParentDir | Component::Prefix(_) => {
                return Err(UnpackError::Traversal(entry.to_owned()));
            }
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Makes every ancestor of `rel` below `root` a real directory (creating missing ones),
/// refusing symlinks and non-directories on the way.
fn ensure_parents(root: &Path, rel: &Path, entry: &str) -> Result<(), UnpackError> {
    let mut dir = root.to_path_buf();
    let Some(parent) = rel.parent() else {
        return Ok(());
    };
    for component in parent.components() {
        dir.push(component);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(UnpackError::ThroughLink(entry.to_owned())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                make_dir(&dir).map_err(io(entry))?;
            }
            Err(e) => return Err(UnpackError::Io(entry.to_owned(), e)),
        }
    }
    Ok(())
}

fn make_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(DIR_MODE).create(path)?;
    set_mode(path, DIR_MODE)
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Removes whatever is at `path` (a file, a symlink or a whole directory), if anything.
fn remove_any(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The layer's bytes, decompressed when gzip (detected by its magic bytes).
fn open_layer(path: &Path) -> Result<Box<dyn Read>, UnpackError> {
    let name = path.display().to_string();
    let mut file = BufReader::new(File::open(path).map_err(io(&name))?);
    let magic = std::io::BufRead::fill_buf(&mut file).map_err(io(&name))?;
    if magic.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(flate2::bufread::MultiGzDecoder::new(file)))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Err(UnpackError::Zstd(name))
    } else {
        Ok(Box::new(file))
    }
}

/// Applies one layer onto `root`.
pub fn apply_layer(root: &Path, layer: &Path) -> Result<(), UnpackError> {
    let reader = open_layer(layer)?;
    let mut archive = tar::Archive::new(reader);
    let layer_name = layer.display().to_string();
    // What this layer itself created: whiteouts only apply to lower layers.
    let mut created: HashSet<PathBuf> = HashSet::new();
    for entry in archive.entries().map_err(io(&layer_name))? {
        let mut entry = entry.map_err(io(&layer_name))?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let Some(rel) = relative(&name)? else {
            continue;
        };
        ensure_parents(root, &rel, &name)?;
        let target = root.join(&rel);
        let mut ancestor = target.parent();
        while let Some(dir) = ancestor.filter(|d| *d != root) {
            created.insert(dir.to_path_buf());
            ancestor = dir.parent();
        }
        let file_name = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if file_name == OPAQUE {
            let dir = target.parent().unwrap_or(root);
            for child in std::fs::read_dir(dir).map_err(io(&name))? {
                let child = child.map_err(io(&name))?.path();
                if !created.contains(&child) {
                    remove_any(&child).map_err(io(&name))?;
                }
            }
            continue;
        }
        if let Some(hidden) = file_name.strip_prefix(WHITEOUT_PREFIX) {
            let victim = target.with_file_name(hidden);
            if !created.contains(&victim) {
                remove_any(&victim).map_err(io(&name))?;
            }
            continue;
        }
        let kind = entry.header().entry_type();
        match kind {
            tar::EntryType::Directory => match std::fs::symlink_metadata(&target) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    remove_any(&target).map_err(io(&name))?;
                    make_dir(&target).map_err(io(&name))?;
                }
                Err(_) => make_dir(&target).map_err(io(&name))?,
            },
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                remove_any(&target).map_err(io(&name))?;
                let mut out = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&target)
                    .map_err(io(&name))?;
                std::io::copy(&mut entry, &mut out).map_err(io(&name))?;
                set_mode(&target, FILE_MODE).map_err(io(&name))?;
            }
            tar::EntryType::Symlink => {
                let link =
                    entry
                        .link_name()
                        .map_err(io(&name))?
                        .ok_or_else(|| UnpackError::BadLink {
                            entry: name.clone(),
                            target: String::new(),
                        })?;
                remove_any(&target).map_err(io(&name))?;
                std::os::unix::fs::symlink(&link, &target).map_err(io(&name))?;
            }
            tar::EntryType::Link => {
                let link = entry
                    .link_name_bytes()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                let bad = || UnpackError::BadLink {
                    entry: name.clone(),
                    target: link.clone(),
                };
                let link_rel = relative(&link).map_err(|_| bad())?.ok_or_else(bad)?;
                ensure_parents(root, &link_rel, &link).map_err(|_| bad())?;
                let source = root.join(&link_rel);
                let is_file = std::fs::symlink_metadata(&source).is_ok_and(|m| m.is_file());
                if !is_file {
                    return Err(bad());
                }
                remove_any(&target).map_err(io(&name))?;
                std::fs::hard_link(&source, &target).map_err(io(&name))?;
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                return Err(UnpackError::Special(name));
            }
            // Extended headers are consumed by the iterator; anything else carries no file.
            _ => continue,
        }
        created.insert(target);
    }
    Ok(())
}

/// A fresh, unique, owner-only directory next to `target` (a hidden name).
fn temporary_beside(target: &Path, what: &str) -> Result<PathBuf, UnpackError> {
    let parent = target.parent().unwrap_or(Path::new("."));
    let base = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    for _ in 0..16 {
        let candidate = parent.join(format!(".{what}-{}-{base}", rand::random::<u32>()));
        match make_dir(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(UnpackError::Io(candidate.display().to_string(), e)),
        }
    }
    Err(UnpackError::Io(
        parent.display().to_string(),
        std::io::Error::other("no free temporary name"),
    ))
}

/// Unpacks `layers` (in order, lowest first) into `target`: into a temporary directory
/// beside it first, then renamed into place, replacing an earlier `target`.
///
/// # Errors
/// [`UnpackError`]; the temporary directory is removed and `target` is left as it was.
pub fn unpack_layers(layers: &[PathBuf], target: &Path) -> Result<(), UnpackError> {
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent.display()))?;
    }
    let staging = temporary_beside(target, "unpacking")?;
    let applied = layers
        .iter()
        .try_for_each(|layer| apply_layer(&staging, layer));
    if let Err(e) = applied {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    let replaced = std::fs::symlink_metadata(target).is_ok();
    let old = if replaced {
        let old = temporary_beside(target, "replaced")?;
        std::fs::remove_dir(&old).map_err(io(old.display()))?;
        std::fs::rename(target, &old).map_err(io(target.display()))?;
        Some(old)
    } else {
        None
    };
    if let Err(e) = std::fs::rename(&staging, target) {
        let _ = std::fs::remove_dir_all(&staging);
        if let Some(old) = &old {
            let _ = std::fs::rename(old, target);
        }
        return Err(UnpackError::Io(target.display().to_string(), e));
    }
    if let Some(old) = old {
        let _ = remove_any(&old);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A raw tar header for `name` of `kind` with `link` and `data` (the tar crate's
    /// builder refuses the unsafe names these tests need).
    fn raw_entry(out: &mut Vec<u8>, name: &str, kind: u8, link: &str, data: &[u8]) {
        let mut header = [0u8; 512];
        header[..name.len()].copy_from_slice(name.as_bytes());
        header[100..107].copy_from_slice(b"0000644");
        header[108..115].copy_from_slice(b"0000000");
        header[116..123].copy_from_slice(b"0000000");
        let size = format!("{:011o}", data.len());
        header[124..135].copy_from_slice(size.as_bytes());
        header[136..147].copy_from_slice(b"00000000000");
        header[156] = kind;
        header[157..157 + link.len()].copy_from_slice(link.as_bytes());
        header[257..263].copy_from_slice(b"ustar\0");
        header[263..265].copy_from_slice(b"00");
        header[148..156].copy_from_slice(b"        ");
        let sum: u32 = header.iter().map(|b| u32::from(*b)).sum();
        header[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }

    /// `(name, tar type flag, link target, content)`.
    type Entry<'a> = (&'a str, u8, &'a str, &'a [u8]);

    fn layer(dir: &Path, name: &str, entries: &[Entry<'_>], gzip: bool) -> PathBuf {
        let mut tar = Vec::new();
        for (n, kind, link, data) in entries {
            raw_entry(&mut tar, n, *kind, link, data);
        }
        tar.extend_from_slice(&[0u8; 1024]);
        let bytes = if gzip {
            use std::io::Write;
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(&tar).unwrap();
            enc.finish().unwrap()
        } else {
            tar
        };
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn a_gzip_layer_unpacks_with_owner_only_modes() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let l = layer(
            tmp.path(),
            "l1",
            &[
                ("disk/", b'5', "", b""),
                ("disk/disk.img", b'0', "", b"DISK"),
            ],
            true,
        );
        let target = tmp.path().join("image");
        unpack_layers(&[l], &target).unwrap();
        assert_eq!(
            std::fs::read(target.join("disk/disk.img")).unwrap(),
            b"DISK"
        );
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&target.join("disk")), 0o700);
        assert_eq!(mode(&target.join("disk/disk.img")), 0o600);
    }

    #[test]
    fn unsafe_entries_are_refused_and_leave_nothing_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let cases: Vec<(&str, Vec<Entry<'_>>)> = vec![
            ("absolute", vec![("/etc/passwd", b'0', "", b"x")]),
            ("dotdot", vec![("a/../../escape", b'0', "", b"x")]),
            (
                "through-symlink",
                vec![("link", b'2', "/tmp", b""), ("link/escape", b'0', "", b"x")],
            ),
            ("char-device", vec![("dev/null", b'3', "", b"")]),
            ("block-device", vec![("dev/sda", b'4', "", b"")]),
            ("fifo", vec![("pipe", b'6', "", b"")]),
            ("hardlink-out", vec![("h", b'1', "../../etc/passwd", b"")]),
            (
                "hardlink-through-symlink",
                vec![("link", b'2', "/etc", b""), ("h", b'1', "link/passwd", b"")],
            ),
        ];
        for (name, entries) in cases {
            let l = layer(tmp.path(), name, &entries, name.len() % 2 == 0);
            let target = tmp.path().join(format!("image-{name}"));
            let err = unpack_layers(&[l], &target).expect_err(name);
            assert!(
                matches!(
                    err,
                    UnpackError::Traversal(_)
                        | UnpackError::ThroughLink(_)
                        | UnpackError::Special(_)
                        | UnpackError::BadLink { .. }
                ),
                "{name}: {err}"
            );
            assert!(!target.exists(), "{name}: target created");
        }
        let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        assert!(!tmp.path().join("escape").exists());
    }

    #[test]
    fn whiteouts_remove_lower_layer_files_and_opaque_directories_their_content() {
        let tmp = tempfile::tempdir().unwrap();
        let lower = layer(
            tmp.path(),
            "lower",
            &[
                ("keep", b'0', "", b"k"),
                ("gone", b'0', "", b"g"),
                ("dir/old", b'0', "", b"o"),
                ("dir/older", b'0', "", b"o"),
            ],
            false,
        );
        let upper = layer(
            tmp.path(),
            "upper",
            &[
                ("dir/new", b'0', "", b"n"),
                ("dir/.wh..wh..opq", b'0', "", b""),
                (".wh.gone", b'0', "", b""),
                ("linked", b'1', "keep", b""),
            ],
            true,
        );
        let target = tmp.path().join("image");
        unpack_layers(&[lower, upper], &target).unwrap();
        assert!(target.join("keep").is_file());
        assert!(!target.join("gone").exists());
        assert!(!target.join(".wh.gone").exists());
        assert!(!target.join("dir/old").exists());
        assert!(!target.join("dir/older").exists());
        assert_eq!(std::fs::read(target.join("dir/new")).unwrap(), b"n");
        assert_eq!(std::fs::read(target.join("linked")).unwrap(), b"k");
    }

    #[test]
    fn an_unpack_replaces_an_earlier_image_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("image");
        let first = layer(tmp.path(), "a", &[("one", b'0', "", b"1")], true);
        let second = layer(tmp.path(), "b", &[("two", b'0', "", b"2")], true);
        unpack_layers(&[first], &target).unwrap();
        unpack_layers(&[second], &target).unwrap();
        assert!(!target.join("one").exists());
        assert!(target.join("two").is_file());
    }
}
