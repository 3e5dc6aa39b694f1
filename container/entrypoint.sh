#!/bin/sh
# The container's entrypoint (tini runs it as PID 1's child): first-start set-up, then
# `docinbox "$@"` as the user PUID:PGID, replacing this shell so that tini's SIGTERM
# reaches the daemon itself.
set -eu

conf=${DOCINBOX_CONFIG:-/config/config.yaml}
token=/config/http-token

say() { echo "docinbox-entrypoint: $*" >&2; }

# The uid/gid the daemon runs as (linuxserver.io's PUID/PGID): files it writes into the
# outbox, archive and failed folders then belong to the share's owner.
case "${PUID:-}" in ''|*[!0-9]*) say "PUID must be a number (a user id), not '${PUID:-}'"; exit 2 ;; esac
case "${PGID:-}" in ''|*[!0-9]*) say "PGID must be a number (a group id), not '${PGID:-}'"; exit 2 ;; esac

# First start: the shipped default configuration, and the status page's token. An existing
# file is never touched.
if [ ! -e "$conf" ]; then
    if [ -w "$(dirname "$conf")" ]; then
        cp /usr/local/share/docinbox/config.yaml "$conf"
        say "wrote the default configuration to $conf (edit it, then restart)"
    else
        say "$conf does not exist and $(dirname "$conf") is not writable: mount a writable /config"
        exit 78
    fi
fi
if [ ! -e "$token" ] && [ -w /config ] && grep -q "^ *token_file: $token" "$conf"; then
    (umask 077 && python3 -c "import secrets; print(secrets.token_urlsafe(32))" > "$token")
    say "wrote a status page token to $token"
fi

if [ "$(id -u)" != 0 ]; then
    # Started as a user already (docker run --user): nothing to hand over.
    exec docinbox "$@"
fi

# The volumes the daemon writes into belong to PUID:PGID. Only what someone else owns is
# changed: on a restart with the same PUID/PGID nothing is written.
for dir in /config /models; do
    [ -d "$dir" ] && [ -w "$dir" ] || continue
    find "$dir" -xdev \( ! -user "$PUID" -o ! -group "$PGID" \) \
        -exec chown -h "$PUID:$PGID" {} + 2>/dev/null \
        || say "could not give every file in $dir to $PUID:$PGID"
done
if [ "$PUID" = 0 ]; then
    say "PUID=0: running as root; set PUID/PGID to the owner of your shares"
    exec docinbox "$@"
fi

# setpriv (util-linux) rather than su/gosu: no login session, no user database needed, so
# any PUID works on a read-only root filesystem; the bounding set is dropped too.
exec setpriv --reuid="$PUID" --regid="$PGID" --clear-groups \
    --inh-caps=-all --bounding-set=-all docinbox "$@"
