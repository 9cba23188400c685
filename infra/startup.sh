#!/bin/sh
# cloudprof first-boot script, rendered by orchestrator.providers.remote.startup_script().
#
# Run once as root at first boot: by cloud-init on AWS (user data) and by the
# guest agent on Google Cloud (startup-script metadata). It makes the VM safe to
# leave alone and safe to talk to:
#   1. schedules the VM's own power-off at the sweep's expiry; the provider is
#      told to delete/terminate on shutdown, so the VM dies even if the laptop
#      that started the sweep died first;
#   2. installs the sweep's host key, so cloudprof can verify it is talking to
#      this VM (a key it generated and knows, never trust-on-first-use);
#   3. authorises the sweep's client key for the login user;
#   4. makes sure python3 can create a venv with pip (for the bootstrap).
#
# Every value below is substituted by cloudprof already shell-quoted; the rest
# of the script only ever uses them inside double quotes.
# No `set -e`: a failing step must not skip the ones after it (step 1 above all).
set -u

SSH_USER=@SSH_USER@
CLIENT_PUBLIC_KEY=@CLIENT_PUBLIC_KEY@
HOST_PRIVATE_KEY=@HOST_PRIVATE_KEY@
HOST_PUBLIC_KEY=@HOST_PUBLIC_KEY@
EXPIRES_AT=@EXPIRES_AT@
STATE_DIR=@STATE_DIR@
# --- end of substituted values ---

PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

log() {
    echo "cloudprof-startup: $*"
    if command -v logger >/dev/null 2>&1; then logger -t cloudprof-startup -- "$*"; fi
    return 0
}

mkdir -p "$STATE_DIR"
: >"$STATE_DIR/startup.started" # the bootstrap waits for startup.done when this exists

# 1. Self-destruct at the sweep's expiry (first, before anything that can fail).
schedule_poweroff() {
    now=$(date +%s)
    secs=$((EXPIRES_AT - now))
    if [ "$secs" -lt 60 ]; then secs=60; fi
    minutes=$(((secs + 59) / 60))
    if command -v systemd-run >/dev/null 2>&1 &&
        systemd-run --unit=cloudprof-expire --on-active="${secs}s" \
            --timer-property=AccuracySec=1s poweroff >/dev/null 2>&1; then
        log "power-off scheduled in ${secs}s (systemd timer cloudprof-expire)"
    elif shutdown -h "+$minutes" "cloudprof: sweep expired" >/dev/null 2>&1; then
        log "power-off scheduled in ${minutes} min (shutdown -h)"
    else
        # Detached from this script's session so it survives the script's end.
        nohup setsid sh -c 'sleep "$1"; poweroff || halt -p' sh "$secs" >/dev/null 2>&1 &
        log "power-off scheduled in ${secs}s (sleep fallback)"
    fi
    echo "$EXPIRES_AT" >"$STATE_DIR/expires_at"
}

# 2. The sweep's host key, as a separate file listed first so sshd presents it
#    (cloud-init / the guest agent may regenerate the stock keys; ours stays).
install_host_key() {
    key=/etc/ssh/cloudprof_host_ed25519_key
    old_umask=$(umask)
    umask 077
    printf '%s\n' "$HOST_PRIVATE_KEY" >"$key"
    umask "$old_umask"
    printf '%s\n' "$HOST_PUBLIC_KEY" >"$key.pub"
    chmod 600 "$key"
    chmod 644 "$key.pub"
    if command -v restorecon >/dev/null 2>&1; then restorecon "$key" "$key.pub"; fi
    line="HostKey $key"
    dropin=/etc/ssh/sshd_config.d/00-cloudprof.conf
    if [ -d /etc/ssh/sshd_config.d ] &&
        grep -Eiq '^[[:space:]]*Include[[:space:]]+/etc/ssh/sshd_config\.d' /etc/ssh/sshd_config; then
        printf '%s\n' "$line" >"$dropin"
    elif ! grep -qxF -e "$line" /etc/ssh/sshd_config; then
        cp -p /etc/ssh/sshd_config /etc/ssh/sshd_config.cloudprof-orig
        { printf '%s\n' "$line"; cat /etc/ssh/sshd_config.cloudprof-orig; } >/etc/ssh/sshd_config
    fi
    if ! sshd_bin=$(command -v sshd) || ! "$sshd_bin" -t; then
        log "sshd rejects the new configuration; reverting it"
        rm -f "$dropin"
        if [ -e /etc/ssh/sshd_config.cloudprof-orig ]; then
            mv /etc/ssh/sshd_config.cloudprof-orig /etc/ssh/sshd_config
        fi
        return 1
    fi
    return 0
}

# 3. The sweep's client key for the login user (created when the image lacks it).
authorise_client_key() {
    if ! id "$SSH_USER" >/dev/null 2>&1; then
        useradd -m -s /bin/sh "$SSH_USER" || adduser -D -s /bin/sh "$SSH_USER" || return 1
    fi
    home=$(getent passwd "$SSH_USER" | cut -d: -f6)
    group=$(id -gn "$SSH_USER")
    [ -n "$home" ] || return 1
    mkdir -p "$home/.ssh"
    touch "$home/.ssh/authorized_keys"
    if ! grep -qxF -e "$CLIENT_PUBLIC_KEY" "$home/.ssh/authorized_keys"; then
        printf '%s\n' "$CLIENT_PUBLIC_KEY" >>"$home/.ssh/authorized_keys"
    fi
    chown "$SSH_USER:$group" "$home/.ssh" "$home/.ssh/authorized_keys"
    chmod 700 "$home/.ssh"
    chmod 600 "$home/.ssh/authorized_keys"
}

restart_sshd() {
    for unit in ssh sshd; do
        if systemctl restart "$unit" >/dev/null 2>&1; then return 0; fi
    done
    service ssh restart >/dev/null 2>&1 || service sshd restart >/dev/null 2>&1
}

# 4. python3 with venv and pip (Debian/Ubuntu images ship them as separate packages).
#    Without their recommends: python3-pip's (a compiler, python3-dev) are 119 more
#    packages, 113 MB, on a bare Debian 12 image that every VM's first boot waited for.
ensure_python_tools() {
    if command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
        return 0
    fi
    if command -v apt-get >/dev/null 2>&1; then
        i=0
        while [ "$i" -lt 10 ]; do # apt may be locked by first-boot upgrades for a while
            if DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                    python3 python3-venv python3-pip; then
                return 0
            fi
            i=$((i + 1))
            sleep 15
        done
        return 1
    elif command -v dnf >/dev/null 2>&1; then
        dnf install -y -q python3 python3-pip
    elif command -v yum >/dev/null 2>&1; then
        yum install -y -q python3 python3-pip
    fi
}

schedule_poweroff || log "could not schedule the power-off"
install_host_key || log "could not install the sweep's host key"
authorise_client_key || log "could not authorise the sweep's client key for $SSH_USER"
restart_sshd || log "could not restart sshd"
ensure_python_tools || log "could not install python3 venv/pip; the bootstrap will say so"
: >"$STATE_DIR/startup.done"
log "done"
