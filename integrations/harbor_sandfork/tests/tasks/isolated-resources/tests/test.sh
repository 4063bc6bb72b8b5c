#!/bin/bash
# The task's limits hold in the sandbox: no network device but loopback, 768 MiB of
# memory, one CPU, a 2 GiB disk.
fail() { echo "$1"; echo 0 > /logs/verifier/reward.txt; exit 0; }
[ "$(ls /sys/class/net)" = "lo" ] || fail "network devices: $(ls /sys/class/net)"
[ "$(cat /root/interfaces.txt)" = "lo" ] || fail "the solution saw: $(cat /root/interfaces.txt)"
memory=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max)
[ "$memory" = "$((768 * 1024 * 1024))" ] || fail "memory limit $memory"
quota=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cut -d' ' -f1 /sys/fs/cgroup/cpu.max)
period=$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us 2>/dev/null || cut -d' ' -f2 /sys/fs/cgroup/cpu.max)
[ "$quota" = "$period" ] || fail "cpu quota $quota per $period"
disk_mb=$(df -m / | awk 'NR == 2 { print $2 }')
[ "$disk_mb" -gt 1536 ] && [ "$disk_mb" -le 2048 ] || fail "disk of $disk_mb MB"
echo 1 > /logs/verifier/reward.txt
