//! The command line: upstream virtctl's commands and flags, as clap derive structs.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// virtctl controls virtual machine related operations on your kubernetes cluster.
#[derive(Parser, Debug)]
#[command(name = "virtctl", version)]
pub struct Cli {
    /// Path to the kubeconfig file to use for CLI requests.
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// If present, the namespace scope for this CLI request.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Start a virtual machine.
    Start(Start),
    /// Stop a virtual machine.
    Stop(Stop),
    /// Restart a virtual machine.
    Restart(Stop),
    /// Migrate a virtual machine.
    Migrate(Named),
    /// Cancel migration of a virtual machine.
    MigrateCancel(Named),
    /// Pause a virtual machine (vm|vmi NAME).
    #[command(subcommand)]
    Pause(PauseTarget),
    /// Unpause a virtual machine (vm|vmi NAME).
    #[command(subcommand)]
    Unpause(PauseTarget),
    /// Soft reboot a virtual machine instance.
    SoftReboot(Named),
    /// Freeze the filesystems of a virtual machine instance through its guest agent
    /// (kubevirt-rs; upstream offers the subresource without a command).
    Freeze(Freeze),
    /// Thaw the filesystems of a virtual machine instance frozen with `freeze`.
    Unfreeze(Named),
    /// Add a volume to a running VM.
    Addvolume(AddVolume),
    /// Remove a volume from a running VM.
    Removevolume(RemoveVolume),
    /// Return guest agent info about the operating system.
    Guestosinfo(Named),
    /// Return full list of logged in users on the guest machine.
    Userlist(Named),
    /// Return full list of filesystems available on the guest machine.
    Fslist(Named),
    /// Connect to a console of a virtual machine instance.
    Console(Console),
    /// Open a VNC connection to a virtual machine instance.
    Vnc(Vnc),
    /// Expose a virtual machine instance, virtual machine, or virtual machine instance
    /// replica set as a new service.
    Expose(Expose),
    /// Forward local ports to a virtualmachine or virtualmachineinstance.
    PortForward(PortForward),
    /// Open a SSH connection to a virtual machine instance.
    Ssh(Ssh),
    /// SCP files from/to a virtual machine instance.
    Scp(Scp),
    /// Create a manifest for the specified Kind.
    #[command(subcommand)]
    Create(Create),
    /// Print the client and server version information.
    Version(Version),
}

/// A command taking one VM/VMI name.
#[derive(Args, Debug)]
pub struct Named {
    /// Name of the virtual machine (instance).
    pub name: String,
    /// --dry-run=false: Flag used to set whether to perform a dry run or not. If true the
    /// command will be executed without performing any changes.
    #[arg(long)]
    pub dry_run: bool,
}

/// `freeze`.
#[derive(Args, Debug)]
pub struct Freeze {
    /// Name of the virtual machine instance.
    pub name: String,
    /// Thaw by itself after this long (a Go duration) unless `unfreeze` comes first.
    #[arg(long, default_value = "5m")]
    pub unfreeze_timeout: String,
}

/// `start`.
#[derive(Args, Debug)]
pub struct Start {
    /// Name of the virtual machine.
    pub name: String,
    /// --paused=false: If set to true, start virtual machine in paused state.
    #[arg(long)]
    pub paused: bool,
    /// --dry-run=false: perform a dry run without changing anything.
    #[arg(long)]
    pub dry_run: bool,
}

/// `stop` and `restart`.
#[derive(Args, Debug)]
pub struct Stop {
    /// Name of the virtual machine.
    pub name: String,
    /// --grace-period=-1: Period of time in seconds given to the VMI to terminate
    /// gracefully. Can only be set to 0 when --force is true (force deletion).
    #[arg(long, allow_negative_numbers = true)]
    pub grace_period: Option<i64>,
    /// --force=false: Only used when grace-period=0. If true, immediately remove VMI pod
    /// from API and bypass graceful deletion.
    #[arg(long)]
    pub force: bool,
    /// --dry-run=false: perform a dry run without changing anything.
    #[arg(long)]
    pub dry_run: bool,
}

/// `pause`/`unpause` targets.
#[derive(Subcommand, Debug)]
pub enum PauseTarget {
    /// The VMI of a virtual machine.
    Vm(Named),
    /// A virtual machine instance.
    Vmi(Named),
}

/// `addvolume`.
#[derive(Args, Debug)]
pub struct AddVolume {
    /// Name of the VM (or VMI).
    pub name: String,
    /// name used in volumes section of spec (the PVC to attach).
    #[arg(long, required = true)]
    pub volume_name: String,
    /// serial number you want to assign to the disk.
    #[arg(long)]
    pub serial: Option<String>,
    /// specifies disk type to be hotplugged (disk/lun). Disk by default.
    #[arg(long, default_value = "disk")]
    pub disk_type: String,
    /// Specifies the bus type (scsi by default).
    #[arg(long, default_value = "scsi")]
    pub bus: String,
    /// if set, the added volume will be persisted in the VM spec (if it exists).
    #[arg(long)]
    pub persist: bool,
    /// --dry-run=false: perform a dry run without changing anything.
    #[arg(long)]
    pub dry_run: bool,
}

/// `removevolume`.
#[derive(Args, Debug)]
pub struct RemoveVolume {
    /// Name of the VM (or VMI).
    pub name: String,
    /// name used in volumes section of spec.
    #[arg(long, required = true)]
    pub volume_name: String,
    /// if set, the volume will be removed from the VM spec (if it exists).
    #[arg(long)]
    pub persist: bool,
    /// --dry-run=false: perform a dry run without changing anything.
    #[arg(long)]
    pub dry_run: bool,
}

/// `console`.
#[derive(Args, Debug)]
pub struct Console {
    /// Name of the virtual machine instance.
    pub name: String,
    /// The number of minutes to wait for the virtual machine instance to be ready.
    #[arg(long, default_value_t = 5)]
    pub timeout: u64,
}

/// `vnc`.
#[derive(Args, Debug)]
pub struct Vnc {
    /// Name of the virtual machine instance.
    pub name: String,
    /// Only start a proxy; print its port as JSON (`{"port":N}`) and wait for a viewer.
    #[arg(long)]
    pub proxy_only: bool,
    /// Local port of the proxy (0: any free port).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Local address of the proxy (with --proxy-only; a viewer always uses 127.0.0.1).
    #[arg(long, default_value = "127.0.0.1")]
    pub address: String,
    /// Type of VNC viewer to start: tiger or remote-viewer (default: the first found).
    #[arg(long)]
    pub vnc_type: Option<String>,
    /// Path of the VNC viewer to start (default: looked up in $PATH).
    #[arg(long)]
    pub vnc_path: Option<String>,
}

/// `expose`.
#[derive(Args, Debug)]
pub struct Expose {
    /// vmi | vm | vmirs (case insensitive, singular or plural, long or short form).
    #[arg(value_name = "TYPE")]
    pub kind: String,
    /// Name of the resource to expose.
    pub resource: String,
    /// Name of the service created for the exposure of the VM.
    #[arg(long, required = true)]
    pub name: String,
    /// The port that the service should serve on (default: the ports of the interfaces
    /// on the pod network).
    #[arg(long)]
    pub port: Option<i32>,
    /// Name or number for the port on the VM that the service should direct traffic to.
    #[arg(long)]
    pub target_port: Option<String>,
    /// The network protocol for the service to be created.
    #[arg(long, default_value = "TCP")]
    pub protocol: String,
    /// Type for this service: ClusterIP, NodePort, or LoadBalancer.
    #[arg(long = "type", default_value = "ClusterIP")]
    pub service_type: String,
    /// Port used to expose the service on each node in a cluster.
    #[arg(long)]
    pub node_port: Option<i32>,
    /// ClusterIP to be assigned to the service ('None' for a headless service).
    #[arg(long)]
    pub cluster_ip: Option<String>,
    /// Additional external IP address (not managed by the cluster) to accept for the service.
    #[arg(long)]
    pub external_ip: Option<String>,
    /// IP to assign to the Load Balancer.
    #[arg(long)]
    pub load_balancer_ip: Option<String>,
    /// Name of the port.
    #[arg(long)]
    pub port_name: Option<String>,
}

/// `port-forward`.
#[derive(Args, Debug)]
pub struct PortForward {
    /// type/name[/namespace]: vm or vmi (singular or plural, long or short form).
    #[arg(value_name = "TYPE/NAME[/NAMESPACE]")]
    pub target: String,
    /// [protocol/]localPort[:targetPort]...
    #[arg(value_name = "PORT", required = true)]
    pub ports: Vec<String>,
    /// Forward the tunnel to stdout/stdin (a single port only).
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub stdio: bool,
    /// The address the local ports are opened on.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: String,
}

/// The options `ssh` and `scp` share (upstream's).
#[derive(Args, Debug)]
pub struct SshOptions {
    /// --username=jdoe: the user to open the SSH connection as; unset, the user of the
    /// environment (`USER`, `USERNAME`, `LOGNAME`) or ssh's default applies.
    #[arg(short = 'l', long)]
    pub username: Option<String>,
    /// --identity-file=~/.ssh/id_rsa: a private key to authenticate with; unset, ssh's own
    /// defaults and agent apply.
    #[arg(short = 'i', long)]
    pub identity_file: Option<PathBuf>,
    /// --known-hosts: accepted for upstream's command lines; the system ssh keeps its own
    /// known hosts (pass `-t "-o UserKnownHostsFile=…"`).
    #[arg(long)]
    pub known_hosts: Option<PathBuf>,
    /// --port=22: the port on the VM to send SSH traffic to.
    #[arg(short = 'p', long, default_value_t = 22)]
    pub port: u16,
    /// --local-ssh-opts="-o StrictHostKeyChecking=no": additional options for the local ssh
    /// client (repeatable).
    #[arg(short = 't', long, allow_hyphen_values = true)]
    pub local_ssh_opts: Vec<String>,
}

/// `ssh`.
#[derive(Args, Debug)]
pub struct Ssh {
    /// [username@]type/name[/namespace]: vm or vmi.
    #[arg(value_name = "[USER@]TYPE/NAME[/NAMESPACE]")]
    pub target: String,
    /// The shared options.
    #[command(flatten)]
    pub options: SshOptions,
    /// --command='ls /': a command to execute in the VM.
    #[arg(short = 'c', long)]
    pub command: Option<String>,
}

/// `scp`.
#[derive(Args, Debug)]
pub struct Scp {
    /// A local path, or [username@]type/name[/namespace]:path.
    pub source: String,
    /// A local path, or [username@]type/name[/namespace]:path.
    pub destination: String,
    /// The shared options.
    #[command(flatten)]
    pub options: SshOptions,
    /// Recursively copy entire directories.
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// Preserves modification times, access times, and modes from the original file.
    #[arg(long)]
    pub preserve: bool,
}

/// `create` kinds.
#[derive(Subcommand, Debug)]
pub enum Create {
    /// Create a VirtualMachine manifest.
    Vm(CreateVm),
}

/// `create vm`.
#[derive(Args, Debug, Default)]
pub struct CreateVm {
    /// Specify the name of the VM.
    #[arg(long)]
    pub name: Option<String>,
    /// Specify the RunStrategy of the VM.
    #[arg(long, default_value = "Always")]
    pub run_strategy: String,
    /// Specify the termination grace period of the VM.
    #[arg(long, default_value_t = 180)]
    pub termination_grace_period: i64,
    /// Specify the Instance Type of the VM ([kind/]name).
    #[arg(long)]
    pub instancetype: Option<String>,
    /// Specify the Preference of the VM ([kind/]name).
    #[arg(long)]
    pub preference: Option<String>,
    /// Specify the memory of the VM (512Mi when no instance type is given).
    #[arg(long)]
    pub memory: Option<String>,
    /// A containerdisk volume: `src:IMAGE[,name:NAME][,bootorder:N]` (repeatable).
    #[arg(long)]
    pub volume_containerdisk: Vec<String>,
    /// A PVC volume: `src:PVC[,name:NAME][,bootorder:N]` (repeatable).
    #[arg(long)]
    pub volume_pvc: Vec<String>,
    /// Base64 encoded cloud-init user data.
    #[arg(long)]
    pub cloud_init_user_data: Option<String>,
    /// The user created by cloud-init (`#cloud-config` user data).
    #[arg(long)]
    pub user: Option<String>,
}

/// `version`.
#[derive(Args, Debug)]
pub struct Version {
    /// Client version only (no server required).
    #[arg(short = 'c', long)]
    pub client: bool,
}
