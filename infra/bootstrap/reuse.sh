i=0
while [ -e "$4/startup.started" ] && [ ! -e "$4/startup.done" ] && [ "$i" -lt 600 ]; do
    sleep 1; i=$((i + 1))
done
mkdir -p "$1" || exit 2
if [ -x "$2/bin/python" ] && "$2/bin/python" -c 'import workloads, numpy, pyarrow, psutil' \
        >/dev/null 2>&1; then
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) reuse $3" >> "$1/bootstrap.log"
    prune "$1" "$2"
    exit 0
fi
exit 1
