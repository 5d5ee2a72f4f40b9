#!/usr/bin/env bash
# Two "hosts" on this machine for the multi-host test (tests/test_multihost.py), made of Linux
# network namespaces joined by a veth pair. Each has its own address (10.231.0.1 = hostA,
# 10.231.0.2 = hostB) that exists only inside these namespaces, an interface named tk0, its own
# hostname (a UTS namespace) and an sshd on its address with key-only login. Needs root.
#
#   tests/netns_hosts.sh up DIR      create them; DIR gets the keys, ssh config and an `ssh` wrapper
#   tests/netns_hosts.sh exec DIR HOST COMMAND...   run COMMAND on HOST (hostA or hostB)
#   tests/netns_hosts.sh shape DIR RATE   limit the link to RATE each way (tc tbf, e.g. 1gbit, 100mbit;
#                                         "none" removes the limit): benchmarks/compression_bench.py --netns
#   tests/netns_hosts.sh fault DIR HOST refuse|drop|none   HOST's sshd stopped (connections refused) /
#                                         HOST answers nothing (its replies blackholed) / back to normal
#   tests/netns_hosts.sh down DIR    stop the sshds, delete the namespaces (safe to repeat)
#
# `up` installs iproute2 and openssh-server with apt-get when they are missing.
set -euo pipefail

cmd=${1:?usage: netns_hosts.sh up|exec|shape|down DIR ...}
dir=${2:?usage: netns_hosts.sh up|exec|shape|down DIR ...}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# Namespace names are unique per DIR, so two runs never share them.
id=$(printf '%s' "$dir" | sha256sum | cut -c1-6)
hosts=(hostA hostB)
declare -A ns=([hostA]="tk${id}a" [hostB]="tk${id}b") addr=([hostA]=10.231.0.1 [hostB]=10.231.0.2)

on() {   # on HOST COMMAND...: in HOST's network namespace, with HOST's name and /etc/hosts
    local host=$1; shift
    # shellcheck disable=SC2016  # $0 and $@ are the inner shell's: single quotes on purpose
    ip netns exec "${ns[$host]}" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
}

start_sshd() {   # start_sshd HOST, unless it runs
    local host=$1
    if [[ -f "$dir/sshd-$host.pid" ]] && kill -0 "$(cat "$dir/sshd-$host.pid")" 2>/dev/null; then
        return 0
    fi
    on "$host" "$(command -v sshd || echo /usr/sbin/sshd)" -f "$dir/sshd_config-$host"
}

down() {
    for host in "${hosts[@]}"; do
        if [[ -f "$dir/sshd-$host.pid" ]]; then
            kill "$(cat "$dir/sshd-$host.pid")" 2>/dev/null || true
            rm -f "$dir/sshd-$host.pid"
        fi
        ip netns pids "${ns[$host]}" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "${ns[$host]}" 2>/dev/null || true
        rm -rf "/etc/netns/${ns[$host]}"
    done
    ip link del "tk${id}x" 2>/dev/null || true     # a pair left in this namespace by a failed `up`
}

up() {
    [[ $(id -u) == 0 ]] || { echo "netns_hosts.sh: needs root (ip netns, sshd)" >&2; exit 2; }
    if ! command -v sshd >/dev/null && [[ ! -x /usr/sbin/sshd ]] || ! command -v ip >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 openssh-server >/dev/null
    fi
    down
    mkdir -p /run/sshd
    [[ -f "$dir/id" ]] || ssh-keygen -q -t ed25519 -N '' -f "$dir/id"
    [[ -f "$dir/host_key" ]] || ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key"
    cp "$dir/id.pub" "$dir/authorized_keys"
    ip link add "tk${id}x" type veth peer name "tk${id}y"
    local -A end=([hostA]="tk${id}x" [hostB]="tk${id}y")
    for host in "${hosts[@]}"; do
        ip netns add "${ns[$host]}"
        mkdir -p "/etc/netns/${ns[$host]}"     # `ip netns exec` mounts these over /etc
        printf '127.0.0.1 localhost\n10.231.0.1 hostA\n10.231.0.2 hostB\n' > "/etc/netns/${ns[$host]}/hosts"
        ip link set "${end[$host]}" netns "${ns[$host]}"
        ip -n "${ns[$host]}" link set "${end[$host]}" name tk0
        ip -n "${ns[$host]}" addr add "${addr[$host]}/24" dev tk0
        ip -n "${ns[$host]}" link set tk0 up
        ip -n "${ns[$host]}" link set lo up
        cat > "$dir/sshd_config-$host" <<EOF
ListenAddress ${addr[$host]}
Port 22
HostKey $dir/host_key
AuthorizedKeysFile $dir/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $dir/sshd-$host.pid
LogLevel ERROR
EOF
        start_sshd "$host"
    done
    # The ssh every launcher runs (horovodrun, mpirun, the TF workers' launcher) finds this one first
    # on PATH: this run's key and known_hosts, nothing written to ~/.ssh.
    cat > "$dir/ssh_config" <<EOF
Host hostA hostB
    IdentityFile $dir/id
    UserKnownHostsFile $dir/known_hosts
    StrictHostKeyChecking no
    BatchMode yes
    LogLevel ERROR
EOF
    mkdir -p "$dir/bin"
    printf '#!/bin/sh\nexec %s -F %s "$@"\n' "$(command -v ssh)" "$dir/ssh_config" > "$dir/bin/ssh"
    chmod +x "$dir/bin/ssh"
    for _ in $(seq 50); do   # both sshds answer
        if on hostA "$dir/bin/ssh" hostB true 2>/dev/null && on hostB "$dir/bin/ssh" hostA true 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "netns_hosts.sh: sshd in the namespaces does not answer" >&2
    exit 1
}

case $cmd in
    up) up ;;
    down) down ;;
    exec) host=${3:?HOST}; shift 3; on "$host" "$@" ;;
    shape)
        rate=${3:?usage: netns_hosts.sh shape DIR RATE|none}
        for host in "${hosts[@]}"; do
            ip -n "${ns[$host]}" link show tk0 >/dev/null   # the hosts are up
            if [[ $rate == none ]]; then
                ip netns exec "${ns[$host]}" tc qdisc del dev tk0 root 2>/dev/null || true
            else
                # a token bucket: this kernel has no netem (sch_netem: "Specified qdisc kind is unknown")
                ip netns exec "${ns[$host]}" tc qdisc replace dev tk0 root tbf rate "$rate" burst 512kb latency 200ms
            fi
        done ;;
    fault)
        host=${3:?usage: netns_hosts.sh fault DIR HOST refuse|drop|none}
        [[ -n ${ns[$host]:-} ]] || { echo "netns_hosts.sh: no host $host (hostA, hostB)" >&2; exit 2; }
        for other in "${hosts[@]}"; do [[ $other == "$host" ]] || peer=${addr[$other]}; done
        case ${4:?usage: netns_hosts.sh fault DIR HOST refuse|drop|none} in
            refuse)
                if [[ -f "$dir/sshd-$host.pid" ]]; then
                    pid=$(cat "$dir/sshd-$host.pid")
                    kill "$pid" 2>/dev/null || true
                    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
                fi ;;
            drop) ip -n "${ns[$host]}" route replace blackhole "$peer/32" ;;
            none)
                ip -n "${ns[$host]}" route del blackhole "$peer/32" 2>/dev/null || true
                start_sshd "$host" ;;
            *) echo "netns_hosts.sh: fault is refuse, drop or none" >&2; exit 2 ;;
        esac ;;
    *) echo "netns_hosts.sh: unknown command $cmd (up, exec, shape, fault, down)" >&2; exit 2 ;;
esac
