#!/usr/bin/env python3
"""Regenerates `schema.txt`, the protobuf descriptor table of `decode_to_json`.

Usage: gen_schema.py API_DIR APIMACHINERY_DIR > schema.txt

API_DIR is a checkout of k8s.io/api and APIMACHINERY_DIR one of k8s.io/apimachinery. The
script reads two kinds of facts from them: field numbers and types from each package's
`generated.proto`, and the JSON name, `omitempty`/`omitzero`/`,inline` options and
pointer-ness from the Go struct tags (`protobuf:"...,N,..."` gives the join key). It keeps
only the messages reachable from the kinds in KINDS.
"""
import os
import re
import sys

API, MACH = sys.argv[1], sys.argv[2]
PACKAGES = [
    (API, "core/v1"), (API, "apps/v1"), (API, "batch/v1"), (API, "rbac/v1"),
    (API, "policy/v1"), (API, "scheduling/v1"), (API, "coordination/v1"),
    (API, "networking/v1"), (API, "authentication/v1"), (MACH, "pkg/apis/meta/v1"),
    (MACH, "pkg/runtime"), (MACH, "pkg/util/intstr"), (MACH, "pkg/api/resource"),
]
KINDS = [
    ("k8s.io.api.core.v1", k) for k in
    "Namespace ConfigMap Secret Service ServiceAccount Pod Endpoints PersistentVolumeClaim "
    "Event ResourceQuota".split()
] + [
    ("k8s.io.api.apps.v1", "Deployment"), ("k8s.io.api.apps.v1", "DaemonSet"),
    ("k8s.io.api.batch.v1", "Job"), ("k8s.io.api.batch.v1", "CronJob"),
    ("k8s.io.api.rbac.v1", "Role"), ("k8s.io.api.rbac.v1", "RoleBinding"),
    ("k8s.io.api.rbac.v1", "ClusterRole"), ("k8s.io.api.rbac.v1", "ClusterRoleBinding"),
    ("k8s.io.api.policy.v1", "PodDisruptionBudget"),
    ("k8s.io.api.scheduling.v1", "PriorityClass"),
    ("k8s.io.api.coordination.v1", "Lease"), ("k8s.io.api.networking.v1", "Ingress"),
] + [
    ("k8s.io.api.authentication.v1", k)
    for k in "TokenRequest TokenReview SelfSubjectReview".split()
]
# Messages with a JSON form of their own; the decoder knows them by these names.
BUILTIN = {
    "k8s.io.apimachinery.pkg.apis.meta.v1.Time": "Time",
    "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime": "MicroTime",
    "k8s.io.apimachinery.pkg.apis.meta.v1.Duration": "Duration",
    "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1": "FieldsV1",
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString": "IntOrString",
    "k8s.io.apimachinery.pkg.api.resource.Quantity": "Quantity",
    "k8s.io.apimachinery.pkg.runtime.RawExtension": "RawExtension",
}
SCALARS = {"string", "bool", "int32", "int64", "double", "bytes", "float"}

messages = {}  # full name -> [(label, type, proto_name, number)]
go_fields = {}  # (package, struct, number) -> (json_name, opts, pointer)

FIELD = re.compile(r"^\s*(optional|repeated)?\s*(map<\s*\w+\s*,\s*[\w.]+\s*>|[\w.]+)\s+(\w+)\s*=\s*(\d+)\s*;")
TAG = re.compile(r'^\s*(\w+)?\s+([^`]+?)\s*`([^`]*)`')


def qualify(package, typ):
    if typ in SCALARS:
        return typ
    return typ.lstrip(".") if "." in typ else package + "." + typ


def parse_proto(path):
    package, current = None, None
    for line in open(path, encoding="utf-8"):
        line = line.split("//")[0]
        m = re.match(r"^package\s+([\w.]+);", line)
        if m:
            package = m.group(1)
        m = re.match(r"^message\s+(\w+)\s*{", line)
        if m:
            current = package + "." + m.group(1)
            messages[current] = []
            continue
        if line.startswith("}"):
            current = None
            continue
        m = FIELD.match(line)
        if m and current:
            label, typ, name, num = m.groups()
            if typ.startswith("map<"):
                k, v = [t.strip() for t in typ[4:-1].split(",")]
                typ = f"map<{k}, {qualify(package, v)}>"
            else:
                typ = qualify(package, typ)
            messages[current].append((label or "optional", typ, name, int(num)))
    return package


def parse_go(package, path):
    struct = None
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^type\s+(\w+)\s+struct\s*{", line)
        if m:
            struct = m.group(1)
            continue
        if line.startswith("}"):
            struct = None
            continue
        if not struct or "protobuf:\"" not in line or line.strip().startswith("//"):
            continue
        m = TAG.match(line)
        if not m:
            continue
        gotype, tags = m.group(2), m.group(3)
        pb = re.search(r'protobuf:"([^"]*)"', tags).group(1).split(",")
        if len(pb) < 2:
            continue
        js = re.search(r'json:"([^"]*)"', tags)
        js = js.group(1).split(",") if js else [m.group(1) or "", "omitempty"]
        opts = set(js[1:])
        if m.group(1) is None and js[0] == "":
            opts.add("inline")  # an embedded struct without a JSON name is flattened
        go_fields[(package, struct, int(pb[1]))] = (js[0], opts, gotype.startswith("*"))


for root, rel in PACKAGES:
    d = os.path.join(root, rel)
    pkg = parse_proto(os.path.join(d, "generated.proto"))
    for f in sorted(os.listdir(d)):
        if f.endswith(".go") and not f.endswith("_test.go") and not f.startswith("generated") \
                and not f.startswith("zz_"):
            parse_go(pkg, os.path.join(d, f))

short = {}


def short_name(full):
    if full in BUILTIN:
        return BUILTIN[full]
    name = full.rsplit(".", 1)[1]
    if short.setdefault(name, full) != full:
        sys.exit(f"name clash: {full} and {short[name]}")
    return name


def refs(typ):
    if typ.startswith("map<"):
        typ = typ[4:-1].split(",")[1].strip()
    return [] if typ in SCALARS else [typ]


order, seen = [], set()
queue = [p + "." + k for p, k in KINDS]
while queue:
    full = queue.pop(0)
    if full in seen or full in BUILTIN:
        continue
    if full not in messages:
        print(f"skipping fields of type {full}: package not read", file=sys.stderr)
        seen.add(full)
        continue
    seen.add(full)
    order.append(full)
    for _, typ, _, _ in messages[full]:
        queue.extend(refs(typ))

print("# Generated by gen_schema.py from Kubernetes' generated.proto files and Go struct tags.")
print("# One message per line: `Name number:flags:jsonName:type ...`. flags: `p` pointer (emit")
print("# when present, even if zero), `r` no omitempty (emit zero values), `z` omitzero, `i` inline")
print("# (merge the fields into the parent), `-` none. type: scalar, message name, `[]T` repeated,")
print("# `{}T` map<string, T>.")
for full in order:
    pkg, name = full.rsplit(".", 1)
    out = [short_name(full)]
    for label, typ, pname, num in messages[full]:
        if any(r not in messages and r not in BUILTIN for r in refs(typ)):
            continue
        json_name, opts, pointer = go_fields.get((pkg, name, num), (pname, {"omitempty"}, False))
        flags = ""
        if pointer:
            flags += "p"
        if "inline" in opts:
            flags += "i"
            json_name = pname
        elif "omitempty" not in opts and "omitzero" not in opts:
            flags += "r"
        if "omitzero" in opts:
            flags += "z"
        if typ.startswith("map<"):
            k, v = [t.strip() for t in typ[4:-1].split(",")]
            if k != "string":
                sys.exit(f"{full}.{pname}: map key {k}")
            t = "{}" + (v if v in SCALARS else short_name(v))
        else:
            t = typ if typ in SCALARS else short_name(typ)
            if label == "repeated":
                t = "[]" + t
        out.append(f"{num}:{flags or '-'}:{json_name}:{t}")
    print(" ".join(out))
