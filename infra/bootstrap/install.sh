set -e
tmp="$2.tmp-$$"
src=
# $6: the sweep's staged wheels on this host (empty: none), pip's own wheel among them.
# pip runs from that wheel, as ensurepip does, and installs the set and itself into an
# env made without pip: no ensurepip run and no python3-venv from apt (a bare Debian
# host's bootstrap in under half the time). A failure falls to the steps below.
pip_wheel=
[ -z "${6:-}" ] || pip_wheel=$(ls "$6"/pip-*.whl 2>/dev/null | head -n 1)
if [ -n "$pip_wheel" ]; then
    if "$5" -m venv --system-site-packages --without-pip "$tmp" >&2 &&
            PYTHONPATH="$pip_wheel" "$tmp/bin/python" -m pip install --quiet \
                --disable-pip-version-check --no-compile --no-input --no-index \
                --find-links "$6" "$4" pip >&2; then
        src=staged
    else
        rm -rf "$tmp"
    fi
fi
[ -n "$src" ] || "$5" -m venv --system-site-packages --without-pip "$tmp" 2>/dev/null || true
if [ -z "$src" ] && ! "$tmp/bin/python" -m pip --version >/dev/null 2>&1; then
    rm -rf "$tmp"
    if ! "$5" -m venv --system-site-packages "$tmp" >/dev/null 2>&1; then
        rm -rf "$tmp"
        apt_venv "$1" "$5"
        "$5" -m venv --system-site-packages "$tmp" || {
            echo "$5 cannot create a venv with pip here: install python3-venv python3-pip" >&2
            exit 1
        }
    fi
fi
# Without pip's wheel: the env's pip installs the staged set, else from the index.
if [ -n "$src" ]; then
    :
elif [ -n "${6:-}" ] && "$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
        --no-input --no-index --find-links "$6" "$4" >&2; then
    src=staged
else
    src=index
    [ -z "${6:-}" ] || echo "cloudprof: the staged wheels did not install; using the index" >&2
    "$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
        --no-input "$4" >&2
fi
"$tmp/bin/python" -c 'import workloads, numpy, pyarrow, psutil'
# The scripts pip wrote (pip, f2py, activate...) name the env by its path: make it the
# final one, or `pip` in a job's --setup finds no interpreter once the env is renamed.
for f in "$tmp"/bin/*; do
    if [ -f "$f" ] && [ ! -L "$f" ] && grep -qF "$tmp" "$f" 2>/dev/null; then
        sed -i "s|$tmp|$2|g" "$f"
    fi
done
if ! mv -T "$tmp" "$2" 2>/dev/null; then
    if "$2/bin/python" -c 'import workloads, numpy, pyarrow, psutil' >/dev/null 2>&1; then
        rm -rf "$tmp"  # another sweep installed the same wheel meanwhile
    else
        rm -rf "$2" && mv -T "$tmp" "$2"  # a broken env (its base python changed?)
    fi
fi
echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) install $3 $src" >> "$1/bootstrap.log"
echo "cloudprof-bootstrap $src"
prune "$1" "$2"
