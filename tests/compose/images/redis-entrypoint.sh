#!/bin/sh
# `redis-server ARGS` runs with protected mode off, as in the official image (whose build turns
# it off); any other command runs as given (redis-cli for the healthcheck).
if [ "$1" = redis-server ]; then
    shift
    exec redis-server "$@" --protected-mode no
fi
exec "$@"
