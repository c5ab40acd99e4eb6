#!/usr/bin/env bash
# kube-object-lock on a kind cluster, wired exactly as on a kubeadm control-plane host, then a
# smoke test that a Lock refuses UPDATE and DELETE and that unlocking releases the object, then
# the end-to-end suite (tests/e2e) against that cluster and webhook (when cargo is there).
#
#   deploy/kind/run.sh          create everything (cluster "kind") and run the smoke test
#   deploy/kind/run.sh --down   delete the webhook container, the cluster and the generated files
#
# Needs: docker (with compose v2, or docker-compose), kind, kubectl, and a kube-object-lock binary
# (KOL_BIN=/path, else built with cargo, else target/release/ or PATH).
# Touches nothing outside this repository and the cluster "kind": kubectl uses its own kubeconfig
# (deploy/kind/generated/admin.kubeconfig), not ~/.kube/config.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KIND_DIR="$ROOT/deploy/kind"
GEN="$KIND_DIR/generated"
CLUSTER=kind
NODE="$CLUSTER-control-plane"
SMOKE_NS=kol-smoke
REASON="kind smoke test"
NODE_DIR=/etc/kubernetes/kube-object-lock # the API server side, inside the node
export KUBECONFIG="$GEN/admin.kubeconfig"

log() { printf '\n== %s\n' "$*"; }
die() {
    printf 'run.sh: %s\n' "$*" >&2
    exit 1
}

compose() {
    if docker compose version >/dev/null 2>&1; then
        docker compose --project-directory "$ROOT" -f "$ROOT/docker-compose.yml" "$@"
    else
        docker-compose --project-directory "$ROOT" -f "$ROOT/docker-compose.yml" "$@"
    fi
}

down() {
    log "deleting the webhook container, cluster $CLUSTER and $GEN"
    compose down --remove-orphans || true
    kind delete cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG"
    rm -rf "$GEN"
}

on_exit() {
    local rc=$?
    trap - EXIT
    if [ "$rc" -ne 0 ]; then
        printf '\n!! FAILED (exit %s). Diagnostics:\n' "$rc" >&2
        {
            echo "--- webhook container logs (last 100 lines)"
            compose logs --no-color --tail=100 kube-object-lock || true
            echo "--- kube-apiserver logs (last 40 lines)"
            kubectl -n kube-system logs "kube-apiserver-$NODE" --tail=40 || true
            echo "--- ValidatingWebhookConfigurations"
            kubectl get validatingwebhookconfigurations || true
        } >&2 2>&1
        printf '\nThe cluster is left running for inspection; remove it with: %s --down\n' "$0" >&2
    fi
    exit "$rc"
}

case "${1:-}" in
--down)
    down
    exit 0
    ;;
"") ;;
-h | --help)
    sed -n '2,12p' "$0"
    exit 0
    ;;
*) die "unknown argument: $1 (use --down, or nothing)" ;;
esac

# --- Prerequisites ------------------------------------------------------------------------------
log "checking prerequisites"
for tool in docker kind kubectl base64 sed; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is required but not found in PATH"
done
docker info >/dev/null 2>&1 || die "docker cannot reach a container engine (is it running?)"
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null 2>&1; then
    die "docker compose (v2 plugin) or docker-compose is required"
fi
if docker inspect "$NODE" >/dev/null 2>&1; then
    die "a container named $NODE already exists (cluster $CLUSTER): run $0 --down first"
fi

if [ -n "${KOL_BIN:-}" ]; then
    BIN="$KOL_BIN"
elif command -v cargo >/dev/null 2>&1; then
    log "building kube-object-lock (cargo build --release --locked)"
    (cd "$ROOT" && cargo build --release --locked)
    BIN="$ROOT/target/release/kube-object-lock"
elif [ -x "$ROOT/target/release/kube-object-lock" ]; then
    BIN="$ROOT/target/release/kube-object-lock"
elif command -v kube-object-lock >/dev/null 2>&1; then
    BIN="$(command -v kube-object-lock)"
else
    die "no kube-object-lock binary: set KOL_BIN, install cargo, or put it in PATH"
fi
[ -x "$BIN" ] || die "$BIN is not executable"
echo "binary: $BIN ($("$BIN" --version))"

trap on_exit EXIT

# --- Files, before the cluster: the node mounts generated/apiserver at creation -----------------
log "writing certificates and configuration into $GEN"
rm -rf "$GEN"
mkdir -p "$GEN/pki" "$GEN/apiserver" "$GEN/webhook"
printf '*\n' >"$GEN/.gitignore" # keys and tokens: never committed

# Serving certificate for https://127.0.0.1:8443 (an IP SAN: the URL host is an IP), its CA
# (the caBundle), and a separate client CA with the API server's client certificate.
"$BIN" certs --out "$GEN/pki" --san 127.0.0.1 --client --force

# API server side: the AdmissionConfiguration and the kubeconfig that embeds the API server's
# client certificate, with paths as the API server sees them inside the node.
"$BIN" manifests apiserver \
    --client-cert "$GEN/pki/apiserver-client.crt" \
    --client-key "$GEN/pki/apiserver-client.key" \
    --dir "$GEN/apiserver" --apiserver-dir "$NODE_DIR"
grep -q "kubeConfigFile: *\"\{0,1\}$NODE_DIR/webhook-kubeconfig.yaml" "$GEN/apiserver/admission-config.yaml" ||
    die "admission-config.yaml does not point to $NODE_DIR/webhook-kubeconfig.yaml"
# users[].name must be the webhook's host:port, or the API server silently sends no certificate.
grep -q '127\.0\.0\.1:8443' "$GEN/apiserver/webhook-kubeconfig.yaml" ||
    die "webhook-kubeconfig.yaml has no user named 127.0.0.1:8443"

# Webhook side (mounted at /etc/kube-object-lock in the container); the kubeconfig comes later.
cp "$GEN/pki/tls.crt" "$GEN/pki/tls.key" "$GEN/pki/client-ca.crt" "$GEN/webhook/"
cp "$KIND_DIR/config.toml" "$GEN/webhook/config.toml"

# The container runs as the owner of these files (keys are 0600), never as root.
if [ "$(id -u)" -eq 0 ]; then
    chown -R 10001:10001 "$GEN/webhook"
    export KOL_UID=10001 KOL_GID=10001
else
    KOL_UID="$(id -u)" KOL_GID="$(id -g)"
    export KOL_UID KOL_GID
fi

# kind reads a relative hostPath as a docker volume name: render an absolute one.
sed "s#hostPath: deploy/kind/generated/apiserver#hostPath: $GEN/apiserver#" \
    "$KIND_DIR/kind-config.yaml" >"$GEN/kind-config.yaml"
grep -q "hostPath: $GEN/apiserver" "$GEN/kind-config.yaml" || die "could not render kind-config.yaml"

# --- Cluster --------------------------------------------------------------------------------------
log "creating kind cluster $CLUSTER (API server with --admission-control-config-file)"
kind create cluster --name "$CLUSTER" --config "$GEN/kind-config.yaml" \
    --kubeconfig "$KUBECONFIG" --wait 180s

# --- The webhook's own identity: a ServiceAccount with a long-lived token -------------------------
log "creating the webhook's identity (ServiceAccount kube-object-lock/kube-object-lock)"
kubectl apply -f - <<'EOF'
apiVersion: v1
kind: Namespace
metadata:
  name: kube-object-lock
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: kube-object-lock
  namespace: kube-object-lock
---
apiVersion: v1
kind: Secret
metadata:
  name: kube-object-lock-token
  namespace: kube-object-lock
  annotations:
    kubernetes.io/service-account.name: kube-object-lock
type: kubernetes.io/service-account-token
EOF
token=""
for _ in $(seq 1 60); do
    token="$(kubectl -n kube-object-lock get secret kube-object-lock-token -o jsonpath='{.data.token}')"
    [ -n "$token" ] && break
    sleep 1
done
[ -n "$token" ] || die "the token controller did not fill secret kube-object-lock-token"
ca_data="$(kubectl -n kube-object-lock get secret kube-object-lock-token -o jsonpath='{.data.ca\.crt}')"

# The local API server at 127.0.0.1:6443. kubeadm's serving certificate is checked against the
# name "kubernetes", as on a real control-plane host where it has no 127.0.0.1 SAN.
(
    umask 077
    cat >"$GEN/webhook/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: local
    cluster:
      server: https://127.0.0.1:6443
      certificate-authority-data: $ca_data
      tls-server-name: kubernetes
users:
  - name: kube-object-lock
    user:
      token: $(printf '%s' "$token" | base64 -d)
contexts:
  - name: kube-object-lock
    context:
      cluster: local
      user: kube-object-lock
current-context: kube-object-lock
EOF
)
if [ "$(id -u)" -eq 0 ]; then chown 10001:10001 "$GEN/webhook/kubeconfig"; fi

# --- CRDs, webhook, registration ------------------------------------------------------------------
log "installing the CRDs"
"$BIN" crd | kubectl apply -f -
kubectl wait --for=condition=Established --timeout=60s \
    crd/locks.objectlock.dev crd/clusterlocks.objectlock.dev

log "building and starting the webhook container (in the network namespace of $NODE)"
compose up -d --build kube-object-lock

log "registering the webhook (manifests cluster)"
"$BIN" manifests cluster --ca-file "$GEN/pki/ca.crt" \
    --service-account kube-object-lock/kube-object-lock | kubectl apply -f -

# --- Smoke test -----------------------------------------------------------------------------------
passed=0
pass() {
    passed=$((passed + 1))
    echo "PASS: $*"
}
fail() {
    printf 'FAIL: %s\n' "$*" >&2
    echo "smoke test: $passed passed, 1 failed"
    exit 1
}

log "smoke test objects in namespace $SMOKE_NS"
kubectl create namespace "$SMOKE_NS"
kubectl -n "$SMOKE_NS" create configmap locked --from-literal=state=original
kubectl -n "$SMOKE_NS" create configmap free --from-literal=state=original

log "waiting for the webhook (an UPDATE through the API server, with mTLS)"
ready=""
for _ in $(seq 1 90); do
    if kubectl -n "$SMOKE_NS" annotate configmap free objectlock.dev/probe=1 --overwrite \
        --dry-run=server >/dev/null 2>"$GEN/probe.err"; then
        ready=yes
        break
    fi
    sleep 2
done
[ -n "$ready" ] || fail "the webhook did not answer within 180s: $(cat "$GEN/probe.err")"
pass "the API server calls the webhook"

log "locking configmap $SMOKE_NS/locked"
kubectl create -f - <<EOF
apiVersion: objectlock.dev/v1alpha1
kind: Lock
metadata:
  name: locked
  namespace: $SMOKE_NS
spec:
  reason: $REASON
EOF

# expect_refused DESCRIPTION COMMAND...: the command must fail with the lock's message.
expect_refused() {
    local what="$1" out
    shift
    for _ in $(seq 1 20); do # the watch enforces a new Lock within milliseconds; allow 10s
        if out="$("$@" 2>&1)"; then
            sleep 0.5
            continue
        fi
        if grep -q "locked by Lock $SMOKE_NS/locked" <<<"$out" && grep -q "$REASON" <<<"$out"; then
            pass "$what refused: $out"
            return 0
        fi
        fail "$what failed, but not with the lock's message: $out"
    done
    fail "$what was allowed on a locked object (last output: $out)"
}
expect_allowed() {
    local what="$1" out
    shift
    out="$("$@" 2>&1)" || fail "$what refused: $out"
    pass "$what allowed"
}

expect_refused "UPDATE (kubectl label) of locked" \
    kubectl -n "$SMOKE_NS" label configmap locked smoke=1
expect_refused "UPDATE (kubectl annotate) of locked" \
    kubectl -n "$SMOKE_NS" annotate configmap locked smoke=1
expect_refused "DELETE --dry-run=server of locked" \
    kubectl -n "$SMOKE_NS" delete configmap locked --dry-run=server
expect_refused "DELETE of locked" \
    kubectl -n "$SMOKE_NS" delete configmap locked --wait=false
kubectl -n "$SMOKE_NS" get configmap locked >/dev/null || fail "locked is gone despite the lock"
pass "locked still exists"

expect_allowed "UPDATE (kubectl label) of free" kubectl -n "$SMOKE_NS" label configmap free smoke=1
expect_allowed "UPDATE (kubectl annotate) of free" kubectl -n "$SMOKE_NS" annotate configmap free smoke=1
expect_allowed "DELETE of free" kubectl -n "$SMOKE_NS" delete configmap free

log "unlocking (kubectl delete lock locked)"
expect_allowed "DELETE of the Lock" kubectl -n "$SMOKE_NS" delete lock locked
deleted=""
for _ in $(seq 1 20); do # the release reaches the cache within milliseconds; allow 10s
    if kubectl -n "$SMOKE_NS" delete configmap locked >/dev/null 2>"$GEN/delete.err"; then
        deleted=yes
        break
    fi
    sleep 0.5
done
[ -n "$deleted" ] || fail "DELETE of locked still refused after unlocking: $(cat "$GEN/delete.err")"
pass "DELETE of locked allowed after unlocking"

kubectl delete namespace "$SMOKE_NS" --wait=false >/dev/null
echo
echo "smoke test: $passed passed, 0 failed"

# --- End-to-end suite -----------------------------------------------------------------------------
# The project's suite (tests/e2e) against this cluster. The webhook is the compose service above,
# already registered, so the suite only checks locks (KOL_E2E_WEBHOOK=external).
if command -v cargo >/dev/null 2>&1; then
    log "end-to-end suite against cluster $CLUSTER (KOL_E2E_WEBHOOK=external)"
    e2e_env=(KOL_E2E_KUBECONFIG="$KUBECONFIG" KOL_E2E_WEBHOOK=external)
    bin_dir="$(dirname "$BIN")"
    if [ -x "$bin_dir/kubectl-lock" ]; then e2e_env+=(KOL_E2E_BIN_DIR="$bin_dir"); fi
    (cd "$ROOT" && env "${e2e_env[@]}" cargo test --locked --test e2e)
else
    echo "no cargo: end-to-end suite not run (cargo test --test e2e with KOL_E2E_KUBECONFIG=$KUBECONFIG KOL_E2E_WEBHOOK=external)"
fi
cat <<EOF

The cluster is up with kube-object-lock in front of its API server:
  export KUBECONFIG=$KUBECONFIG
  kubectl get locks -A
Webhook logs: docker compose logs -f kube-object-lock   (or docker-compose; from $ROOT)
Remove everything with: $0 --down
EOF
