//! `ssh [USER@]TYPE/NAME[/NAMESPACE]` and `scp SOURCE DESTINATION`: the system's OpenSSH
//! client, connected to the guest through the VM's or VMI's `portforward` subresource, as
//! upstream's virtctl does (its "local SSH").
//!
//! Data flow: virtctl runs `ssh` (or `scp`) with
//! `-o ProxyCommand=<this virtctl> port-forward --stdio=true TYPE/NAME/NAMESPACE PORT`; ssh
//! speaks its protocol over that command's stdin/stdout, which [`crate::portforward`] tunnels
//! to port `PORT` of the guest. The host ssh sees is `TYPE.NAME.NAMESPACE` (what known_hosts
//! records). Keys, agents, known hosts and every other option stay ssh's own.
//!
//! Differences from upstream: the proxy command names this virtctl by its absolute path and
//! passes `--kubeconfig` on (upstream's repeats `argv[0]` and drops the flag, so the tunnel
//! used another kubeconfig than the command line asked for); ssh's exit status becomes
//! virtctl's (upstream exits 1 with `exit status N`).

use std::path::Path;

use crate::Error;
use crate::cli::{Scp, Ssh, SshOptions};
use crate::client::{Ctx, Kind};
use crate::portforward::{Target, parse_target};

/// A remote end: `[USER@]TYPE/NAME[/NAMESPACE]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// The user named before `@`.
    pub username: Option<String>,
    /// The VM or VMI.
    pub target: Target,
}

/// Parses `[USER@]TYPE/NAME[/NAMESPACE]` with upstream's messages.
///
/// # Errors
/// An empty user or target, or a target [`parse_target`] refuses.
pub fn parse_remote(arg: &str) -> Result<Remote, Error> {
    let fail = |m: &str| Err(Error::Message(m.to_owned()));
    let (username, target) = match arg.split_once('@') {
        Some(("", _)) => return fail("expected username before '@'"),
        Some((user, target)) => (Some(user.to_owned()), target),
        None => (None, arg),
    };
    if target.is_empty() {
        return fail("expected target after '@'");
    }
    Ok(Remote {
        username,
        target: parse_target(target)?,
    })
}

/// An `scp` transfer: which side is the guest's, and the two paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// The guest's end.
    pub remote: Remote,
    /// The path on the guest.
    pub remote_path: String,
    /// The local path.
    pub local_path: String,
    /// Whether the copy goes to the guest.
    pub to_remote: bool,
}

/// Parses `scp`'s two locations, exactly one of them `REMOTE:PATH` (upstream's rule: the one
/// with a `:`).
///
/// # Errors
/// Two or no remote locations (upstream's messages), or a bad remote.
pub fn parse_transfer(source: &str, destination: &str) -> Result<Transfer, Error> {
    let (remote, local, to_remote) = match (source.contains(':'), destination.contains(':')) {
        (true, true) => {
            return Err(Error::Message(format!(
                "copying from a remote location to another remote location is not supported: {source:?} to {destination:?}"
            )));
        }
        (false, false) => {
            return Err(Error::Message(format!(
                "none of the two provided locations seems to be a remote location: {source:?} to {destination:?}"
            )));
        }
        (true, false) => (source, destination, false),
        (false, true) => (destination, source, true),
    };
    let (target, path) = remote.split_once(':').unwrap_or((remote, ""));
    Ok(Transfer {
        remote: parse_remote(target)?,
        remote_path: path.to_owned(),
        local_path: local.to_owned(),
        to_remote,
    })
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Vm => "vm",
        Kind::Vmi => "vmi",
    }
}

/// `USER@TYPE.NAME.NAMESPACE`, the host ssh is told about (user omitted when none).
fn ssh_host(username: Option<&str>, target: &Target, namespace: &str) -> String {
    let user = username.map(|u| format!("{u}@")).unwrap_or_default();
    format!(
        "{user}{}.{}.{namespace}",
        kind_name(target.kind),
        target.name
    )
}

/// The `ProxyCommand` option: this virtctl's `port-forward --stdio` to `port` of the target,
/// quoted for the shell ssh runs it with, `%` escaped from ssh's own token expansion.
fn proxy_command(
    virtctl: &Path,
    kubeconfig: Option<&Path>,
    target: &Target,
    namespace: &str,
    port: u16,
) -> Result<String, Error> {
    let exe = virtctl.to_string_lossy();
    let mut words: Vec<String> = vec![exe.into_owned()];
    if let Some(kubeconfig) = kubeconfig {
        words.push("--kubeconfig".into());
        words.push(kubeconfig.to_string_lossy().into_owned());
    }
    words.extend([
        "port-forward".into(),
        "--stdio=true".into(),
        format!("{}/{}/{namespace}", kind_name(target.kind), target.name),
        port.to_string(),
    ]);
    let line = shlex::try_join(words.iter().map(String::as_str))
        .map_err(|e| Error::Message(format!("cannot quote the proxy command: {e}")))?;
    Ok(format!("ProxyCommand={}", line.replace('%', "%%")))
}

/// The arguments before the destination that `ssh` and `scp` share (upstream's
/// `LocalClientCmd`): the proxy command, the extra options, the identity file.
fn common_args(
    ctx: &SshContext<'_>,
    options: &SshOptions,
    target: &Target,
) -> Result<Vec<String>, Error> {
    let namespace = target.namespace.as_deref().unwrap_or(ctx.namespace);
    let mut args = vec![
        "-o".to_owned(),
        proxy_command(ctx.virtctl, ctx.kubeconfig, target, namespace, options.port)?,
    ];
    args.extend(options.local_ssh_opts.iter().cloned());
    if let Some(identity) = &options.identity_file {
        args.push("-i".into());
        args.push(identity.to_string_lossy().into_owned());
    }
    Ok(args)
}

/// What the commands take from the command line beyond their own flags.
#[derive(Debug, Clone, Copy)]
pub struct SshContext<'a> {
    /// This virtctl (the proxy command runs it).
    pub virtctl: &'a Path,
    /// `--kubeconfig`, passed on to the proxy command.
    pub kubeconfig: Option<&'a Path>,
    /// The namespace of a target that names none.
    pub namespace: &'a str,
}

/// The user: `USER@`, else `--username`, else `USER`, `USERNAME` or `LOGNAME` (upstream's
/// default); none leaves it to ssh.
fn username(given: Option<&str>, options: &SshOptions) -> Option<String> {
    given
        .map(str::to_owned)
        .or_else(|| options.username.clone())
        .or_else(|| {
            ["USER", "USERNAME", "LOGNAME"]
                .iter()
                .find_map(|v| std::env::var(v).ok().filter(|v| !v.is_empty()))
        })
}

/// The `ssh` command line (without the program).
///
/// # Errors
/// A bad target.
pub fn ssh_args(ctx: &SshContext<'_>, a: &Ssh) -> Result<Vec<String>, Error> {
    let remote = parse_remote(&a.target)?;
    let namespace = remote.target.namespace.as_deref().unwrap_or(ctx.namespace);
    let user = username(remote.username.as_deref(), &a.options);
    let mut args = common_args(ctx, &a.options, &remote.target)?;
    args.push(ssh_host(user.as_deref(), &remote.target, namespace));
    args.extend(a.command.iter().cloned());
    Ok(args)
}

/// The `scp` command line (without the program).
///
/// # Errors
/// Bad locations.
pub fn scp_args(ctx: &SshContext<'_>, a: &Scp) -> Result<Vec<String>, Error> {
    let transfer = parse_transfer(&a.source, &a.destination)?;
    let target = &transfer.remote.target;
    let namespace = target.namespace.as_deref().unwrap_or(ctx.namespace);
    let user = username(transfer.remote.username.as_deref(), &a.options);
    let mut args = common_args(ctx, &a.options, target)?;
    if a.recursive {
        args.push("-r".into());
    }
    if a.preserve {
        args.push("-p".into());
    }
    let remote = format!(
        "{}:{}",
        ssh_host(user.as_deref(), target, namespace),
        transfer.remote_path
    );
    if transfer.to_remote {
        args.extend([transfer.local_path, remote]);
    } else {
        args.extend([remote, transfer.local_path]);
    }
    Ok(args)
}

/// Runs `program` (`ssh` or `scp`) with `args` on this terminal; its exit status becomes
/// virtctl's.
///
/// # Errors
/// The program cannot be started (not installed), or it exits with a failure.
pub async fn exec(program: &str, args: &[String]) -> Result<(), Error> {
    let status = tokio::process::Command::new(program)
        .args(args)
        .status()
        .await
        .map_err(|e| Error::Message(format!("cannot run {program}: {e}")))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => Err(Error::Exited(code)),
        None => Err(Error::Message(format!("{program} was killed: {status}"))),
    }
}

/// Runs `program` with the arguments `args` builds for this virtctl.
async fn run_client(
    program: &str,
    ctx: &Ctx,
    kubeconfig: Option<&Path>,
    args: impl FnOnce(&SshContext<'_>) -> Result<Vec<String>, Error>,
) -> Result<(), Error> {
    let virtctl = std::env::current_exe()?;
    let context = SshContext {
        virtctl: &virtctl,
        kubeconfig,
        namespace: &ctx.namespace,
    };
    exec(program, &args(&context)?).await
}

/// `virtctl ssh`.
///
/// # Errors
/// See [`ssh_args`] and [`exec`].
pub async fn ssh(ctx: &Ctx, kubeconfig: Option<&Path>, a: &Ssh) -> Result<(), Error> {
    run_client("ssh", ctx, kubeconfig, |c| ssh_args(c, a)).await
}

/// `virtctl scp`.
///
/// # Errors
/// See [`scp_args`] and [`exec`].
pub async fn scp(ctx: &Ctx, kubeconfig: Option<&Path>, a: &Scp) -> Result<(), Error> {
    run_client("scp", ctx, kubeconfig, |c| scp_args(c, a)).await
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn parse(args: &[&str]) -> Command {
        Cli::try_parse_from([&["virtctl"], args].concat())
            .expect("parses")
            .command
    }

    fn ctx() -> SshContext<'static> {
        SshContext {
            virtctl: Path::new("/opt/kube virt/virtctl"),
            kubeconfig: Some(Path::new("/etc/kube/config")),
            namespace: "default",
        }
    }

    #[test]
    fn ssh_goes_through_port_forward_stdio_to_the_targets_port() {
        let Command::Ssh(a) = parse(&[
            "ssh",
            "root@vmi/web/prod",
            "-p",
            "2222",
            "-i",
            "/keys/id",
            "-t",
            "-o StrictHostKeyChecking=no",
            "-c",
            "uname -r",
        ]) else {
            panic!("ssh")
        };
        assert_eq!(
            ssh_args(&ctx(), &a).unwrap(),
            [
                "-o",
                "ProxyCommand='/opt/kube virt/virtctl' --kubeconfig /etc/kube/config port-forward '--stdio=true' vmi/web/prod 2222",
                "-o StrictHostKeyChecking=no",
                "-i",
                "/keys/id",
                "root@vmi.web.prod",
                "uname -r",
            ]
        );
        let Command::Ssh(a) = parse(&["ssh", "-l", "jdoe", "vm/web"]) else {
            panic!("ssh")
        };
        let args = ssh_args(&ctx(), &a).unwrap();
        assert!(args[1].ends_with("vm/web/default 22"), "{args:?}");
        assert_eq!(args.last().map(String::as_str), Some("jdoe@vm.web.default"));
    }

    #[test]
    fn scp_copies_either_way_and_refuses_two_or_no_remotes() {
        let Command::Scp(a) = parse(&["scp", "-r", "./dir", "root@vm/web:/tmp/dir"]) else {
            panic!("scp")
        };
        let args = scp_args(&ctx(), &a).unwrap();
        assert_eq!(args[2..], ["-r", "./dir", "root@vm.web.default:/tmp/dir"]);
        let Command::Scp(a) = parse(&["scp", "--preserve", "root@vmi/web/prod:a.txt", "b.txt"])
        else {
            panic!("scp")
        };
        let args = scp_args(&ctx(), &a).unwrap();
        assert_eq!(args[2..], ["-p", "root@vmi.web.prod:a.txt", "b.txt"]);
        for (from, to, want) in [
            (
                "vm/a:x",
                "vm/b:y",
                "copying from a remote location to another remote location is not supported: \"vm/a:x\" to \"vm/b:y\"",
            ),
            (
                "x",
                "y",
                "none of the two provided locations seems to be a remote location: \"x\" to \"y\"",
            ),
            ("@vm/a:x", "y", "expected username before '@'"),
            ("root@:x", "y", "expected target after '@'"),
            ("pod/a:x", "y", "unsupported resource type 'pod'"),
        ] {
            let err = parse_transfer(from, to).unwrap_err().to_string();
            assert_eq!(err, want);
        }
    }

    #[test]
    fn a_percent_in_the_path_is_not_taken_for_an_ssh_token() {
        let target = parse_target("vm/web").unwrap();
        let option =
            proxy_command(Path::new("/x%h/virtctl"), None, &target, "default", 22).unwrap();
        assert_eq!(
            option,
            "ProxyCommand='/x%%h/virtctl' port-forward '--stdio=true' vm/web/default 22"
        );
    }
}
