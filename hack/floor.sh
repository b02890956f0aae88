#!/usr/bin/env bash
# floor.sh: listbench's b/x beside the floor of a proxy in an executable of
# its own, in one sitting (docs/performance.md, "Two floors").
#
# listbench's fair floor x is its raw pass-through run as `listbench
# passthrough`: the bench binary executed again, so its code runs from the
# same file, the same physical pages, as the bench's client and fake
# kubelets, which ran it a moment before. Any proxy, podres-proxy included,
# runs from a file of its own. For each pod count this runs listbench twice:
#
#   1. with podres-proxy as the product: b/x;
#   2. with listbench's own pass-through as the product, run from a copy of
#      the listbench binary (a file of its own) and forwarding to the same
#      kubelet as x (whose pods report their GPUs, so that the bench's check
#      of the product's answer passes): x'/x, where x' is the least any
#      proxy in its own executable costs.
#
# b/x' = (b/x) / (x'/x) is then podres-proxy against that floor. Each run
# takes one to two minutes; the machine should be otherwise quiet.
#
# Usage: hack/floor.sh [PODS...]        (default: 110 250 500)
# Env:   ITERS (default 2000), RUNTIME (listbench --runtime, default nri),
#        SAME_FILE=1: run the stand-in from the listbench binary itself, as x
#        runs, rather than from a copy (x'/x is then about 1.0: the two
#        runs differ only in the file).
#        LISTBENCH: listbench's source folder (default ../shared/listbench).
#
# listbench is not part of this repository: it is the team's benchmark, a Go
# module of its own kept in the shared folder beside the repository. Without
# it this script cannot run; the repository's own report, set up as listbench
# is, measures the same b/x (docs/performance.md):
#   PODRES_BENCH_SETUP=listbench go test -count=1 -run '^TestBenchmarkReport$' ./proxy
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
listbench=${LISTBENCH:-../shared/listbench}
if [[ ! -f "$listbench/go.mod" ]]; then
  cat >&2 <<EOF
floor.sh: no listbench at $listbench (no go.mod there).
listbench is the team's benchmark, kept beside the repository in ../shared/listbench,
not in this repository. Put it there or set LISTBENCH to its folder; without it, the
repository's own report measures the same b/x (docs/performance.md):
  PODRES_BENCH_SETUP=listbench go test -count=1 -run '^TestBenchmarkReport\$' ./proxy
EOF
  exit 2
fi
out=$root/_output
mkdir -p "$out"
go build -o "$out/podres-proxy" ./cmd/podres-proxy
go -C "$listbench" build -o "$out/listbench" .

work=$(mktemp -d /tmp/floor.XXXXXX)
trap 'rm -rf "$work"' EXIT
# A copy is a file of its own: its pages are not the bench's.
cp "$out/listbench" "$work/passthrough-copy"
standin=$work/passthrough-copy
if [ "${SAME_FILE:-}" = 1 ]; then
  standin=$out/listbench
fi

# The stand-in product: listbench's pass-through, from the copy, serving the
# product's socket and forwarding to the same-answer kubelet. listbench lays
# its temp dir out as D/k/kubelet.sock (the kubelet it gives the product) and
# D/same/kubelet.sock (the same-answer kubelet behind x); the pass-through
# listens on DIR/pt.sock, renamed to the product's socket once it is there.
cat >"$work/product.sh" <<EOF
#!/usr/bin/env bash
while [ \$# -gt 0 ]; do
  case "\$1" in --socket) sock=\$2; shift ;; --kubelet-socket) kubelet=\$2; shift ;; esac
  shift
done
dir=\$(dirname "\$sock")
mkdir -p "\$dir"
same=\$(dirname "\$(dirname "\$kubelet")")/same/kubelet.sock
( for _ in \$(seq 1 400); do
    if [ -S "\$dir/pt.sock" ]; then mv "\$dir/pt.sock" "\$sock"; exit 0; fi
    sleep 0.05
  done ) &
exec "$standin" passthrough --dir "\$dir" --upstream "\$same"
EOF
chmod +x "$work/product.sh"

ratio() { sed -n "s|^INFO ratio $2 median=\([0-9.]*\).*|\1|p" "$1"; }
calls() { sed -n 's/^INFO 64 concurrent clients.*: \([0-9.]*\) kubelet List calls.*/\1/p' "$1"; }
peak() { sed -n 's/.*VmHWM=\([0-9]*\) kB.*/\1/p' "$1" | awk '{ printf "%.0f MiB", $1 / 1024 }'; }

pods=("$@")
[ ${#pods[@]} -gt 0 ] || pods=(110 250 500)
printf '| pods | b/x (podres-proxy) | x'"'"'/x (pass-through, own executable) | b/x'"'"' | kubelet calls per List, 64 clients | peak RSS | c/b |\n|---:|---:|---:|---:|---:|---:|---:|\n'
for n in "${pods[@]}"; do
  "$out/listbench" bench --bin "$out/podres-proxy" --pods "$n" --iters "${ITERS:-2000}" \
    --runtime "${RUNTIME:-nri}" >"$work/product-$n.log" 2>&1 || true
  "$out/listbench" bench --bin "$work/product.sh" --pods "$n" --iters "${ITERS:-2000}" \
    --runtime none >"$work/floor-$n.log" 2>&1 || true
  bx=$(ratio "$work/product-$n.log" b/x)
  xx=$(ratio "$work/floor-$n.log" b/x)
  if [ -z "$bx" ] || [ -z "$xx" ]; then
    echo "floor.sh: $n pods: listbench printed no b/x; its output:" >&2
    cat "$work/product-$n.log" "$work/floor-$n.log" >&2
    exit 1
  fi
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$n" "$bx" "$xx" "$(awk -v a="$bx" -v b="$xx" 'BEGIN { printf "%.2f", a / b }')" \
    "$(calls "$work/product-$n.log")" "$(peak "$work/product-$n.log")" "$(ratio "$work/product-$n.log" c/b)"
done
