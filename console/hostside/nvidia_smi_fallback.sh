# The monitor fallback's one round trip (console/monitor/nvidia_smi.py: script()), for a host
# that cannot run the engine's agent yet. A template, not run as is: script() drops these
# leading comment lines and fills @QUERY_GPU@, @QUERY_APPS@ (nvidia-smi's field lists) and
# @DISK_PATH@ (shell-quoted). Every section is printed even when a command fails, so the host
# part still arrives on a machine without a driver.
g=$(nvidia-smi --query-gpu=@QUERY_GPU@ --format=csv,noheader,nounits 2>&1); rc=$?
printf '@@gpu %s\n%s\n' "$rc" "$g"
a=$(nvidia-smi --query-compute-apps=@QUERY_APPS@ --format=csv,noheader,nounits 2>/dev/null)
printf '@@apps\n%s\n' "$a"
pids=$(printf '%s\n' "$a" | awk -F', ' 'NF>=2 && $2 ~ /^[0-9]+$/ {printf "%s%s", s, $2; s=","}')
echo @@ps
[ -n "$pids" ] && ps -o pid=,user=,args= -p "$pids" 2>/dev/null
echo @@stat; grep '^cpu' /proc/stat 2>/dev/null
echo @@load; cat /proc/loadavg 2>/dev/null
echo @@mem; cat /proc/meminfo 2>/dev/null
echo @@net; cat /proc/net/dev 2>/dev/null
echo @@df; df -Pk @DISK_PATH@ 2>/dev/null
exit 0
