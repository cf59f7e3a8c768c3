//! Names KubeVirt writes on objects: API groups, labels, annotations and finalizers.
//!
//! Values are the upstream strings; controllers, webhooks and the CLI import them from here so
//! a manifest or a `kubectl get -l` written for KubeVirt keeps working.

// ----- API groups and versions -----

/// The core API group.
pub const GROUP: &str = "kubevirt.io";
/// The latest and storage version of the core group.
pub const VERSION: &str = "v1";
/// `apiVersion` of core objects.
pub const API_VERSION: &str = "kubevirt.io/v1";
/// The deprecated version still served upstream.
pub const DEPRECATED_VERSION_V1ALPHA3: &str = "v1alpha3";
/// The aggregated subresource API group served by virt-api.
pub const SUBRESOURCE_GROUP: &str = "subresources.kubevirt.io";
/// The pool API group.
pub const POOL_GROUP: &str = "pool.kubevirt.io";
/// `apiVersion` of pools.
pub const POOL_API_VERSION: &str = "pool.kubevirt.io/v1beta1";

// ----- Labels -----

/// Component label (`kubevirt.io=virt-launcher`, `=hotplug-disk`, …); also on every CRD.
pub const APP_LABEL: &str = "kubevirt.io";
/// Label on CRDs of the operator (`KubeVirt`).
pub const OPERATOR_LABEL: &str = "operator.kubevirt.io";
/// Value of [`APP_LABEL`] on launcher pods.
pub const VIRT_LAUNCHER_VALUE: &str = "virt-launcher";
/// `kubevirt.io` label value of virt-handler pods and of their DaemonSet.
pub const VIRT_HANDLER_VALUE: &str = "virt-handler";
/// Value of [`APP_LABEL`] on hotplug attachment pods.
pub const HOTPLUG_DISK_VALUE: &str = "hotplug-disk";
/// The emptyDir of a hotplug attachment pod; it holds [`HOTPLUG_ATTACHMENT_SOCKET`], and the
/// claims are mounted below it.
pub const HOTPLUG_ATTACHMENT_VOLUME: &str = "hotplug-disks";
/// Where an attachment pod mounts [`HOTPLUG_ATTACHMENT_VOLUME`]; each claim is at
/// `<dir>/<volume>` (upstream's path).
pub const HOTPLUG_ATTACHMENT_DIR: &str = "/path";
/// The socket the attachment pod's container listens on, in [`HOTPLUG_ATTACHMENT_DIR`]:
/// virt-handler learns the container's pid from it.
pub const HOTPLUG_ATTACHMENT_SOCKET: &str = "hp.sock";
/// Launcher pod label: UID of the VMI that created it.
pub const CREATED_BY_LABEL: &str = "kubevirt.io/created-by";
/// Deprecated launcher pod label: the guest hostname (at most 63 characters).
pub const DEPRECATED_VM_NAME_LABEL: &str = "vm.kubevirt.io/name";
/// Launcher pod label: the VMI name, shortened with a hash when longer than 63 characters.
pub const VMI_ID_LABEL: &str = "vmi.kubevirt.io/id";

/// The [`VMI_ID_LABEL`] value of VMI `name` (upstream's `CalculateVirtualMachineInstanceID`):
/// the name, or when longer than 63 characters its first 54 characters, `-` and the first 8
/// hex digits of its SHA-1.
pub fn vmi_id_label(name: &str) -> String {
    use sha1::{Digest, Sha1};
    if name.len() <= 63 {
        return name.to_owned();
    }
    let digest = Sha1::digest(name.as_bytes());
    let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    let head: String = name.chars().take(54).collect();
    format!("{head}-{hex}")
}
/// VMI label: node the VMI is scheduled to.
pub const NODE_NAME_LABEL: &str = "kubevirt.io/nodeName";
/// Migration target pod label: UID of the migration.
pub const MIGRATION_JOB_LABEL: &str = "kubevirt.io/migrationJobUID";
/// Label with the migration name.
pub const MIGRATION_NAME_LABEL: &str = "kubevirt.io/migrationName";
/// VMI label: node a migration targets.
pub const MIGRATION_TARGET_NODE_NAME_LABEL: &str = "kubevirt.io/migrationTargetNodeName";
/// Migration label: name of the VMI being migrated.
pub const MIGRATION_SELECTOR_LABEL: &str = "kubevirt.io/vmi-name";
/// Node label: whether the node accepts VMIs.
pub const NODE_SCHEDULABLE_LABEL: &str = "kubevirt.io/schedulable";
/// Node label prefix (`true`): a CPU feature the node's host CPU has (upstream's
/// `CPUFeatureLabel`).
pub const CPU_FEATURE_LABEL_PREFIX: &str = "cpu-feature.node.kubevirt.io/";
/// Node label prefix (`true`): a named CPU model the node can run (upstream's
/// `CPUModelLabel`).
pub const CPU_MODEL_LABEL_PREFIX: &str = "cpu-model.node.kubevirt.io/";
/// The DNS name in virt-handler's serving certificate (Secret
/// `kubevirt-virt-handler-server-certs`): virt-api and the source of a migration verify the
/// handler by it, since they reach the handler by its pod address, which the certificate does
/// not hold.
pub const HANDLER_SERVER_NAME: &str = "virt-handler";
/// The launcher image's programs, as a launcher pod's containers and probes name them: one
/// small binary under three names (`virt-launcher`, as upstream's image holds one per program).
/// The `compute` container's program.
pub const LAUNCHER_PROGRAM: &str = "virt-launcher";
/// The `guest-console-log` container's program, which streams the serial log.
pub const CONSOLE_TAIL_PROGRAM: &str = "virt-tail";
/// The program of a VMI's `exec` and `guestAgentPing` probes, run in `compute`.
pub const PROBE_PROGRAM: &str = "virt-probe";
/// The launcher image's programs.
pub const LAUNCHER_PROGRAMS: [&str; 3] = [LAUNCHER_PROGRAM, CONSOLE_TAIL_PROGRAM, PROBE_PROGRAM];
/// VMI label: the launcher image is outdated.
pub const OUTDATED_LAUNCHER_IMAGE_LABEL: &str = "kubevirt.io/outdatedLauncherImage";
/// Label of install strategy objects.
pub const INSTALL_STRATEGY_LABEL: &str = "kubevirt.io/install-strategy";
/// Conventional label tying objects to a VM (used in examples).
pub const VM_LABEL: &str = "kubevirt.io/vm";
/// Label with the pool revision name, on pool VMs, their template and VMIs.
pub const VM_POOL_REVISION_NAME_LABEL: &str = "kubevirt.io/vm-pool-revision-name";
/// VMI label: memory hotplug overhead ratio.
pub const MEMORY_HOTPLUG_OVERHEAD_RATIO_LABEL: &str = "kubevirt.io/memory-hotplug-overhead-ratio";
/// VMI label: the launcher pod gets CPU limits.
pub const VMI_POD_CPU_LIMITS_LABEL: &str = "kubevirt.io/vmi-pod-cpu-resource-limits";
/// VMI label: the launcher pod's memory requests.
pub const VMI_POD_MEMORY_REQUESTS_LABEL: &str = "kubevirt.io/vmi-pod-memory-resource-requests";
/// Node label: the node supports realtime.
pub const REALTIME_LABEL: &str = "kubevirt.io/realtime";
/// VMI annotation and pod label copied for Istio sidecar injection.
pub const ISTIO_INJECT_ANNOTATION: &str = "sidecar.istio.io/inject";

/// VMI labels users may not set or change; only KubeVirt service accounts may.
pub const RESTRICTED_VMI_LABELS: &[&str] = &[
    CREATED_BY_LABEL,
    MIGRATION_JOB_LABEL,
    NODE_NAME_LABEL,
    MIGRATION_TARGET_NODE_NAME_LABEL,
    NODE_SCHEDULABLE_LABEL,
    INSTALL_STRATEGY_LABEL,
];

// ----- Annotations -----

/// Launcher pod annotation: the domain (VMI) name.
pub const DOMAIN_ANNOTATION: &str = "kubevirt.io/domain";
/// Annotation: the latest API version the controller observed.
pub const LATEST_OBSERVED_API_VERSION_ANNOTATION: &str = "kubevirt.io/latest-observed-api-version";
/// Annotation: the storage API version the controller observed.
pub const STORAGE_OBSERVED_API_VERSION_ANNOTATION: &str =
    "kubevirt.io/storage-observed-api-version";
/// VMI annotation: generation of the VM it was created from.
pub const VM_GENERATION_ANNOTATION: &str = "kubevirt.io/vm-generation";
/// VMI annotation: PCI topology version (`v3`).
pub const PCI_TOPOLOGY_VERSION_ANNOTATION: &str = "kubevirt.io/pci-topology-version";
/// Current value of [`PCI_TOPOLOGY_VERSION_ANNOTATION`].
pub const PCI_TOPOLOGY_VERSION_V3: &str = "v3";
/// VMI annotation: create a migration target (WaitAsReceiver).
pub const CREATE_MIGRATION_TARGET_ANNOTATION: &str = "kubevirt.io/create-migration-target";
/// VMI annotation (functional tests): the launcher crashes at once (`--simulate-crash`), to
/// exercise crash loops. Its presence counts, whatever the value.
pub const FUNC_TEST_LAUNCHER_FAIL_FAST_ANNOTATION: &str =
    "kubevirt.io/func-test-virt-launcher-fail-fast";
/// VMI annotation prefix (debugging): keep the launcher container alive after a failure
/// (`--keep-after-failure`) when the value is empty or starts with `true`.
pub const KEEP_LAUNCHER_AFTER_FAILURE_ANNOTATION: &str =
    "kubevirt.io/keep-launcher-alive-after-failure";
/// Launcher pod annotation: migrations use unix sockets.
pub const MIGRATION_TRANSPORT_UNIX_ANNOTATION: &str = "kubevirt.io/migrationTransportUnix";
/// Migration target pod annotation: name of the migration.
pub const MIGRATION_JOB_NAME_ANNOTATION: &str = "kubevirt.io/migrationJobName";
/// Migration target pod annotation: when the target became ready.
pub const MIGRATION_TARGET_READY_TIMESTAMP_ANNOTATION: &str =
    "kubevirt.io/migration-target-ready-timestamp";
/// Hotplug attachment pod annotation: owning VMI name.
pub const OWNER_VMI_NAME_ANNOTATION: &str = "kubevirt.io/owner-vmi-name";
/// Hotplug attachment pod annotation: owning VMI UID.
pub const OWNER_VMI_UID_ANNOTATION: &str = "kubevirt.io/owner-vmi-uid";
/// Temporary provisioning pod annotation.
pub const EPHEMERAL_PROVISIONING_ANNOTATION: &str = "kubevirt.io/ephemeral-provisioning";
/// Launcher pod annotation: memory overhead in bytes.
pub const MEMORY_OVERHEAD_BYTES_ANNOTATION: &str = "kubevirt.io/memory-overhead-bytes";
/// Node annotation: last virt-handler heartbeat.
pub const HEARTBEAT_ANNOTATION: &str = "kubevirt.io/heartbeat";
/// VM annotation: create DataVolumes before the VM starts.
pub const IMMEDIATE_DATA_VOLUME_CREATION_ANNOTATION: &str =
    "kubevirt.io/immediate-data-volume-creation";
/// VM annotation: run strategy to restore after a restore.
pub const RESTORE_RUN_STRATEGY_ANNOTATION: &str = "kubevirt.io/restore-run-strategy";
/// Migration annotation: created by an evacuation.
pub const EVACUATION_MIGRATION_ANNOTATION: &str = "kubevirt.io/evacuationMigration";
/// Migration annotation: created by a workload update.
pub const WORKLOAD_UPDATE_MIGRATION_ANNOTATION: &str = "kubevirt.io/workloadUpdateMigration";
/// VMI or KubeVirt annotation: skip the velero backup hooks.
pub const SKIP_BACKUP_HOOKS_ANNOTATION: &str = "kubevirt.io/skip-backup-hooks";
/// Pod annotation: the default container.
pub const DEFAULT_CONTAINER_ANNOTATION: &str = "kubectl.kubernetes.io/default-container";
/// Pod annotation: the descheduler may only request eviction.
pub const DESCHEDULER_REQUEST_EVICT_ONLY_ANNOTATION: &str =
    "descheduler.alpha.kubernetes.io/request-evict-only";
/// Pod annotation: Multus secondary networks.
pub const MULTUS_NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";
/// Pod annotation: Multus default network.
pub const MULTUS_DEFAULT_NETWORK_ANNOTATION: &str = "v1.multus-cni.io/default-network";
/// Pod annotation: interfaces Istio should leave alone.
pub const ISTIO_KUBEVIRT_INTERFACES_ANNOTATION: &str =
    "traffic.sidecar.istio.io/kubevirtInterfaces";
/// Pod annotation: interfaces Istio reroutes.
pub const ISTIO_REROUTE_VIRTUAL_INTERFACES_ANNOTATION: &str = "istio.io/reroute-virtual-interfaces";
/// Velero pre-backup hook container.
pub const VELERO_PRE_BACKUP_HOOK_CONTAINER_ANNOTATION: &str = "pre.hook.backup.velero.io/container";
/// Velero pre-backup hook command.
pub const VELERO_PRE_BACKUP_HOOK_COMMAND_ANNOTATION: &str = "pre.hook.backup.velero.io/command";
/// Velero pre-backup hook timeout.
pub const VELERO_PRE_BACKUP_HOOK_TIMEOUT_ANNOTATION: &str = "pre.hook.backup.velero.io/timeout";
/// Velero post-backup hook container.
pub const VELERO_POST_BACKUP_HOOK_CONTAINER_ANNOTATION: &str =
    "post.hook.backup.velero.io/container";
/// Velero post-backup hook command.
pub const VELERO_POST_BACKUP_HOOK_COMMAND_ANNOTATION: &str = "post.hook.backup.velero.io/command";
/// Annotation prefixes not copied from the VMI to the launcher pod (besides the two observed API
/// version annotations).
pub const KUBECTL_ANNOTATION_PREFIX: &str = "kubectl.kubernetes.io";

// ----- Finalizers -----

/// Finalizer the mutating webhook puts on VMIs.
pub const VMI_FINALIZER: &str = "kubevirt.io/foregroundDeleteVirtualMachine";
/// Old form of [`VMI_FINALIZER`], migrated on sight.
pub const DEPRECATED_VMI_FINALIZER: &str = "foregroundDeleteVirtualMachine";
/// Finalizer the VM controller puts on VMs and their VMIs.
pub const VM_CONTROLLER_FINALIZER: &str = "kubevirt.io/virtualMachineControllerFinalize";
/// Finalizer the mutating webhook puts on migrations.
pub const MIGRATION_FINALIZER: &str = "kubevirt.io/migrationJobFinalize";
/// Finalizer of the operator.
pub const VIRT_OPERATOR_FINALIZER: &str = "kubevirt.io/virtOperatorFinalizer";

// ----- Launcher pods -----

/// Name of the main container of the launcher pod (always the first container).
pub const COMPUTE_CONTAINER_NAME: &str = "compute";
/// Readiness gate of launcher pods, true while the guest is not paused.
pub const VIRTUAL_MACHINE_UNPAUSED_READINESS_GATE: &str = "kubevirt.io/virtual-machine-unpaused";
/// Taint key that triggers evacuation of a node.
pub const NODE_DRAIN_TAINT_KEY: &str = "kubevirt.io/drain";

/// The launcher pod's emptyDir volume that holds the launcher's sockets, disks and logs
/// (upstream's `public` volume at `/var/run/kubevirt`).
pub const LAUNCHER_VOLUME: &str = "public";
/// Where the launcher pod's containers see [`LAUNCHER_VOLUME`].
pub const LAUNCHER_DIR: &str = "/var/run/kubevirt";
/// Where the compute container sees each claim-backed volume, under the volume's name (as
/// upstream: a filesystem claim holds the disk as `disk.img`).
pub const VMI_DISKS_DIR: &str = "/var/run/kubevirt-private/vmi-disks";
/// Where a launcher pod mounts a `configMap` volume of the VMI, `<dir>/<volume>` (upstream's).
pub const CONFIG_MAP_DISKS_SOURCE_DIR: &str = "/var/run/kubevirt-private/config-map";
/// Where a launcher pod mounts a `secret` volume of the VMI, `<dir>/<volume>` (upstream's).
pub const SECRET_DISKS_SOURCE_DIR: &str = "/var/run/kubevirt-private/secret";
/// Where a launcher pod mounts the token, CA and namespace of a `serviceAccount` volume of the
/// VMI, `<dir>/<volume>` (upstream reads the automounted token's directory instead).
pub const SERVICE_ACCOUNT_DISK_SOURCE_DIR: &str = "/var/run/kubevirt-private/service-account";
/// Where a launcher pod mounts a `downwardAPI` volume of the VMI, `<dir>/<volume>` (upstream's).
pub const DOWNWARD_API_DISKS_SOURCE_DIR: &str = "/var/run/kubevirt-private/downwardapi";
