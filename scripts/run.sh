#!/usr/bin/env bash
# The project's main command: installs what is missing, builds kubevirt-rs, builds the
# test guest, starts `kubevirt-rs server` on this machine, applies the demo VM and waits
# until it runs. Leaves the server in the foreground; Ctrl-C stops it (the guests and KubeVirt's pods keep
# running until their VMs are stopped; see README).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

DATA_DIR="${DATA_DIR:-$KUBEVIRT_RS_CACHE/data}"
LISTEN="${LISTEN:-127.0.0.1:6443}"

ensure_toolchain
ensure_runtime_packages

step "building kubevirt-rs and virtctl (release)"
cargo build --release --locked -p kubevirt-rs -p virtctl
BIN="$CARGO_TARGET_DIR/release"
mkdir -p "$DATA_DIR"

step "building the test guest (cached)"
GUEST="$KUBEVIRT_RS_CACHE/guest"
scripts/build-test-guest.sh "$GUEST"
"$BIN/kubevirt-rs" images --data-dir "$DATA_DIR" import kubevirt-rs/test-guest:latest \
  "$GUEST/vmlinux" "$GUEST/initramfs.cpio.gz"
# Its bootable disk, the containerDisk the examples name (examples/vm-containerdisk.yaml …).
scripts/build-test-guest-disk.sh "$GUEST"
"$BIN/kubevirt-rs" images --data-dir "$DATA_DIR" import kubevirt-rs/test-guest-disk:latest \
  --to /disk/ "$GUEST/disk.img"

step "starting kubevirt-rs server (data in $DATA_DIR, listening on $LISTEN)"
"$BIN/kubevirt-rs" server --data-dir "$DATA_DIR" --listen "$LISTEN" &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT INT TERM

export KUBECONFIG="$DATA_DIR/kubeconfig"
for _ in $(seq 1 300); do
  [ -s "$KUBECONFIG" ] && kubectl get --raw /readyz >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { echo "server exited" >&2; exit 1; }
  sleep 0.2
done
kubectl get --raw /readyz >/dev/null

step "applying the demo VM (examples/vm-demo.yaml)"
if [ -f examples/vm-demo.yaml ]; then
  # KubeVirt's components start as pods after the API server: admission works once virt-api
  # has a ready endpoint (a server-side dry run passes through the webhooks).
  for _ in $(seq 1 600); do
    kubectl apply --dry-run=server -f examples/vm-demo.yaml >/dev/null 2>&1 && break
    kill -0 $SERVER 2>/dev/null || { echo "server exited" >&2; exit 1; }
    sleep 0.2
  done
  kubectl apply -f examples/vm-demo.yaml
  kubectl wait vm/demo --for=condition=Ready --timeout=180s || kubectl get vm,vmi,pods -o wide
  POD=$(kubectl get pods -l vm.kubevirt.io/name=demo -o jsonpath='{.items[0].metadata.name}')
  for _ in $(seq 1 100); do
    kubectl logs "$POD" -c guest-console-log 2>/dev/null | grep -q GUEST-READY && break
    sleep 0.2
  done
  echo "guest console (kubectl logs $POD -c guest-console-log):"
  kubectl logs "$POD" -c guest-console-log | tail -3
fi
kubectl get vm,vmi -o wide || true

cat <<MSG

kubevirt-rs is running.
  export KUBECONFIG=$KUBECONFIG
  kubectl get vm,vmi,pods
  kubectl logs -l vm.kubevirt.io/name=demo -c guest-console-log
  $BIN/virtctl console demo        # Ctrl+] to leave; type "ping"
  $BIN/virtctl stop demo
Press Ctrl-C to stop the server.
MSG
wait $SERVER
