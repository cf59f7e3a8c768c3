//! Decode → encode round trips of representative manifests: no field may be lost or renamed.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::*;
use crate::pool::v1beta1::VirtualMachinePool;

/// Decodes `yaml` into `T`, encodes it again and asserts the JSON is unchanged; returns `T`.
fn round_trip<T: DeserializeOwned + Serialize>(yaml: &str) -> T {
    let original: Value = serde_saphyr::from_str(yaml).unwrap();
    let typed: T = serde_json::from_value(original.clone()).unwrap();
    let encoded = serde_json::to_value(&typed).unwrap();
    assert_eq!(encoded, original, "round trip changed the object");
    typed
}

const VMI: &str = r##"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: testvmi
  namespace: default
  labels: {kubevirt.io/vm: testvm}
  finalizers: [kubevirt.io/foregroundDeleteVirtualMachine]
spec:
  evictionStrategy: LiveMigrate
  startStrategy: Paused
  terminationGracePeriodSeconds: 0
  hostname: guest
  nodeSelector: {kubernetes.io/arch: amd64}
  domain:
    resources:
      requests: {memory: 128Mi, cpu: 100m}
      limits: {memory: 256Mi}
      overcommitGuestOverhead: false
    cpu: {cores: 2, sockets: 1, threads: 1, model: host-model, dedicatedCpuPlacement: false,
          features: [{name: vmx, policy: require}], numa: {guestMappingPassthrough: {}}}
    memory: {guest: 128Mi, hugepages: {pageSize: 2Mi}, reservedOverhead: {addedOverhead: 10Mi, memLock: Required}}
    machine: {type: q35}
    firmware:
      uuid: 5d307ca9-b3ef-428c-8861-06e72d69f223
      bootloader: {efi: {secureBoot: false, persistent: true}}
      kernelBoot:
        kernelArgs: console=ttyS0
        container: {image: quay.io/kernel:latest, kernelPath: /boot/vmlinuz, initrdPath: /boot/initrd, imagePullPolicy: IfNotPresent}
    clock:
      utc: {offsetSeconds: 3600}
      timer:
        hpet: {present: false}
        pit: {tickPolicy: delay}
        rtc: {tickPolicy: catchup, track: guest}
        hyperv: {present: true}
    features:
      acpi: {}
      apic: {enabled: true, endOfInterrupt: false}
      smm: {enabled: true}
      hyperv:
        relaxed: {}
        spinlocks: {spinlocks: 8191}
        synictimer: {enabled: true, direct: {enabled: true}}
        vendorid: {vendorid: KVMKVMKVM}
        tlbflush: {enabled: true, extended: {}}
    ioThreadsPolicy: supplementalPool
    ioThreads: {supplementalPoolThreadCount: 4}
    rebootPolicy: Terminate
    devices:
      networkInterfaceMultiqueue: true
      autoattachVSOCK: true
      autoattachGraphicsDevice: false
      blockMultiQueue: true
      rng: {}
      tpm: {persistent: true}
      watchdog: {name: wd, i6300esb: {action: poweroff}}
      inputs: [{name: tablet, bus: usb, type: tablet}]
      disks:
        - name: containerdisk
          disk: {bus: virtio}
          bootOrder: 1
          dedicatedIOThread: true
          cache: none
          io: native
          errorPolicy: report
          blockSize: {custom: {logical: 512, physical: 4096}}
        - name: cdrom
          cdrom: {bus: sata, readonly: true, tray: closed}
        - name: lun
          lun: {bus: scsi, reservation: true}
      interfaces:
        - name: default
          masquerade: {}
          ports: [{name: http, port: 80, protocol: TCP}]
          macAddress: "02:00:00:00:00:01"
          state: up
        - name: plugged
          binding: {name: passt}
      gpus: [{name: gpu1, deviceName: nvidia.com/GP102, virtualGPUOptions: {display: {enabled: true, ramFB: {enabled: true}}}}]
      hostDevices: [{name: hd, claimName: c, requestName: r}]
      filesystems: [{name: fs, virtiofs: {}}]
      panicDevices: [{model: pvpanic}]
  volumes:
    - name: containerdisk
      containerDisk: {image: quay.io/kubevirt/cirros-container-disk-demo:latest}
    - name: cloudinit
      cloudInitNoCloud: {userData: "#cloud-config\npassword: fedora\n", networkDataSecretRef: {name: nd}}
    - name: pvc
      persistentVolumeClaim: {claimName: disk, readOnly: true, hotpluggable: true}
    - name: dv
      dataVolume: {name: dv1}
    - name: empty
      emptyDisk: {capacity: 2Gi}
    - name: host
      hostDisk: {path: /data/disk.img, type: DiskOrCreate, capacity: 1Gi}
    - name: cm
      configMap: {name: app-config, volumeLabel: CFG}
    - name: sec
      secret: {secretName: app-secret, optional: true}
    - name: sa
      serviceAccount: {serviceAccountName: default}
    - name: downward
      downwardAPI: {fields: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}
    - name: metrics
      downwardMetrics: {}
    - name: eph
      ephemeral: {persistentVolumeClaim: {claimName: base}}
    - name: sysprep
      sysprep: {configMap: {name: unattend}}
  networks:
    - name: default
      pod: {vmNetworkCIDR: 10.0.2.0/24, vmIPv6NetworkCIDR: "fd10:0:2::/120"}
    - name: plugged
      multus: {networkName: ns/bridge-net, default: false}
  readinessProbe:
    guestAgentPing: {}
    initialDelaySeconds: 5
    periodSeconds: 10
  livenessProbe:
    httpGet: {port: 1500}
    failureThreshold: 3
  accessCredentials:
    - sshPublicKey:
        source: {secret: {secretName: my-keys}}
        propagationMethod: {qemuGuestAgent: {users: [fedora]}}
    - userPassword:
        source: {secret: {secretName: pw}}
        propagationMethod: {qemuGuestAgent: {}}
  utilityVolumes: [{name: dump, claimName: dump-pvc, type: MemoryDump}]
status:
  phase: Running
  nodeName: node01
  runtimeUser: 0
  VSOCKCID: 3
  qosClass: Burstable
  activePods: {6b1a1b2c-0000-4000-8000-000000000001: node01}
  phaseTransitionTimestamps:
    - {phase: Pending, phaseTransitionTimestamp: "2024-01-01T00:00:00Z"}
  conditions:
    - {type: Ready, status: "True", lastTransitionTime: "2024-01-01T00:00:05Z"}
    - {type: PodScheduled, status: "True"}
    - {type: SomethingNewer, status: Unknown, reason: Future}
  interfaces:
    - {name: default, ipAddress: 10.244.0.10, ipAddresses: [10.244.0.10], mac: "02:00:00:00:00:01", infoSource: "domain, guest-agent", queueCount: 2, linkState: up, podInterfaceName: eth0}
  guestOSInfo: {id: fedora, name: Fedora Linux, versionId: "39"}
  migrationState:
    migrationUid: 8d2b2a5e-0000-4000-8000-000000000002
    sourceNode: node01
    targetNode: node02
    completed: true
    mode: PreCopy
    abortStatus: Succeeded
    targetDirectMigrationNodePorts: {"49152": 0}
    targetState: {migrationUID: 8d2b2a5e-0000-4000-8000-000000000002, domainDetected: true}
  migrationMethod: LiveMigration
  migrationTransport: Unix
  volumeStatus:
    - {name: pvc, target: sdb, phase: Ready, hotplugVolume: {attachPodName: hp-volume-abc, attachPodUID: u1}, size: 1073741824}
  currentCPUTopology: {cores: 2, sockets: 1, threads: 1}
  memory: {guestAtBoot: 128Mi, guestCurrent: 128Mi}
  machine: {type: pc-q35-rhel9.4.0}
"##;

const VM: &str = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: testvm
  namespace: default
  annotations: {kubevirt.io/latest-observed-api-version: v1}
spec:
  runStrategy: RerunOnFailure
  instancetype: {name: u1.medium, kind: VirtualMachineClusterInstancetype}
  preference: {name: fedora, inferFromVolume: rootdisk, inferFromVolumeFailurePolicy: Ignore}
  updateVolumesStrategy: Migration
  dataVolumeTemplates:
    - metadata: {name: rootdisk, labels: {a: b}}
      spec:
        storage: {resources: {requests: {storage: 10Gi}}}
        source: {registry: {url: "docker://quay.io/containerdisks/fedora:latest"}}
  template:
    metadata:
      labels: {kubevirt.io/vm: testvm}
      annotations: {custom: value}
    spec:
      domain:
        devices:
          disks: [{name: rootdisk, disk: {bus: virtio}}]
        resources: {requests: {memory: 1Gi}}
      volumes: [{name: rootdisk, dataVolume: {name: rootdisk}}]
status:
  created: true
  ready: true
  printableStatus: Running
  runStrategy: RerunOnFailure
  observedGeneration: 2
  desiredGeneration: 2
  conditions:
    - {type: Ready, status: "True", lastProbeTime: "2024-01-01T00:00:00Z"}
    - {type: AgentConnected, status: "True"}
  stateChangeRequests:
    - {action: Stop, uid: 6b1a1b2c-0000-4000-8000-000000000001}
    - {action: Start, data: {paused: "true"}}
  volumeRequests:
    - addVolumeOptions: {name: hp, disk: {name: hp, disk: {bus: scsi}}, volumeSource: {persistentVolumeClaim: {claimName: hp, hotpluggable: true}}}
  startFailure: {consecutiveFailCount: 3, lastFailedVMIUID: u2, retryAfterTimestamp: "2024-01-01T00:05:00Z"}
  volumeSnapshotStatuses: [{name: rootdisk, enabled: false, reason: "No VolumeSnapshotClass"}]
  memoryDumpRequest: {claimName: dump, phase: Completed, fileName: dump.memory}
  instancetypeRef: {name: u1.medium, kind: VirtualMachineClusterInstancetype, controllerRevisionRef: {name: rev-1}}
"#;

#[test]
fn vmi_manifest_round_trips_without_losing_fields() {
    let vmi: VirtualMachineInstance = round_trip(VMI);
    let status = vmi.status.unwrap();
    assert_eq!(status.phase, Some(VirtualMachineInstancePhase::Running));
    assert_eq!(status.vsock_cid, Some(3));
    assert_eq!(
        status.conditions[2].type_,
        VirtualMachineInstanceConditionType::Other("SomethingNewer".into())
    );
    let devices = &vmi.spec.domain.devices;
    assert_eq!(devices.network_interface_multiqueue, Some(true));
    assert_eq!(devices.disks[0].kinds(), [DiskKind::Disk]);
    assert_eq!(
        devices.interfaces[0].binding_method.set_methods(),
        ["masquerade"]
    );
    assert_eq!(
        vmi.spec.volumes[0].volume_source.set_sources(),
        ["containerDisk"]
    );
    assert!(vmi.spec.volumes[2].volume_source.is_hotpluggable());
}

#[test]
fn runtime_user_zero_is_always_serialised() {
    let status = VirtualMachineInstanceStatus::default();
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json, serde_json::json!({"runtimeUser": 0}));
}

#[test]
fn vm_manifest_round_trips_without_losing_fields() {
    let vm: VirtualMachine = round_trip(VM);
    assert_eq!(vm.run_strategy(), Ok(RunStrategy::RerunOnFailure));
    let status = vm.status.unwrap();
    assert_eq!(status.printable_status, Some(PrintableStatus::Running));
    assert_eq!(
        status.state_change_requests[1].action,
        StateChangeRequestAction::Start
    );
    assert_eq!(
        status.start_failure.unwrap().last_failed_vmi_uid.as_deref(),
        Some("u2")
    );
}

#[test]
fn migration_replica_set_kubevirt_and_pool_round_trip() {
    let vmim: VirtualMachineInstanceMigration = round_trip(
        r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstanceMigration
metadata: {name: mig, namespace: default}
spec: {vmiName: testvmi, addedNodeSelector: {zone: a}, priority: user-triggered}
status:
  phase: Succeeded
  conditions: [{type: migrationAbortRequested, status: "False"}]
  migrationState: {migrationUid: u3, completed: true}
"#,
    );
    assert!(vmim.status.unwrap().phase.unwrap().is_final());
    let _: VirtualMachineInstanceReplicaSet = round_trip(
        r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstanceReplicaSet
metadata: {name: rs}
spec:
  replicas: 2
  selector: {matchLabels: {app: x}}
  template: {metadata: {labels: {app: x}}, spec: {domain: {devices: {}}}}
status: {replicas: 2, readyReplicas: 1, labelSelector: app=x, conditions: [{type: ReplicaPaused, status: "True"}]}
"#,
    );
    let kv: KubeVirt = round_trip(
        r#"
apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {name: kubevirt, namespace: kubevirt}
spec:
  imagePullPolicy: IfNotPresent
  workloadUpdateStrategy: {workloadUpdateMethods: [LiveMigrate], batchEvictionSize: 10}
  certificateRotateStrategy: {selfSigned: {ca: {duration: 168h}, server: {duration: 24h}}}
  configuration:
    developerConfiguration: {featureGates: [Snapshot, ExpandDisks], useEmulation: true}
    migrations: {parallelMigrationsPerCluster: 5, bandwidthPerMigration: 64Mi}
    network: {defaultNetworkInterface: bridge, binding: {passt: {sidecarImage: passt:latest}}}
    permittedHostDevices: {pciHostDevices: [{pciVendorSelector: "10DE:1EB8", resourceName: nvidia.com/TU104GL}]}
    liveUpdateConfiguration: {maxHotplugRatio: 4}
    vmRolloutStrategy: LiveUpdate
  customizeComponents:
    patches: [{resourceName: virt-api, resourceType: Deployment, patch: "{}", type: strategic}]
    flags: {api: {v: "4"}, handler: {v: "2"}}
status: {phase: Deployed, conditions: [{type: Available, status: "True"}]}
"#,
    );
    assert!(
        kv.spec
            .configuration
            .as_ref()
            .unwrap()
            .feature_gate_enabled("Snapshot")
    );
    let _: VirtualMachinePool = round_trip(
        r#"
apiVersion: pool.kubevirt.io/v1beta1
kind: VirtualMachinePool
metadata: {name: pool}
spec:
  replicas: 3
  selector: {matchLabels: {pool: p}}
  maxUnavailable: 25%
  scaleInStrategy: {proactive: {selectionPolicy: {sortPolicy: Newest}, statePreservation: Offline}}
  virtualMachineTemplate:
    metadata: {labels: {pool: p}}
    spec:
      runStrategy: Always
      template: {spec: {domain: {devices: {}}}}
status: {replicas: 3, readyReplicas: 3, labelSelector: pool=p}
"#,
    );
}

#[test]
fn phase_helpers_follow_upstream() {
    assert!(VirtualMachineInstancePhase::Failed.is_final());
    assert!(VirtualMachineInstancePhase::Succeeded.is_final());
    assert!(!VirtualMachineInstancePhase::Running.is_final());
    assert!(VirtualMachineInstancePhase::Unset.is_unprocessed());
    assert!(VirtualMachineInstancePhase::Pending.is_unprocessed());
    assert!(!VirtualMachineInstancePhase::Scheduling.is_unprocessed());
}
