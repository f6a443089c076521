# Helper functions for guest scripts run by scripts/rdma_vm.sh. The guest
# runner defines them before the script starts (through BASH_ENV); soft-RoCE
# (rdma_rxe, ib_uverbs, veth) is loaded and lo is up, but no rxe device
# exists until a script calls rxe_one_host or rxe_two_hosts.
#
# Set-up
#   rxe_one_host            veth pair rxe-a/rxe-b, rxe0 on rxe-a. Its GID
#                           table holds index 0 only (IPv6 link-local, RoCE
#                           v2), so GID index 1 is the classic wrong index.
#   rxe_two_hosts NS1 NS2   two "hosts": network namespaces NS1 and NS2 with
#                           an IPv4 control network (eth0, 10.11.0.1/24 and
#                           10.11.0.2/24: TCP store, pingpong's exchange) and
#                           each its own rxe device, rxe0 for NS1 and rxe1
#                           for NS2, on the two ends of an RDMA veth wire
#                           (rxe-NS1 <-> rxe-NS2; RDMA between them crosses
#                           it, GID index 0, link-local).
#     Why the rxe netdevs stay in the initial namespace: this kernel's
#     rdma_rxe (6.1) routes and receives RoCE packets in init_net only, so an
#     rxe device on a netdev inside a namespace cannot reach its peer, and
#     rxe devices cannot be moved into a namespace ("rdma dev set ... netns":
#     not supported). Verbs devices are shared across namespaces (rdma
#     system netns shared), so each host sees both rxe0 and rxe1: name the
#     host's own with BRAID_IB_HCA, as on_host does.
#   rxe_reset               removes what the two above set up (rxe devices,
#                           their veths, the namespaces), so one script can
#                           use both in turn (device names are global)
#   on_host NS CMD...       runs CMD in host NS with BRAID_HOST_ID=NS,
#                           BRAID_IB_HCA=<its rxe>, BRAID_BIND_ADDR=<its IPv4>
#   rxe_hca NS / rxe_addr NS   print the host's rxe device / IPv4 address
#   launch_two_hosts LAUNCH NS1 NS2 NPROC [SECONDS] -- PROGRAM ARG...
#                           one braid job over both hosts: braid-launch
#                           (path LAUNCH) as node 0 on NS1 (its store on
#                           NS1's address) and node 1 on NS2, NPROC ranks
#                           each, under on_host and a fresh BRAID_JOB_TOKEN;
#                           prints both nodes' output, status 0 only if both
#                           succeed. BRAID_* set by the caller pass through
#                           (e.g. BRAID_TRANSPORT=ibverbs)
#   launch_ranks "NS:N NS:N ..." SECONDS -- PROGRAM ARG...
#                           one job of N ranks on each host NS in turn (any
#                           split, e.g. "h1:2 h2:1"), started directly with
#                           torchrun's variables (RANK, WORLD_SIZE, LOCAL_*,
#                           GROUP_RANK, MASTER_ADDR/PORT: rank 0 on the
#                           first host serves the store), each under on_host
#                           and `timeout SECONDS`; prints every rank's output
#                           prefixed "[NS] [rank R] ", status 0 only if every
#                           rank succeeds. braid-launch cannot split ranks
#                           unevenly (rank = node * nproc + local).
#                           With RDMA_VM_LAUNCH_LOGS=DIR, rank R writes to
#                           DIR/R as it runs (kept), for a caller that
#                           watches a job it started in the background.
#   no_leftovers            no braid process (braid-*) and no /dev/shm/braid*
#                           file is left (waits up to 3 s for exits); prints
#                           what is left otherwise
#
# Checks (TAP-like lines; the script ends with `finish`)
#   check NAME CMD...        CMD must succeed
#   check_fails NAME CMD...  CMD must fail (and not time out: status 124/137)
#   known_issue NAME WHY CMD...  a check that fails today for a reason
#                            that is known and tracked (WHY): "not ok - NAME
#                            # TODO WHY", or "ok - NAME # TODO ... no longer
#                            seen: make it a check"; neither changes the
#                            exit status (TAP's TODO)
#   finish                   exit 1 if any check failed, else 0
# Bounded waits
#   bounded SECONDS CMD...   CMD under `timeout -k 2 SECONDS`
#   wait_tcp_port NS PORT [SECONDS]   until something listens (NS "" = initial)
#   rxe_wait_gid DEV INDEX [SECONDS]  until the GID entry is filled in
#   rxe_pingpong SNS CNS SDEV CDEV GID ADDR [ARG...]
#                            ibv_rc_pingpong server in SNS on SDEV, client in
#                            CNS on CDEV connecting to ADDR; both outputs are
#                            printed; status 0 only if both succeed
unset BASH_ENV

rdma_vm_failed=0
rdma_vm_checks=0

ns_exec() { # NS CMD...: CMD in namespace NS, or here when NS is ""
  local ns=$1; shift
  if [ -n "$ns" ]; then ip netns exec "$ns" "$@"; else "$@"; fi
}

bounded() { local s=$1; shift; timeout -k 2 "$s" "$@"; }

# Seconds since $1 (an $EPOCHREALTIME), to one decimal: each check line
# ends with the time its command took, so that a slow VM run says where.
rdma_vm_took() {
  local now=${EPOCHREALTIME//[.,]/} then=${1//[.,]/}
  local tenths=$(( (now - then) / 100000 ))
  echo "[$((tenths / 10)).$((tenths % 10)) s]"
}

check() {
  local name=$1 started=$EPOCHREALTIME; shift
  rdma_vm_checks=$((rdma_vm_checks + 1))
  if "$@"; then echo "ok - $name $(rdma_vm_took "$started")"; else
    echo "not ok - $name (status $?: $*) $(rdma_vm_took "$started")"; rdma_vm_failed=$((rdma_vm_failed + 1)); fi
}

check_fails() {
  local name=$1 rc started=$EPOCHREALTIME; shift
  rdma_vm_checks=$((rdma_vm_checks + 1))
  "$@"; rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ]; then
    echo "ok - $name (failed as expected, status $rc) $(rdma_vm_took "$started")"
  else echo "not ok - $name (expected a failure, got status $rc: $*) $(rdma_vm_took "$started")"; rdma_vm_failed=$((rdma_vm_failed + 1)); fi
}

known_issue() {
  local name=$1 why=$2; shift 2
  if "$@"; then echo "ok - $name # TODO known issue no longer seen, make this a check: $why"
  else echo "not ok - $name # TODO known issue: $why"; fi
}

finish() {
  echo "# $((rdma_vm_checks - rdma_vm_failed)) of $rdma_vm_checks checks passed"
  [ "$rdma_vm_checks" -gt 0 ] && [ "$rdma_vm_failed" -eq 0 ] && exit 0
  exit 1
}

wait_tcp_port() { # NS PORT [SECONDS]
  local ns=$1 port=$2 s=${3:-10} i
  for ((i = 0; i < s * 10; i++)); do
    ns_exec "$ns" ss -ltnH "sport = :$port" | grep -q . && return 0
    sleep 0.1
  done
  echo "rdma_vm: nothing listens on port $port${ns:+ in $ns} after ${s}s" >&2
  return 1
}

rxe_wait_gid() { # DEV INDEX [SECONDS]
  local dev=$1 idx=$2 s=${3:-10} i gid
  for ((i = 0; i < s * 10; i++)); do
    gid=$(cat "/sys/class/infiniband/$dev/ports/1/gids/$idx" 2>/dev/null)
    case $gid in "" | 0000:0000:0000:0000:0000:0000:0000:0000) ;; *) return 0 ;; esac
    sleep 0.1
  done
  echo "rdma_vm: $dev has no GID at index $idx after ${s}s" >&2
  return 1
}

rxe_veth_up() { # NS IFNAME: no duplicate address detection, so the
  # link-local address (GID index 0) is usable at once, then up
  ns_exec "$1" sysctl -qw "net.ipv6.conf.$2.accept_dad=0" && ns_exec "$1" ip link set "$2" up
}

rxe_free() { # DEV...: fail, saying why, if a device of that name exists
  local d
  for d in "$@"; do
    [ ! -e "/sys/class/infiniband/$d" ] && continue
    echo "rdma_vm: $d exists already (rxe_one_host and rxe_two_hosts both name rxe0; call rxe_reset between them)" >&2
    return 1
  done
}

rxe_reset() {
  local d ns
  for d in /sys/class/infiniband/rxe*; do [ -e "$d" ] && rdma link delete "${d##*/}"; done
  for d in /sys/class/net/rxe-*; do [ -e "$d" ] && ip link delete "${d##*/}" 2>/dev/null; done
  for ns in "${!rdma_vm_hca[@]}"; do ip netns delete "$ns"; unset "rdma_vm_hca[$ns]" "rdma_vm_addr[$ns]"; done
  if compgen -G '/sys/class/infiniband/rxe*' >/dev/null || compgen -G '/sys/class/net/rxe-*' >/dev/null; then
    echo "rdma_vm: rxe_reset left: $(compgen -G '/sys/class/infiniband/rxe*'; compgen -G '/sys/class/net/rxe-*')" >&2
    return 1
  fi
}

rxe_one_host() {
  rxe_free rxe0 || return 1
  ip link add rxe-a type veth peer name rxe-b || return 1
  rxe_veth_up "" rxe-a && rxe_veth_up "" rxe-b || return 1
  rdma link add rxe0 type rxe netdev rxe-a || return 1
  rxe_wait_gid rxe0 0
}

declare -A rdma_vm_hca rdma_vm_addr
rxe_two_hosts() { # NS1 NS2
  local hosts=("$1" "$2") i
  rxe_free rxe0 rxe1 || return 1
  if [ ${#1} -gt 11 ] || [ ${#2} -gt 11 ]; then echo "rdma_vm: host names up to 11 characters (rxe-NAME is an interface)" >&2; return 1; fi
  for i in 0 1; do
    ip netns add "${hosts[i]}" || return 1
    ip -n "${hosts[i]}" link set lo up || return 1
    rdma_vm_hca[${hosts[i]}]=rxe$i
    rdma_vm_addr[${hosts[i]}]=10.11.0.$((i + 1))
  done
  # control network: eth0 in each namespace
  ip link add rxe-tmp0 netns "${hosts[0]}" type veth peer name rxe-tmp1 netns "${hosts[1]}" || return 1
  for i in 0 1; do
    ip -n "${hosts[i]}" link set "rxe-tmp$i" name eth0 &&
      ip -n "${hosts[i]}" addr add "${rdma_vm_addr[${hosts[i]}]}/24" dev eth0 &&
      rxe_veth_up "${hosts[i]}" eth0 || return 1
  done
  # RDMA wire: rxe0 and rxe1 on the two ends of a veth pair
  ip link add "rxe-${hosts[0]}" type veth peer name "rxe-${hosts[1]}" || return 1
  for i in 0 1; do
    rxe_veth_up "" "rxe-${hosts[i]}" && rdma link add "rxe$i" type rxe netdev "rxe-${hosts[i]}" || return 1
  done
  rxe_wait_gid rxe0 0 && rxe_wait_gid rxe1 0
}

rxe_hca() { echo "${rdma_vm_hca[$1]}"; }
rxe_addr() { echo "${rdma_vm_addr[$1]}"; }

on_host() { # NS CMD...
  local ns=$1; shift
  ip netns exec "$ns" env BRAID_HOST_ID="$ns" BRAID_IB_HCA="${rdma_vm_hca[$ns]}" \
    BRAID_BIND_ADDR="${rdma_vm_addr[$ns]}" "$@"
}

rxe_pingpong() { # SNS CNS SDEV CDEV GID ADDR [ARG...]
  local sns=$1 cns=$2 sdev=$3 cdev=$4 gid=$5 addr=$6 spid src crc port=18515
  shift 6
  local log; log=$(mktemp -d)
  ns_exec "$sns" timeout -k 2 20 ibv_rc_pingpong -d "$sdev" -g "$gid" -p "$port" "$@" >"$log/server" 2>&1 &
  spid=$!
  if ! wait_tcp_port "$sns" "$port" 10; then kill "$spid" 2>/dev/null; wait "$spid"; cat "$log/server"; rm -rf "$log"; return 1; fi
  ns_exec "$cns" timeout -k 2 20 ibv_rc_pingpong -d "$cdev" -g "$gid" -p "$port" "$@" "$addr" >"$log/client" 2>&1
  crc=$?
  # a client that failed before connecting leaves the server waiting
  [ "$crc" -eq 0 ] || { sleep 0.5; kill "$spid" 2>/dev/null; }
  wait "$spid"; src=$?
  sed 's/^/  server: /' "$log/server"; sed 's/^/  client: /' "$log/client"
  echo "  pingpong: server status $src, client status $crc"
  rm -rf "$log"
  [ "$src" -eq 0 ] && [ "$crc" -eq 0 ] && return 0
  [ "$crc" -ne 0 ] && return "$crc"
  return "$src"
}

launch_two_hosts() { # LAUNCH NS1 NS2 NPROC [SECONDS] -- PROGRAM ARG...
  local launch=$1 ns1=$2 ns2=$3 nproc=$4 s=60 log pid st0 st1 port=29517
  shift 4
  [ "${1:-}" != -- ] && { s=$1; shift; }
  [ "${1:-}" = -- ] || { echo "usage: launch_two_hosts LAUNCH NS1 NS2 NPROC [SECONDS] -- PROGRAM ARG..." >&2; return 2; }
  shift
  log=$(mktemp -d)
  local common=(--nproc-per-node "$nproc" --nnodes 2 --master-addr "$(rxe_addr "$ns1")" --master-port "$port")
  BRAID_JOB_TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n') && export BRAID_JOB_TOKEN
  on_host "$ns2" timeout -k 2 "$s" "$launch" "${common[@]}" --node-rank 1 -- "$@" >"$log/node1" 2>&1 &
  pid=$!
  on_host "$ns1" timeout -k 2 "$s" "$launch" "${common[@]}" --node-rank 0 -- "$@" >"$log/node0" 2>&1
  st0=$?
  wait "$pid"; st1=$?
  unset BRAID_JOB_TOKEN
  sed "s/^/[$ns1] /" "$log/node0"; sed "s/^/[$ns2] /" "$log/node1"
  echo "# launch_two_hosts: node 0 ($ns1) status $st0, node 1 ($ns2) status $st1"
  rm -rf "$log"
  [ "$st0" -eq 0 ] && [ "$st1" -eq 0 ]
}

launch_ranks() { # "NS:N NS:N ..." SECONDS -- PROGRAM ARG...
  local layout=$1 s=$2 log spec ns n i rank=0 node=0 world=0 port=29541 token failed=0 st
  local -a pids hosts
  shift 2
  [ "${1:-}" = -- ] || { echo "usage: launch_ranks \"NS:N ...\" SECONDS -- PROGRAM ARG..." >&2; return 2; }
  shift
  for spec in $layout; do world=$((world + ${spec#*:})); done
  token=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
  log=${RDMA_VM_LAUNCH_LOGS:-$(mktemp -d)}
  for spec in $layout; do
    ns=${spec%%:*} n=${spec#*:}
    for ((i = 0; i < n; i++, rank++)); do
      on_host "$ns" env RANK="$rank" WORLD_SIZE="$world" LOCAL_RANK="$i" LOCAL_WORLD_SIZE="$n" GROUP_RANK="$node" \
        MASTER_ADDR="$(rxe_addr "${layout%%:*}")" MASTER_PORT="$port" BRAID_JOB_TOKEN="$token" \
        timeout -k 2 "$s" "$@" >"$log/$rank" 2>&1 &
      pids+=("$!") hosts+=("$ns")
    done
    node=$((node + 1))
  done
  local statuses=""
  for i in "${!pids[@]}"; do
    wait "${pids[i]}"; st=$?
    statuses+=" $st"
    [ "$st" -eq 0 ] || failed=1
  done
  for i in "${!pids[@]}"; do sed "s/^/[${hosts[i]}] [rank $i] /" "$log/$i"; done
  echo "# launch_ranks $layout: rank statuses$statuses"
  [ -n "${RDMA_VM_LAUNCH_LOGS:-}" ] || rm -rf "$log"
  [ "$failed" -eq 0 ]
}

no_leftovers() {
  local i left
  for ((i = 0; i < 30; i++)); do
    left=$(pgrep -l '^braid-' ; compgen -G '/dev/shm/braid*')
    [ -z "$left" ] && return 0
    sleep 0.1
  done
  echo "# left behind: ${left//$'\n'/, }"
  return 1
}
