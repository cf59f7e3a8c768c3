//! Launcher spec → QEMU command line, as a pure function.
//!
//! [`qemu_argv`] validates a [`LauncherSpec`] and renders the arguments that follow the
//! `qemu-system-x86_64` program name. One file per device area appends its part in a fixed
//! order (identity, machine, CPU, memory, firmware, disks, NICs, graphics, console/QMP), so the same
//! spec always yields the same argv; golden files under `testdata/argv/` pin it down
//! (`UPDATE_GOLDEN=1 cargo nextest run -p virt-launcher` rewrites them).
//!
//! Conventions: devices the user named get the QEMU id `ua-<name>` ("user alias", as
//! upstream does); block nodes are numbered (`file-N`/`disk-N`, QEMU limits node names to
//! 31 characters); option values are comma-escaped, and `-blockdev` takes JSON so host
//! paths need no escaping at all.

pub mod channels;
mod console;
mod cpu;
pub(crate) mod disks;
mod firmware;
mod graphics;
mod machine;
pub(crate) mod memory;
mod net;

use crate::spec::LauncherSpec;

/// A spec the launcher cannot turn into a working QEMU command line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgvError {
    /// The machine type is not from the q35 family.
    #[error("machine type {0:?} is not supported, use q35")]
    UnsupportedMachine(String),
    /// A CPU topology count is zero or `maxSockets` is below `sockets`.
    #[error("invalid CPU topology: {0}")]
    CpuTopology(String),
    /// The CPU model cannot be used with the chosen acceleration or is malformed.
    #[error("invalid CPU model: {0}")]
    CpuModel(String),
    /// Guest memory sizes are inconsistent.
    #[error("invalid memory: {0}")]
    Memory(String),
    /// Firmware settings conflict.
    #[error("invalid firmware: {0}")]
    Firmware(String),
    /// A disk cannot be attached as described.
    #[error("disk {name:?}: {reason}")]
    Disk {
        /// The disk's name in the VMI.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An interface cannot be attached as described.
    #[error("interface {name:?}: {reason}")]
    Interface {
        /// The interface's name in the VMI.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Two devices claim the same boot order.
    #[error("boot order {0} is used more than once")]
    DuplicateBootOrder(u32),
    /// An acceleration option does not apply to the chosen accelerator.
    #[error("invalid acceleration: {0}")]
    Accel(String),
    /// A host path is empty or not absolute.
    #[error("{what} path {path:?} must be absolute")]
    RelativePath {
        /// Which path.
        what: &'static str,
        /// The offending value.
        path: String,
    },
}

/// Renders the QEMU arguments (without the program name) for `spec`.
///
/// # Errors
/// [`ArgvError`] when the spec describes something impossible or unsupported.
pub fn qemu_argv(spec: &LauncherSpec) -> Result<Vec<String>, ArgvError> {
    let mut args = Args::default();
    args.push_pair(
        "-name",
        format!("guest={},debug-threads=on", escape(&domain_name(spec))),
    );
    args.push_all(["-nodefaults", "-no-user-config"]);
    args.push_pair("-display", "none");
    args.push_pair("-msg", "timestamp=on");
    machine::push(spec, &mut args)?;
    cpu::push(spec, &mut args)?;
    memory::push(spec, &mut args)?;
    firmware::push(spec, &mut args)?;
    check_boot_orders(spec)?;
    disks::push(spec, &mut args)?;
    net::push(spec, &mut args)?;
    graphics::push(spec, &mut args)?;
    console::push(spec, &mut args)?;
    Ok(args.0)
}

/// The domain name, `<namespace>_<name>` as upstream names libvirt domains.
pub fn domain_name(spec: &LauncherSpec) -> String {
    format!("{}_{}", spec.vmi.namespace, spec.vmi.name)
}

/// Accumulates arguments.
#[derive(Default)]
struct Args(Vec<String>);

impl Args {
    fn push_pair(&mut self, flag: &str, value: impl Into<String>) {
        self.0.push(flag.to_owned());
        self.0.push(value.into());
    }

    fn push_all<const N: usize>(&mut self, flags: [&str; N]) {
        self.0.extend(flags.iter().map(|f| (*f).to_owned()));
    }
}

/// Escapes a value for QEMU's `key=value,…` option syntax (a comma is doubled).
fn escape(value: &str) -> String {
    value.replace(',', ",,")
}

/// Refuses empty and relative host paths: QEMU would resolve them against its cwd.
fn absolute(what: &'static str, path: &str) -> Result<(), ArgvError> {
    if path.starts_with('/') {
        Ok(())
    } else {
        Err(ArgvError::RelativePath {
            what,
            path: path.to_owned(),
        })
    }
}

/// Whether `name` is usable inside a QEMU id (`ua-<name>`).
pub(crate) fn valid_device_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn check_boot_orders(spec: &LauncherSpec) -> Result<(), ArgvError> {
    let mut seen = std::collections::BTreeSet::new();
    let orders = spec
        .disks
        .iter()
        .filter_map(|d| d.boot_order)
        .chain(spec.interfaces.iter().filter_map(|i| i.boot_order));
    for order in orders {
        if !seen.insert(order) {
            return Err(ArgvError::DuplicateBootOrder(order));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::PathBuf;

    fn testdata() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/argv")
    }

    /// Every `testdata/argv/NAME.json` renders exactly `NAME.argv` (one argument per line).
    #[test]
    fn golden_specs_render_their_recorded_argv() {
        let update = std::env::var_os("UPDATE_GOLDEN").is_some();
        let mut specs: Vec<_> = std::fs::read_dir(testdata())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        specs.sort();
        assert!(specs.len() >= 5, "golden specs missing");
        let mut mismatches = Vec::new();
        for path in specs {
            let spec: LauncherSpec = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let rendered = qemu_argv(&spec)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                .join("\n")
                + "\n";
            let golden = path.with_extension("argv");
            if update {
                std::fs::write(&golden, &rendered).unwrap();
            } else if std::fs::read_to_string(&golden).ok().as_deref() != Some(rendered.as_str()) {
                mismatches.push(format!("{}:\n{rendered}", golden.display()));
            }
        }
        assert!(
            mismatches.is_empty(),
            "argv differs (UPDATE_GOLDEN=1 to accept):\n{}",
            mismatches.join("\n")
        );
    }

    pub(crate) fn minimal_spec() -> LauncherSpec {
        serde_json::from_str(
            &std::fs::read_to_string(testdata().join("minimal-kernel-boot.json")).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn commas_in_option_values_are_doubled() {
        let mut spec = minimal_spec();
        spec.vmi.name = "a,b".into();
        let argv = qemu_argv(&spec).unwrap();
        assert!(
            argv.contains(&"guest=default_a,,b,debug-threads=on".to_owned()),
            "{argv:?}"
        );
    }

    #[test]
    fn the_same_boot_order_twice_is_refused() {
        let mut spec: LauncherSpec = serde_json::from_str(
            &std::fs::read_to_string(testdata().join("disks-all-buses.json")).unwrap(),
        )
        .unwrap();
        for disk in &mut spec.disks {
            disk.boot_order = Some(1);
        }
        assert_eq!(qemu_argv(&spec), Err(ArgvError::DuplicateBootOrder(1)));
    }

    #[test]
    fn a_relative_socket_path_is_refused() {
        let mut spec = minimal_spec();
        spec.paths.qmp_socket = "qmp.sock".into();
        assert!(matches!(
            qemu_argv(&spec),
            Err(ArgvError::RelativePath {
                what: "QMP socket",
                ..
            })
        ));
    }
}
