//! virtctl: KubeVirt's command-line client, as a library the thin `main` drives.
//!
//! Data flow: [`Cli`] (clap) → [`run`] builds a kube `Client` from `--kubeconfig` (or the
//! usual inference) → each command calls the API server: the `subresources.kubevirt.io/v1`
//! endpoints through [`client`] (start, stop, pause, …; the console and vnc websockets in
//! [`console`], the port-forward tunnels in [`portforward`], which [`ssh`] gives the system's ssh and scp), plain objects for `migrate-cancel` and [`expose`]; [`create`] only prints
//! a manifest. Output lines and flags follow upstream's virtctl.

pub mod cli;
pub mod client;
pub mod console;
pub mod create;
pub mod expose;
pub mod portforward;
pub mod ssh;
pub mod vm;
pub mod vnc;

pub use cli::{Cli, Command};

/// Why a command failed; the message is what the user sees after `Error: `.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A refused request or bad flags, already worded for the user.
    #[error("{0}")]
    Message(String),
    /// Loading the kubeconfig or building the client failed.
    #[error("cannot obtain KubeVirt client")]
    Client(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Terminal or socket I/O failed.
    #[error("I/O failed")]
    Io(#[from] std::io::Error),
    /// Encoding a manifest failed.
    #[error("encoding the manifest")]
    Encode(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The program virtctl ran (`ssh`, `scp`) exited with this status, which becomes
    /// virtctl's.
    #[error("exit status {0}")]
    Exited(i32),
}

/// Runs the parsed command line.
///
/// # Errors
/// [`Error`] with the message to print.
pub async fn run(cli: Cli) -> Result<(), Error> {
    use cli::Command as C;
    match &cli.command {
        C::Create(create) => return create::run(create),
        C::Version(v) => {
            // The client line comes first, also when no cluster can be reached (as upstream).
            println!("{}", vm::client_version());
            if v.client {
                return Ok(());
            }
        }
        _ => {}
    }
    let (client, namespace) =
        client::connect(cli.kubeconfig.as_deref(), cli.namespace.as_deref()).await?;
    let ctx = client::Ctx { client, namespace };
    match cli.command {
        C::Start(a) => vm::start(&ctx, &a).await,
        C::Stop(a) => vm::stop(&ctx, &a).await,
        C::Restart(a) => vm::restart(&ctx, &a).await,
        C::Migrate(a) => vm::migrate(&ctx, &a).await,
        C::MigrateCancel(a) => vm::migrate_cancel(&ctx, &a).await,
        C::Pause(t) => vm::pause(&ctx, &t, true).await,
        C::Unpause(t) => vm::pause(&ctx, &t, false).await,
        C::SoftReboot(a) => vm::soft_reboot(&ctx, &a).await,
        C::Freeze(a) => vm::freeze(&ctx, &a).await,
        C::Unfreeze(a) => vm::unfreeze(&ctx, &a).await,
        C::Addvolume(a) => vm::add_volume(&ctx, &a).await,
        C::Removevolume(a) => vm::remove_volume(&ctx, &a).await,
        C::Guestosinfo(a) => {
            vm::guest_agent_query(&ctx, &a, "guestosinfo", "Error getting guestosinfo").await
        }
        C::Userlist(a) => vm::guest_agent_query(&ctx, &a, "userlist", "Error listing users").await,
        C::Fslist(a) => {
            vm::guest_agent_query(&ctx, &a, "filesystemlist", "Error listing filesystems").await
        }
        C::Console(a) => console::console(&ctx, &a).await,
        C::Vnc(a) => vnc::vnc(&ctx, &a).await,
        C::Expose(a) => expose::run(&ctx, &a).await,
        C::PortForward(a) => portforward::run(&ctx, &a).await,
        C::Ssh(a) => ssh::ssh(&ctx, cli.kubeconfig.as_deref(), &a).await,
        C::Scp(a) => ssh::scp(&ctx, cli.kubeconfig.as_deref(), &a).await,
        C::Version(_) => vm::server_version(&ctx).await,
        C::Create(_) => Ok(()),
    }
}
