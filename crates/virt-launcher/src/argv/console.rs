//! Serial console, QMP monitor and pid file.
//!
//! The serial console is a listening unix socket (`virtctl console` connects to it) whose
//! output QEMU also appends to the serial log — upstream's `logSerialConsole`, shown as
//! the `guest-console-log` container. QMP is a second listening socket. Both use
//! `wait=off` so QEMU starts the guest without waiting for a client.

use super::{Args, ArgvError, absolute, escape};
use crate::spec::LauncherSpec;

pub(super) fn push(spec: &LauncherSpec, args: &mut Args) -> Result<(), ArgvError> {
    let paths = &spec.paths;
    absolute("serial console socket", &paths.serial_console_socket)?;
    absolute("serial log", &paths.serial_log)?;
    absolute("QMP socket", &paths.qmp_socket)?;
    absolute("pid file", &paths.pid_file)?;
    args.push_pair(
        "-chardev",
        format!(
            "socket,id=charserial0,path={},server=on,wait=off,logfile={},logappend=on",
            escape(&paths.serial_console_socket),
            escape(&paths.serial_log)
        ),
    );
    args.push_pair("-device", "isa-serial,chardev=charserial0,id=serial0");
    args.push_pair(
        "-chardev",
        format!(
            "socket,id=charmonitor,path={},server=on,wait=off",
            escape(&paths.qmp_socket)
        ),
    );
    args.push_pair("-mon", "chardev=charmonitor,id=monitor,mode=control");
    args.push_pair("-pidfile", paths.pid_file.clone());
    Ok(())
}
