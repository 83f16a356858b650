#!/usr/bin/env bash
# libfabric's connected endpoints against Linux rxe (issue 22, docs/design.md "libfabric"):
# fi_pingpong -p verbs -e msg and -p "verbs;ofi_rxm" -e rdm, data checked (-c), between
# softrdma under `softrdma run` on the host and rxe in lab guest g1, both directions.
#
# The lab's guests have no libfabric: this copies Debian's libfabric1, libfabric-bin and
# their libraries into g1 (apt-get download on the host, dpkg -i in the guest). Root, the
# lab (LAB=path to the lab's run.sh, default ../shared/lab/run.sh) and a booted g1 with
# rxe0 (run.sh boot 1; run.sh rdma-up 1 rxe). The host side is a network namespace of its
# own (srfi, 10.50.0.31 on the lab bridge) with a softrdma RoCE device on its eth0;
# libfabric skips `lo` for connected endpoints. RxM needs FI_UNIVERSE_SIZE=16 on both
# sides (its default completion queues exceed rxe's and softrdma's 32767 entries).
# Prints one line per run and exits non-zero if any failed.
set -uo pipefail
HERE=$(cd "$(dirname "$0")/../.." && pwd)
LAB=${LAB:-$HERE/../shared/lab/run.sh}
PY=${PYTHON:-python3}
NS=srfi
WORK=$(mktemp -d /tmp/lab-libfabric.XXXXXX)
export SOFTRDMA_STATE_DIR=$WORK/state FI_UNIVERSE_SIZE=16
cleanup() {
    ip netns pids $NS 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del $NS 2>/dev/null
    ip netns exec rdmalab ip link del srfil 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
cleanup; mkdir -p "$WORK/debs" "$SOFTRDMA_STATE_DIR"

# libfabric in the guest
(cd "$WORK/debs" && apt-get download -q libfabric1 libfabric-bin libpsm-infinipath1 \
    libpsm2-2 libatomic1 libnuma1 >/dev/null 2>&1) || { echo "apt-get download failed"; exit 1; }
for f in "$WORK"/debs/*.deb; do
    bash "$LAB" ssh 1 "cat > /tmp/$(basename "$f")" < "$f" || exit 1
done
bash "$LAB" ssh 1 'dpkg -i /tmp/*.deb >/dev/null 2>&1; command -v fi_pingpong >/dev/null' \
    || { echo "libfabric did not install in g1"; exit 1; }

# the host side: a namespace on the lab bridge with a softrdma device on its eth0
ip netns add $NS
ip link add srfih address 52:54:00:00:00:3a type veth peer name srfil
ip link set srfih netns $NS
ip link set srfil netns rdmalab
ip netns exec rdmalab ip link set srfil master br0 up
ip netns exec $NS ip link set lo up
ip netns exec $NS ip link set srfih name eth0
ip netns exec $NS ip addr add 10.50.0.31/24 dev eth0
ip netns exec $NS ip link set eth0 up
ip netns exec $NS ping -c1 -W 20 10.50.0.11 >/dev/null || { echo "g1 does not answer"; exit 1; }
(cd "$HERE" && ip netns exec $NS "$PY" -m softrdma link add firoce netdev eth0 type roce) \
    || exit 1

fails=0
run_host() {  # fi_pingpong ARGS... under softrdma run in the namespace
    (cd "$HERE" && timeout 110 ip netns exec $NS "$PY" -m softrdma run -d firoce -- \
        fi_pingpong "$@" 2>&1; echo "rc=$?")
}
run_guest() {
    timeout 110 bash "$LAB" ssh 1 "FI_UNIVERSE_SIZE=16 timeout 100 fi_pingpong $* 2>&1; echo rc=\$?"
}
report() {  # NAME SERVER_OUT CLIENT_OUT
    local ok=yes
    for out in "$2" "$3"; do
        grep -q '^4k *20 *=20' <<<"$out" && grep -q '^rc=0' <<<"$out" || ok=no
    done
    [ $ok = yes ] || fails=$((fails + 1))
    echo "$1: $([ $ok = yes ] && echo pass || echo FAIL)"
    [ $ok = yes ] || printf 'server:\n%s\nclient:\n%s\n' "$2" "$3"
}
for mode in "verbs msg" "verbs;ofi_rxm rdm"; do
    prov=${mode% *}; ep=${mode#* }
    args=(-p "$prov" -e "$ep" -c -I 20 -S 4096)
    run_host "${args[@]}" > "$WORK/srv" & sleep 6
    cli=$(run_guest "-p '$prov' -e $ep -c -I 20 -S 4096 10.50.0.31"); wait
    report "$prov $ep: softrdma server, rxe client" "$(cat "$WORK/srv")" "$cli"
    run_guest "-p '$prov' -e $ep -c -I 20 -S 4096" > "$WORK/srv" & sleep 6
    cli=$(run_host "${args[@]}" 10.50.0.11); wait
    report "$prov $ep: rxe server, softrdma client" "$(cat "$WORK/srv")" "$cli"
done
exit $((fails > 0))
