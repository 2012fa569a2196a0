# CI's stand-in for the compose file's `redis:7.4-alpine` (CI reaches no image registry): Debian's
# own redis-server package, run like the official image (unprivileged `redis` user, data in
# /data, protected mode off as the official image builds it, since the compose network is the
# only way in), so the compose file's redis command, volume and healthcheck work on it unchanged.
ARG BASE_IMAGE=pdppo-ci-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data && chown redis:redis /data
COPY redis-entrypoint.sh /usr/local/bin/redis-entrypoint
WORKDIR /data
USER redis
EXPOSE 6379
ENTRYPOINT ["/usr/local/bin/redis-entrypoint"]
CMD ["redis-server"]
