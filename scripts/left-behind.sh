#!/usr/bin/env bash
# scripts/left-behind.sh NAME=VALUE [PID...]: the live processes whose environment holds
# NAME=VALUE (the mark scripts/test.sh gives everything the tests start), but for the PIDs
# given and this script's own. Each is printed and killed; the status is 1 when there were any.
set -uo pipefail
mark="$1"
shift
spared=" $* $$ "
left=()
for environ in /proc/[0-9]*/environ; do
    pid="${environ#/proc/}"
    pid="${pid%/environ}"
    case "$spared" in *" $pid "*) continue ;; esac
    state=$(awk '{ sub(/.*\) /, ""); print $1 }' "/proc/$pid/stat" 2>/dev/null) || continue
    case "$state" in Z | X | "") continue ;; esac
    if { tr '\0' '\n' <"$environ"; } 2>/dev/null | grep -qxF "$mark"; then
        left+=("$pid")
    fi
done
# The awk, tr and grep above carry the mark too, but are gone by now.
alive=()
for pid in "${left[@]}"; do
    [ -e "/proc/$pid" ] && alive+=("$pid")
done
if [ "${#alive[@]}" -eq 0 ]; then
    echo "none"
    exit 0
fi
echo "left behind by the tests (killed now):"
ps -o pid,ppid,stat,etime,args -p "$(IFS=,; echo "${alive[*]}")" | cut -c1-200
kill -KILL "${alive[@]}" 2>/dev/null
exit 1
