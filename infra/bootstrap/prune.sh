prune() {
    touch "$2/.last-used"
    for d in "$1"/env-*; do
        [ -d "$d" ] && [ "$d" != "$2" ] || continue
        case "$d" in
            *.tmp-*) days=1 ;;
            *) days=__DAYS__ ;;
        esac
        stamp="$d/.last-used"
        [ -e "$stamp" ] || stamp="$d"
        if [ -n "$(find "$stamp" -maxdepth 0 -mmin +$((days * 1440)) 2>/dev/null)" ]; then
            rm -rf "$d"
        fi
    done
    return 0
}
