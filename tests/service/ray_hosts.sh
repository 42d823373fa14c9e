#!/usr/bin/env bash
# Two "hosts" on this machine for the multi-host tests (tests/service/ray_cluster_test.cc): network
# namespaces q<N>a (10.77.N.1) and q<N>b (10.77.N.2), joined to the root namespace (10.77.N.254) by
# a bridge, with a Ray head in a and a Ray node in b (Ray from $RAYENV, scripts/requirements-ray.txt).
# The file system is shared, as a shared volume would be between real hosts, except DIR/hidden-on-b,
# which host b's processes see empty (a tmpfs over it in their own mount namespace): a path that
# one host lacks. Needs root.
#   ray_hosts.sh up N DIR RAYENV      prints the dashboard address, http://10.77.N.1:8265
#   ray_hosts.sh pids N a|b           the processes running in that host's namespace
#   ray_hosts.sh kill-host N b        SIGKILL to everything in host b (its Ray node and workers)
#   ray_hosts.sh add-node N DIR RAYENV   starts host b's Ray node again
#   ray_hosts.sh down N DIR           stops both hosts and removes the namespaces
set -uo pipefail
cmd=$1 n=$2
ns() { echo "q${n}$1"; }
net=10.77.$n

start_node() {  # host, dir, rayenv, ray start args...
  local host=$1 dir=$2 rayenv=$3; shift 3
  mkdir -p "$dir/ray-$host" "$dir/hidden-on-b"
  local hide=""
  [ "$host" = b ] && hide="mount -t tmpfs qlora-hidden $dir/hidden-on-b && "
  # `ray start` leaves its daemons running in this mount namespace.
  ip netns exec "$(ns "$host")" unshare --mount --propagation private sh -c "$hide exec env \
    PATH=$rayenv/bin:\$PATH RAY_USAGE_STATS_ENABLED=0 $rayenv/bin/ray start --temp-dir=$dir/ray-$host \
    --num-cpus=2 --num-gpus=0 --disable-usage-stats $*" > "$dir/ray-start-$host.log" 2>&1
}

wait_for_cpus() {  # the cluster has $1 CPUs
  for _ in $(seq 1 120); do
    if curl -s -m 2 "http://$net.1:8265/api/cluster_status" |
        grep -Eq "\"CPU\": \[[0-9.]+, $1\.0\]"; then
      return 0
    fi
    sleep 0.5
  done
  echo "the Ray cluster did not reach $1 CPUs" >&2
  return 1
}

case "$cmd" in
  up)
    dir=$3 rayenv=$4
    ip link add "qb$n" type bridge && ip addr add "$net.254/24" dev "qb$n" && ip link set "qb$n" up || exit 1
    for host in a b; do
      index=$([ "$host" = a ] && echo 1 || echo 2)
      ip netns add "$(ns $host)" || exit 1
      ip link add "qv$n$host" type veth peer name eth0 netns "$(ns $host)" || exit 1
      ip link set "qv$n$host" master "qb$n" up
      ip -n "$(ns $host)" addr add "$net.$index/24" dev eth0
      ip -n "$(ns $host)" link set eth0 up
      ip -n "$(ns $host)" link set lo up
    done
    start_node a "$dir" "$rayenv" --head --node-ip-address="$net.1" --port=6379 \
      --dashboard-host=0.0.0.0 --dashboard-port=8265 --include-dashboard=true || { cat "$dir/ray-start-a.log" >&2; exit 1; }
    start_node b "$dir" "$rayenv" --address="$net.1:6379" --node-ip-address="$net.2" ||
      { cat "$dir/ray-start-b.log" >&2; exit 1; }
    wait_for_cpus 4 || exit 1
    echo "http://$net.1:8265" ;;
  pids)
    ip netns pids "$(ns "$3")" 2>/dev/null ;;
  kill-host)
    for _ in 1 2 3; do
      pids=$(ip netns pids "$(ns "$3")" 2>/dev/null)
      [ -z "$pids" ] && break
      kill -9 $pids 2>/dev/null
      sleep 0.3
    done ;;
  add-node)
    dir=$3 rayenv=$4
    start_node b "$dir" "$rayenv" --address="$net.1:6379" --node-ip-address="$net.2" || exit 1
    wait_for_cpus 4 ;;
  down)
    for host in b a; do
      for _ in 1 2 3 4 5; do
        pids=$(ip netns pids "$(ns $host)" 2>/dev/null)
        [ -z "$pids" ] && break
        kill -9 $pids 2>/dev/null
        sleep 0.3
      done
      ip netns del "$(ns $host)" 2>/dev/null
    done
    ip link del "qb$n" 2>/dev/null
    true ;;
esac
