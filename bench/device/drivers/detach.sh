#!/usr/bin/env bash
# One job longer than a device call (600 s) in one lease: `start` runs a command detached from the call (setsid, so
# the call's end does not kill it; it runs on until the machine goes back), each later call `wait`s on it and brings
# its files back. The machine stays held only while calls follow each other (it goes back 30 s after a call), so
# call `wait` again at once until it prints "rc".
# Usage (repo root, device machine):
#   bash bench/device/drivers/detach.sh start 'bash bench/device/drivers/h200.sh tests; ...'   (the job's $OUT is
#        /tmp/ferry-detached/out)
#   bash bench/device/drivers/detach.sh wait 570    (up to 570 s; then $OUT/results.tgz: out/ and the job's log)
set -uo pipefail
dir=/tmp/ferry-detached
case ${1:-} in
  start)
    rm -rf "$dir" && mkdir -p "$dir/out"
    printf '%s\n' "$2" > "$dir/command"
    OUT=$dir/out setsid bash -c "$2; echo \$? > $dir/rc" > "$dir/log" 2>&1 < /dev/null &
    echo "started: $2" ;;
  wait)
    end=$((SECONDS + ${2:-570}))
    while [[ ! -f $dir/rc ]] && ((SECONDS < end)); do sleep 5; done
    tail -n 40 "$dir/log"
    tar czf "${OUT:?}/results.tgz" -C "$dir" out log command
    if [[ -f $dir/rc ]]; then echo "job rc $(cat "$dir/rc")"; else echo "job still running"; fi ;;
  *) echo "usage: detach.sh start COMMAND | wait SECONDS" >&2; exit 2 ;;
esac
