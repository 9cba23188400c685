apt_venv() {
    command -v apt-get >/dev/null 2>&1 || return 0
    if [ "$(id -u)" = 0 ]; then as_root=""
    elif sudo -n true >/dev/null 2>&1; then as_root="sudo -n"
    else return 0
    fi
    # python3-venv brings ensurepip's pip; the interpreter's own pythonX.Y-venv when
    # that is not Debian's default python3.
    pkgs=python3-venv
    v=$("$2" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) &&
        [ -n "$(apt-cache show "python$v-venv" 2>/dev/null)" ] && pkgs="$pkgs python$v-venv"
    for wait in 10 20 0; do  # apt may be locked by the image's first-boot upgrades
        # shellcheck disable=SC2086
        if $as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 &&
            $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                --no-install-recommends $pkgs >&2; then
            echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) apt $pkgs" >> "$1/bootstrap.log"
            return 0
        fi
        sleep "$wait"
    done
    return 0
}
