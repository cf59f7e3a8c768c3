//! Tests of the whole decoder: bodies captured from real `kubectl create` (under
//! `testdata/`, each `NAME.pb` with the JSON it must decode to in `NAME.json`), bodies built
//! with a small encoder, and malformed or mutated bodies that must fail without panicking.

use super::*;

use serde_json::json;

macro_rules! fixtures {
    ($($name:literal),* $(,)?) => {
        &[$((
            $name,
            include_bytes!(concat!("testdata/", $name, ".pb")),
            include_str!(concat!("testdata/", $name, ".json")),
        )),*]
    };
}

/// Captured from kubectl v1.32 `create …` (and `create token`, `auth whoami`) against a
/// recording server.
const FIXTURES: &[(&str, &[u8], &str)] = fixtures![
    "clusterrole",
    "clusterrole_agg",
    "clusterrolebinding",
    "configmap",
    "cronjob",
    "deployment",
    "deployment_zero",
    "expose_fake",
    "externalname",
    "ingress",
    "job",
    "namespace",
    "pdb",
    "pdb_int",
    "priorityclass",
    "quota",
    "role",
    "rolebinding",
    "secret",
    "secret_tls_docker",
    "selfsubjectreview",
    "service",
    "service_nodeport",
    "serviceaccount",
    "tokenrequest",
    "tokenrequest_bound",
];

/// Prints the decoding of every fixture (used to review new golden files).
#[test]
#[ignore = "prints fixtures for review"]
fn print_fixtures() {
    for (name, body, _) in FIXTURES {
        let json = decode_to_json(body).expect("decodes");
        println!("== {name}\n{}", serde_json::to_string(&json).expect("json"));
    }
}

#[test]
fn captured_kubectl_bodies_decode_to_the_expected_json() {
    for (name, body, expected) in FIXTURES {
        let expected: Json = serde_json::from_str(expected).expect("fixture JSON");
        let got = decode_to_json(body).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn captured_namespace_decodes_with_type_meta_first() {
    let body = FIXTURES
        .iter()
        .find(|f| f.0 == "namespace")
        .expect("fixture")
        .1;
    let got = decode_to_json(body).expect("decodes");
    let keys: Vec<&String> = got.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["apiVersion", "kind", "metadata", "spec", "status"]);
    assert_eq!(got["metadata"], json!({"name": "demo"}));
}

#[test]
fn secret_data_is_base64_and_replicas_zero_is_kept() {
    let find = |n: &str| FIXTURES.iter().find(|f| f.0 == n).expect("fixture").1;
    let secret = decode_to_json(find("secret")).expect("secret");
    assert_eq!(
        secret["data"],
        json!({"pass": "czNjcjp0", "user": "YWRtaW4="})
    );
    let zero = decode_to_json(find("deployment_zero")).expect("deployment");
    assert_eq!(zero["spec"]["replicas"], json!(0));
}

/// A tiny protobuf encoder for building test bodies.
#[derive(Default, Clone)]
struct Enc(Vec<u8>);

impl Enc {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    fn tag(&mut self, n: u32, wire: u8) {
        self.varint(u64::from(n) << 3 | u64::from(wire));
    }
    fn int(mut self, n: u32, v: i64) -> Self {
        self.tag(n, 0);
        self.varint(v as u64);
        self
    }
    fn bytes(mut self, n: u32, b: &[u8]) -> Self {
        self.tag(n, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }
    fn str(self, n: u32, s: &str) -> Self {
        self.bytes(n, s.as_bytes())
    }
    fn msg(mut self, n: u32, m: Enc) -> Self {
        self.tag(n, 2);
        self.varint(m.0.len() as u64);
        self.0.extend(m.0);
        self
    }
    fn entry(self, n: u32, k: &str, v: &str) -> Self {
        self.msg(n, Enc::default().str(1, k).str(2, v))
    }
}

fn envelope_of(api_version: &str, kind: &str, raw: &Enc) -> Vec<u8> {
    let unknown = Enc::default()
        .msg(1, Enc::default().str(1, api_version).str(2, kind))
        .bytes(2, &raw.0)
        .str(3, "")
        .str(4, "");
    [MAGIC, &unknown.0].concat()
}

fn meta(name: &str) -> Enc {
    Enc::default().str(1, name)
}

fn quantity(s: &str) -> Enc {
    Enc::default().str(1, s)
}

fn int_or_string_int(v: i64) -> Enc {
    Enc::default().int(1, 0).int(2, v)
}

fn int_or_string_str(s: &str) -> Enc {
    Enc::default().int(1, 1).str(3, s)
}

fn full_container() -> Enc {
    Enc::default()
        .str(1, "app")
        .str(2, "nginx:1.27")
        .str(4, "--port")
        .str(4, "80")
        .str(5, "/srv")
        .msg(6, Enc::default().str(1, "http").int(3, 80).str(4, "TCP"))
        .msg(7, Enc::default().str(1, "A").str(2, "1"))
        .msg(
            7,
            Enc::default().str(1, "POD").msg(
                3,
                Enc::default().msg(1, Enc::default().str(2, "metadata.name")),
            ),
        )
        .msg(
            8,
            Enc::default()
                .msg(1, Enc::default().str(1, "cpu").msg(2, quantity("1")))
                .msg(2, Enc::default().str(1, "memory").msg(2, quantity("64Mi"))),
        )
        .msg(9, Enc::default().str(1, "cfg").int(2, 1).str(3, "/etc/cfg"))
        .msg(
            10,
            Enc::default()
                .msg(
                    1,
                    Enc::default().msg(
                        2,
                        Enc::default()
                            .str(1, "/healthz")
                            .msg(2, int_or_string_int(80)),
                    ),
                )
                .int(2, 3)
                .int(4, 10),
        )
        .msg(
            11,
            Enc::default().msg(
                1,
                Enc::default().msg(3, Enc::default().msg(1, int_or_string_str("http"))),
            ),
        )
        .str(14, "IfNotPresent")
        .msg(
            15,
            Enc::default()
                .msg(1, Enc::default().str(1, "NET_ADMIN").str(2, "ALL"))
                .int(2, 0)
                .int(6, 1),
        )
}

fn full_deployment() -> Enc {
    let volumes = [
        Enc::default().str(1, "cfg").msg(
            2,
            Enc::default().msg(
                19,
                Enc::default()
                    .msg(1, Enc::default().str(1, "cfg"))
                    .int(3, 420),
            ),
        ),
        Enc::default().str(1, "tmp").msg(
            2,
            Enc::default().msg(2, Enc::default().str(1, "Memory").msg(2, quantity("1Gi"))),
        ),
        Enc::default().str(1, "host").msg(
            2,
            Enc::default().msg(1, Enc::default().str(1, "/var/log").str(2, "Directory")),
        ),
        Enc::default().str(1, "data").msg(
            2,
            Enc::default().msg(10, Enc::default().str(1, "pvc1").int(2, 0)),
        ),
        Enc::default().str(1, "sec").msg(
            2,
            Enc::default().msg(6, Enc::default().str(1, "sec").int(4, 1)),
        ),
    ];
    let mut pod_spec = Enc::default();
    for v in volumes {
        pod_spec = pod_spec.msg(1, v);
    }
    let pod_spec = pod_spec
        .msg(
            20,
            Enc::default()
                .str(1, "init")
                .str(2, "busybox")
                .str(3, "true"),
        )
        .msg(2, full_container())
        .str(3, "Always")
        .int(4, 0)
        .entry(7, "disk", "ssd")
        .str(8, "bot")
        .int(11, 0)
        .msg(14, Enc::default().int(2, 1000).int(3, 1).int(5, 2000))
        .msg(
            22,
            Enc::default()
                .str(1, "k")
                .str(2, "Equal")
                .str(3, "v")
                .str(4, "NoSchedule")
                .int(5, 30),
        )
        .bytes(99, b"future field");
    let spec = Enc::default()
        .int(1, 2)
        .msg(2, Enc::default().entry(1, "app", "full"))
        .msg(
            3,
            Enc::default()
                .msg(1, Enc::default().entry(11, "app", "full"))
                .msg(2, pod_spec),
        )
        .msg(
            4,
            Enc::default().str(1, "RollingUpdate").msg(
                2,
                Enc::default()
                    .msg(1, int_or_string_int(0))
                    .msg(2, int_or_string_str("25%")),
            ),
        )
        .int(6, 5);
    let metadata = meta("full")
        .str(3, "ns1")
        .str(5, "")
        .int(7, 0)
        .msg(8, Enc::default())
        .entry(11, "app", "full")
        .entry(12, "note", "x")
        .str(14, "example.com/f");
    Enc::default()
        .msg(1, metadata)
        .msg(2, spec)
        .msg(3, Enc::default().int(2, 0))
}

#[test]
fn deployment_with_a_full_pod_spec_decodes_like_kubernetes_json() {
    let body = envelope_of("apps/v1", "Deployment", &full_deployment());
    let got = decode_to_json(&body).expect("decodes");
    let want = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "full",
            "namespace": "ns1",
            "labels": {"app": "full"},
            "annotations": {"note": "x"},
            "finalizers": ["example.com/f"]
        },
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "full"}},
            "template": {
                "metadata": {"labels": {"app": "full"}},
                "spec": {
                    "volumes": [
                        {"name": "cfg", "configMap": {"name": "cfg", "defaultMode": 420}},
                        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                        {"name": "host", "hostPath": {"path": "/var/log", "type": "Directory"}},
                        {"name": "data", "persistentVolumeClaim": {"claimName": "pvc1"}},
                        {"name": "sec", "secret": {"secretName": "sec", "optional": true}}
                    ],
                    "initContainers": [
                        {"name": "init", "image": "busybox", "command": ["true"], "resources": {}}
                    ],
                    "containers": [{
                        "name": "app",
                        "image": "nginx:1.27",
                        "args": ["--port", "80"],
                        "workingDir": "/srv",
                        "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}],
                        "env": [
                            {"name": "A", "value": "1"},
                            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                        ],
                        "resources": {"limits": {"cpu": "1"}, "requests": {"memory": "64Mi"}},
                        "volumeMounts": [{"name": "cfg", "readOnly": true, "mountPath": "/etc/cfg"}],
                        "livenessProbe": {
                            "httpGet": {"path": "/healthz", "port": 80},
                            "initialDelaySeconds": 3,
                            "periodSeconds": 10
                        },
                        "readinessProbe": {"tcpSocket": {"port": "http"}},
                        "imagePullPolicy": "IfNotPresent",
                        "securityContext": {
                            "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]},
                            "privileged": false,
                            "readOnlyRootFilesystem": true
                        }
                    }],
                    "restartPolicy": "Always",
                    "terminationGracePeriodSeconds": 0,
                    "nodeSelector": {"disk": "ssd"},
                    "serviceAccountName": "bot",
                    "securityContext": {"runAsUser": 1000, "runAsNonRoot": true, "fsGroup": 2000},
                    "tolerations": [{
                        "key": "k", "operator": "Equal", "value": "v",
                        "effect": "NoSchedule", "tolerationSeconds": 30
                    }]
                }
            },
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"}
            },
            "revisionHistoryLimit": 5
        },
        "status": {}
    });
    assert_eq!(got, want);
}

#[test]
fn well_known_types_take_their_json_forms() {
    let time = |s: i64, n: i64| Enc::default().int(1, s).int(2, n);
    let event = Enc::default()
        .msg(1, meta("e").msg(9, time(1_704_067_200, 0)).int(10, 30))
        .msg(2, Enc::default().str(1, "Pod").str(3, "p"))
        .msg(6, time(1_704_067_201, 999_999_999))
        .msg(7, Enc::default())
        .int(8, -1)
        .msg(10, time(1_704_067_200, 123_456_789))
        .str(14, "kubelet");
    let got = decode_to_json(&envelope_of("v1", "Event", &event)).expect("decodes");
    assert_eq!(
        got["metadata"]["deletionTimestamp"],
        json!("2024-01-01T00:00:00Z")
    );
    assert_eq!(got["metadata"]["deletionGracePeriodSeconds"], json!(30));
    assert_eq!(got["firstTimestamp"], json!("2024-01-01T00:00:01Z"));
    assert_eq!(got["lastTimestamp"], Json::Null);
    assert_eq!(got["count"], json!(-1));
    assert_eq!(got["eventTime"], json!("2024-01-01T00:00:00.123456Z"));
    assert_eq!(got["reportingComponent"], json!("kubelet"));
    assert_eq!(
        got["reportingInstance"],
        json!(""),
        "no omitempty: written when absent"
    );
    assert_eq!(got["involvedObject"], json!({"kind": "Pod", "name": "p"}));
}

#[test]
fn configmap_binary_data_is_base64_and_later_map_entries_win() {
    let cm = Enc::default()
        .msg(1, meta("c"))
        .entry(2, "k", "old")
        .entry(2, "k", "new")
        .msg(3, Enc::default().str(1, "bin").bytes(2, &[0, 1, 2, 255]))
        .int(4, 0);
    let got = decode_to_json(&envelope_of("v1", "ConfigMap", &cm)).expect("decodes");
    assert_eq!(
        got,
        json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
            "immutable": false, "data": {"k": "new"}, "binaryData": {"bin": "AAEC/w=="}
        })
    );
}

#[test]
fn repeated_singular_messages_merge_like_protobuf() {
    let ns = Enc::default()
        .msg(1, meta("a"))
        .msg(1, Enc::default().str(3, "ns"));
    let got = decode_to_json(&envelope_of("v1", "Namespace", &ns)).expect("decodes");
    assert_eq!(got["metadata"], json!({"name": "a", "namespace": "ns"}));
}

#[test]
fn packed_repeated_integers_are_accepted() {
    let mut packed = Enc::default();
    for v in [1u64, 300] {
        packed.varint(v);
    }
    let sc = Enc::default().bytes(4, &packed.0);
    let pod = Enc::default()
        .msg(1, meta("p"))
        .msg(2, Enc::default().msg(14, sc));
    let got = decode_to_json(&envelope_of("v1", "Pod", &pod)).expect("decodes");
    assert_eq!(
        got["spec"]["securityContext"]["supplementalGroups"],
        json!([1, 300])
    );
}

#[test]
fn unknown_kinds_and_versions_are_unsupported() {
    for (api_version, kind) in [
        ("v1", "Node"),
        ("extensions/v1beta1", "Deployment"),
        ("", ""),
    ] {
        let body = envelope_of(api_version, kind, &meta("x"));
        match decode_to_json(&body) {
            Err(ProtobufError::UnsupportedKind {
                api_version: a,
                kind: k,
            }) => {
                assert_eq!((a.as_str(), k.as_str()), (api_version, kind));
            }
            other => panic!("{api_version}/{kind}: {other:?}"),
        }
    }
}

#[test]
fn malformed_envelopes_and_objects_are_errors() {
    assert!(matches!(
        decode_to_json(b"{\"kind\":\"Namespace\"}"),
        Err(ProtobufError::Envelope(_))
    ));
    assert!(matches!(
        decode_to_json(b"k8s"),
        Err(ProtobufError::Envelope(_))
    ));
    assert!(matches!(
        decode_to_json(b"k8s\0\x0a\x05"),
        Err(ProtobufError::Envelope(_))
    ));
    let gzip = [
        MAGIC,
        &Enc::default()
            .msg(1, Enc::default().str(1, "v1").str(2, "Namespace"))
            .str(3, "gzip")
            .0,
    ]
    .concat();
    assert!(matches!(
        decode_to_json(&gzip),
        Err(ProtobufError::Envelope(_))
    ));

    let malformed = |raw: Enc| decode_to_json(&envelope_of("v1", "Namespace", &raw));
    // metadata given as a varint, a name that is not UTF-8, a truncated field.
    for raw in [
        Enc::default().int(1, 5),
        Enc::default().msg(1, Enc::default().bytes(1, &[0xff, 0xfe])),
        Enc(vec![0x0a, 0x10, 0x0a]),
    ] {
        match malformed(raw) {
            Err(ProtobufError::Malformed { kind, .. }) => assert_eq!(kind, "Namespace"),
            other => panic!("{other:?}"),
        }
    }
    let bad_time = Enc::default().msg(1, meta("x").msg(9, Enc::default().int(1, i64::MAX)));
    assert!(matches!(
        malformed(bad_time),
        Err(ProtobufError::Malformed { .. })
    ));
}

#[test]
fn nesting_deeper_than_the_limit_is_refused() {
    let schema = Schema::parse("Node 1:p:child:Node 2:-:name:string").expect("schema");
    let mut bytes = Enc::default().str(2, "leaf");
    for _ in 0..100 {
        bytes = Enc::default().msg(1, bytes);
    }
    assert_eq!(
        decode::message(&schema, 0, &bytes.0, 0),
        Err(decode::DecodeError::TooDeep)
    );
    let mut shallow = Enc::default().str(2, "leaf");
    for _ in 0..10 {
        shallow = Enc::default().msg(1, shallow);
    }
    assert!(decode::message(&schema, 0, &shallow.0, 0).is_ok());
}

/// xorshift64*: a deterministic generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let len = rng.below(64);
        let mut body: Vec<u8> = if rng.below(2) == 0 {
            MAGIC.to_vec()
        } else {
            Vec::new()
        };
        body.extend((0..len).map(|_| rng.next() as u8));
        let _ = decode_to_json(&body);
    }
}

#[test]
fn mutated_fixtures_never_panic() {
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let mut bodies: Vec<Vec<u8>> = FIXTURES.iter().map(|f| f.1.to_vec()).collect();
    bodies.push(envelope_of("apps/v1", "Deployment", &full_deployment()));
    let mut decoded = 0;
    for round in 0..30_000 {
        let mut body = bodies[round % bodies.len()].clone();
        for _ in 0..=rng.below(4) {
            if body.is_empty() {
                break;
            }
            let at = rng.below(body.len());
            match rng.below(4) {
                0 => body[at] = rng.next() as u8,
                1 => body[at] ^= 1 << rng.below(8),
                2 => body.truncate(at),
                _ => body.insert(at, rng.next() as u8),
            }
        }
        if decode_to_json(&body).is_ok() {
            decoded += 1;
        }
    }
    // Some mutations hit only string contents, so part of them still decode.
    assert!(decoded > 0);
}
