#!/bin/bash
# Guest script (runs inside the VM, see scripts/rdma_vm/guest_lib.sh):
# soft-RoCE really works here, and fails the way real RoCE fails.
# One host: ibv_devices lists rxe0; ibv_rc_pingpong over GID index 0
# (link-local, RoCE v2) succeeds; over GID index 1, which does not exist,
# it fails with "Failed to modify QP to RTR" (the wrong-GID failure braid's
# ibverbs transport must diagnose). Two hosts: ibv_rc_pingpong from host h2
# (rxe1) to host h1 (rxe0) succeeds, and its packets crossed the veth wire
# between the two rxe devices.
iters=100

check "one host: rxe0 set up" rxe_one_host
check "ibv_devices lists rxe0" eval 'ibv_devices | grep -qw rxe0'
check "ibv_devinfo: rxe0 port 1 is PORT_ACTIVE" eval 'ibv_devinfo -d rxe0 | grep -q PORT_ACTIVE'

check "rc_pingpong on rxe0, GID index 0, $iters round trips" \
  rxe_pingpong "" "" rxe0 rxe0 0 localhost -n "$iters"

wrong=$(rxe_pingpong "" "" rxe0 rxe0 1 localhost -n "$iters" 2>&1)
wrong_status=$?
echo "$wrong"
check_fails "rc_pingpong with GID index 1 (absent) fails" eval "(exit $wrong_status)"
check "... with 'Failed to modify QP to RTR'" eval 'grep -q "Failed to modify QP to RTR" <<<"$wrong"'

check "one host torn down" rxe_reset
check "two hosts h1 (rxe0) and h2 (rxe1) set up" rxe_two_hosts h1 h2
check "h1 sees its GID 0 as RoCE v2" \
  eval 'on_host h1 grep -q "RoCE v2" /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/0'
tx_before=$(cat /sys/class/net/rxe-h2/statistics/tx_packets)
rx_before=$(cat /sys/class/net/rxe-h1/statistics/rx_packets)
check "rc_pingpong from h2 (rxe1) to h1 (rxe0) over the control network, $iters round trips" \
  rxe_pingpong h1 h2 rxe0 rxe1 0 "$(rxe_addr h1)" -n "$iters"
tx=$(( $(cat /sys/class/net/rxe-h2/statistics/tx_packets) - tx_before ))
rx=$(( $(cat /sys/class/net/rxe-h1/statistics/rx_packets) - rx_before ))
echo "# veth wire: rxe-h2 sent $tx packets, rxe-h1 received $rx"
check "the RDMA traffic crossed the veth wire (>= $iters packets each way)" \
  eval "[ $tx -ge $iters ] && [ $rx -ge $iters ]"
finish
