install() {
    "$1" -m pip install --quiet --disable-pip-version-check --no-compile --no-input "$4" >&2 || return 1
    sh -c "$3" sh "$1" "$2" || { echo "$4 installed but not usable" >&2; return 1; }
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) $5 $4" >> "$(dirname "$2")/../bootstrap.log"
}
if sh -c "$3" sh "$1" "$2" >/dev/null 2>&1; then
    exit 0
fi
lock="$(dirname "$2")/../.cloudprof-install.lock"
if command -v flock >/dev/null 2>&1 && touch "$lock" 2>/dev/null; then
    (
        flock 9
        sh -c "$3" sh "$1" "$2" >/dev/null 2>&1 || install "$@"
    ) 9>"$lock"
    exit $?
fi
install "$@"
